"""The rank's side of the live status view (fairring_py.status): one
listener per process, blocked in ``accept()``, whose address and token each
rank writes into the job's store as its first Fairring group is created.  It
answers with this process's groups (backend/live_groups.h), and dumps torch's
flight recorder when a failed group's first rank asks (backend/dump_everywhere.h).

Kept apart from ``status.py`` (the view, and ``python -m fairring_py.status``),
which the package does not import.
"""

import atexit
import json
import os
import secrets
import socket
import threading
import time

import torch.distributed as dist

KEY = "fairring-status/"  # + global rank: where that rank answers; + "world": the job's size


class _Server:
    """One per process: answers every caller with this process's groups."""

    def __init__(self):
        self.token = secrets.token_hex(16)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.registered = set()  # global ranks written into the job's store
        # A dump asked for by another rank can still be writing as this
        # process exits: exit waits for it (bounded), as torch's writer and
        # its file are torn down at exit under the listener thread.
        self.dumping = threading.Lock()
        atexit.register(self.dumping.acquire, timeout=10.0)
        threading.Thread(target=self._serve, name="fairring-status", daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with conn:
                    conn.settimeout(2.0)
                    asked = b""
                    while not asked.endswith(b"\n") and len(asked) < 256:
                        chunk = conn.recv(256)
                        if not chunk:
                            break
                        asked += chunk
                    words = asked.decode(errors="replace").split()
                    if not words or words[0] != self.token:
                        continue  # not someone who read the job's store
                    if words[1:] == ["dump"]:
                        conn.sendall(self.dump().encode())
                    else:
                        conn.sendall(json.dumps(self.snapshot()).encode())
            except Exception:  # noqa: BLE001  (a caller that goes away must not end the thread)
                continue

    def dump(self) -> str:
        """A rank whose group failed asks every rank to dump torch's flight
        recorder (backend/dump_everywhere.cpp): this process does, for each of
        its ranks, where TORCH_FR_DUMP_ON_TIMEOUT asks for dumps."""
        from . import _C
        if not _dumps_wanted():
            return "not dumped: TORCH_FR_DUMP_ON_TIMEOUT is not set here"
        with self.lock:
            ranks = sorted(self.registered)
        with self.dumping:
            return "\n".join(_C._dump_flight_recorder(r, stack_traces=False) for r in ranks)

    def snapshot(self) -> dict:
        from . import _C
        out = []
        for group in _C._live_groups():
            try:
                out.append(_group_status(group))
            except Exception as e:  # noqa: BLE001  (one group's trouble must not hide the others)
                out.append({"error": f"could not read this group: {e}"})
        return {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "groups": out}


_server = None
_server_lock = threading.Lock()


def _dumps_wanted() -> bool:
    from . import _C
    return _C._dumps_after_failure()  # as the C++ side reads the variables


def _enabled() -> bool:
    return os.environ.get("FAIRRING_STATUS", "on").strip().lower() not in ("off", "0", "false", "no")


def root_store(store):
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _address_of(backend) -> str:
    # The address the group's rails listen on reaches this machine from the
    # others; a single-node group has none, and the hostname's does.
    host = backend.listen_address().rpartition(":")[0]
    if not host:
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return host


def register(backend, store, global_ranks) -> None:
    """Called as a Fairring group is created (``_create_backend``): start this
    process's listener, and write where this rank answers into the job's
    store (once per rank; again for a new default group).  The groups it
    reports join the view at their first op (backend/live_groups.h)."""
    global _server
    if not _enabled():
        return
    with _server_lock:
        if _server is None or _server.pid != os.getpid():  # none yet, or the parent's (fork)
            _server = _Server()
        server = _server
    rank = backend.rank()
    if global_ranks:
        me = global_ranks[rank]
    elif not dist.is_initialized():
        me = rank  # the default group, being created
    else:
        me = dist.get_rank()
    world = dist.get_world_size() if dist.is_initialized() else backend.size()
    root = root_store(store)
    with server.lock:
        # Once per rank; again for a new default group (a new job's store).
        if dist.is_initialized() and me in server.registered:
            return
        server.registered.add(me)
    # One line, "ip:port token pid host": read here and by the C++ side
    # that asks every rank to dump (backend/dump_everywhere.cpp).
    root.set(f"{KEY}{me}", f"{_address_of(backend)}:{server.port} {server.token} {os.getpid()} {socket.gethostname()}")
    root.set(f"{KEY}world", str(world))


def _group_status(st: dict) -> dict:
    ranks = st["global_ranks"]
    st["global_rank"] = ranks[st["rank"]] if ranks else None
    ops = st["ops"]
    # What a reader needs: the ops still in flight, and the last one issued.
    keep = [op for op in ops if op["state"] == "in flight"]
    if ops and ops[-1] not in keep:
        keep.append(ops[-1])
    st["ops"] = keep
    return st
