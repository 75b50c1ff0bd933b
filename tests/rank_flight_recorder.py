"""Rank bodies of test_flight_recorder.py: Fairring's ops in torch's flight
recorder, and desynchronised programs whose dumps torch's analyzer reads."""
from __future__ import annotations

import os
import pickle
import time

import torch
import torch.distributed as dist

KEYS = ("pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "input_sizes",
        "input_dtypes", "output_sizes", "output_dtypes", "state", "is_p2p", "retired", "timeout_ms")


def records(rank, world_size):
    """One op of each kind; then this rank's view of torch's recorder."""
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    gathered = torch.empty(5 * world_size)
    dist.all_gather_into_tensor(gathered, t)
    part = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(part, torch.ones(2 * world_size, dtype=torch.float64))
    dist.broadcast(t, 0)
    # Blocks of unequal sizes: one op, recorded with the one input it was passed.
    dist.all_gather([torch.empty(k + 1) for k in range(world_size)], torch.ones(rank + 1))
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
    # A group of global ranks 1 and 2: its entries are named by its own
    # name, its ranks in the dump by their global numbers.
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        dist.all_reduce(torch.ones(3, dtype=torch.int32), group=sub)
    # A split of the default group (a child Fairring builds itself): its
    # ranks in the dump are global too.
    split = dist.distributed_c10d._get_default_group().split_group([0, 2] if rank != 1 else [1],
                                                                   group_name=f"split-{rank == 1}")
    dist.all_reduce(torch.ones(2), group=split)
    # Delegated to gloo (a sparse bool sum, which gloo records, moves, and then
    # cannot add): its entry is filed under this group's name, not the
    # nameless gloo group's.
    refused = None
    try:
        dist.all_reduce(torch.sparse_coo_tensor([[0]], [True], (2,)))
    except Exception as e:  # noqa: BLE001
        refused = str(e)
    dist.barrier()
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    return {
        "entries": [{k: e.get(k) for k in KEYS} for e in dump["entries"]],
        "pg_config": dump["pg_config"],
        "sub_name": sub.group_name if rank in (1, 2) else None,
        "split_name": split.group_name,
        "recorder": __import__("fairring_py")._C._flight_recorder(),
        "refused": refused,
    }


def desync(rank, world_size, how, culprit, folder):
    """Two agreed all-reduces, then `culprit` differs from the others in the
    third op: `how` is size, dtype or skip (it goes on to a broadcast)."""
    t = torch.ones(10)
    error = None
    try:
        # A rank that is through these may still see them fail: the group
        # fails every op in flight when one rank finds the mismatch.
        dist.all_reduce(t)
        dist.all_reduce(t)
        # Every rank through both before the desync, so that every rank's
        # dump holds the third op (a rank a mismatch fails earlier dumps then).
        time.sleep(0.5)
        if rank != culprit:
            dist.all_reduce(torch.ones(10))
        elif how == "size":
            dist.all_reduce(torch.ones(7))
        elif how == "dtype":
            dist.all_reduce(torch.ones(10, dtype=torch.float64))
        else:
            dist.broadcast(torch.ones(10), 0)
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001  (the desync's failure is expected)
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "dumped": _dump_unless_dumped(folder, rank)}


def _dump_unless_dumped(folder, rank):
    """Whether this rank's dump came without asking (Fairring's, after a
    failure, from the thread that saw it: a moment, allowed for); if not,
    the program writes it (gloo dumps nothing on a failure), so that the
    analyzer reads the same set of dumps from either backend."""
    mine = os.path.join(folder, f"rank_{rank}")
    deadline = time.monotonic() + 5.0
    while dist.get_backend() != "gloo" and not os.path.exists(mine) and time.monotonic() < deadline:
        time.sleep(0.05)
    dumped = os.path.exists(mine)
    if not dumped:
        with open(mine, "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
    return dumped


def recent_view(rank, world_size):
    """dump_recent after ten all-reduces and a size mismatch (rank 1 passes
    3 elements where the others pass 4), with torch's entries of this
    process beside it."""
    import io

    import fairring_py

    for i in range(10):
        dist.all_reduce(torch.ones(1 + i))
    error = None
    try:
        dist.all_reduce(torch.ones(3 if rank == 1 else 4))
    except Exception as e:  # noqa: BLE001  (the mismatch is expected)
        error = f"{type(e).__name__}: {e}"
    buf = io.StringIO()
    recs = fairring_py.dump_recent(file=buf)
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    # Another group's ops push the failed one out of torch's ring (it holds
    # every group's): its failure is still known, from Fairring's side.
    other = dist.new_group(list(range(world_size)))
    for _ in range(int(os.environ.get("TORCH_FR_BUFFER_SIZE", "2000")) or 1):
        dist.all_reduce(torch.ones(2), group=other)
    return {"error": error, "recent": recs, "printed": buf.getvalue(),
            "torch": [(e["collective_seq_id"], e["state"], e["retired"]) for e in dump["entries"]
                      if e["profiling_name"] == "fairring:all_reduce"],
            "failed_later": fairring_py.dump_recent(file=io.StringIO())[-1]}


def broken(rank, world_size, how, culprit, folder, wait_s=30.0):
    """The same program on either backend: two all-reduces, then `culprit`
    stalls (`how` "stall": it waits, out of the library, past the group's
    timeout) or is killed ("kill": SIGKILL) while the others wait for it in
    a third.  Each rank's dump: _dump_unless_dumped (with
    TORCH_FR_DUMP_ON_TIMEOUT=1 Fairring's stalled rank dumps too, asked by
    the others)."""
    import signal

    t = torch.ones(10)
    dist.all_reduce(t)
    dist.all_reduce(t)
    mine = os.path.join(folder, f"rank_{rank}")
    others = [os.path.join(folder, f"rank_{r}") for r in range(world_size) if r != rank]
    error = None
    if rank == culprit:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        # Fairring's dump is asked for; gloo's stalled rank dumps once the others did.
        wanted = [mine] if dist.get_backend() != "gloo" else others
        deadline = time.monotonic() + wait_s
        while not all(os.path.exists(f) for f in wanted) and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        try:
            dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001  (the failure is expected)
            error = f"{type(e).__name__}: {e}"
    return {"error": error, "dumped": _dump_unless_dumped(folder, rank)}
