"""Code that runs inside the ranks of the reduction-server tests
(test_reduction_servers.py)."""
from __future__ import annotations

import os
import signal
import socket
import time

from datetime import timedelta

import torch
import torch.distributed as dist


def _root_store():
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def rogue_then_allreduce(rank, world):
    """Rank 0 connects to server 0 with a wrong greeting, which must be
    closed without an answer; then every rank all-reduces as usual.  And
    while a client that says nothing holds a connection to the server, a
    new group's ranks are admitted without waiting for it."""
    refused = None
    addr = _root_store().get("fairring/servers/0").decode()
    host, port = addr.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)), timeout=10) if rank == 0 else None
    dist.barrier()
    t0 = time.monotonic()
    g = dist.new_group(backend="fairring")
    y = torch.ones(70_001)
    dist.all_reduce(y, group=g)
    new_group_s = time.monotonic() - t0
    if silent is not None:
        silent.close()
    if rank == 0:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"FRSERV03" + b"\0" * 120)  # the right magic (csrc/transport/server_protocol.h), a wrong secret
            s.settimeout(10)
            try:
                refused = s.recv(64) == b""  # closed, no welcome
            except ConnectionResetError:
                refused = True  # closed with our extra bytes unread
    x = torch.full((100_003,), float(rank + 1))
    dist.all_reduce(x)
    want = world * (world + 1) / 2
    return {"refused": refused, "ok": bool((x == want).all()) and bool((y == world).all()),
            "new_group_s": new_group_s}


def killed_mid_op(rank, world, victim_pid, stop_instead, op_timeout_s=None):
    """All-reduces in a loop; rank 0 kills (or stops) a server after a few.
    Returns the error every rank ends with.  `op_timeout_s`: the group's
    timeout once a first all-reduce went through the servers (creation keeps
    the launch's, so that servers slow to join under load do not fail it)."""
    x = torch.ones(1 << 20)
    if op_timeout_s is not None:
        dist.all_reduce(x)
        dist.distributed_c10d._get_default_group().set_timeout(timedelta(seconds=op_timeout_s))
        x.fill_(1.0)
    for i in range(10_000):
        if rank == 0 and i == 5:
            os.kill(victim_pid, signal.SIGSTOP if stop_instead else signal.SIGKILL)
        try:
            dist.all_reduce(x)
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}", "after": i}
        x.fill_(1.0)
    return {"error": None, "after": None}


def mismatched_sizes(rank, world):
    x = torch.ones(1000 * (rank + 1))
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    return {"error": None, "seconds": time.monotonic() - t0}


def nothing(rank, world):
    return None


def create_once_one_server_joined(rank, world, port, pg_timeout_s):
    """Creates the group (FAIRRING_REDUCTION_SERVERS from the environment)
    only once one server has joined the job, so that its start-up, however
    slow on a busy machine, is not raced against the group's short timeout."""
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=60))
    # A joining server counts itself there (its add creates the key).
    store.wait(["fairring/servers/count"], timedelta(seconds=60))
    import fairring_py  # noqa: F401  registers the backend

    dist.init_process_group("fairring", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=pg_timeout_s))


def stalled_rank_once_the_server_joined(rank, world, port):
    """stalled_rank on a group of a 3 s timeout, created once the server has
    joined (create_once_one_server_joined)."""
    create_once_one_server_joined(rank, world, port, 3)
    return stalled_rank(rank, world)


def stalled_rank(rank, world):
    """Rank 0 stops rank 2 (SIGSTOP) while all-reduces go through the server
    and resumes it once the others have given up.  Returns each rank's error."""
    import threading

    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    if rank == 0:
        threading.Timer(0.3, os.kill, (pids[2], signal.SIGSTOP)).start()
        threading.Timer(6.5, os.kill, (pids[2], signal.SIGCONT)).start()
    x = torch.ones(1 << 16)
    for _ in range(1_000_000):
        try:
            dist.all_reduce(x)
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"}
        x.fill_(1.0)
    return {"error": None}
