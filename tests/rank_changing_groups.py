"""Groups that change (test_changing_groups.py): a rank that leaves its group
while its process lives is named at once; set_timeout and the group's error
kind; shrink after a rank died or left; split.  Each function runs on every
rank (launch.run_ranks), or on threads (thread_groups.run_threads)."""
from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import refs

ERROR_TYPES = {0: "SUCCESS", 1: "TIMEOUT", 2: "COMM_ERROR", 3: "REMOTE_ERROR"}


def _backend(pg):
    return pg._get_backend(torch.device("cpu"))


def _error_type(pg) -> str:
    return ERROR_TYPES[_backend(pg).error()[0]]


def _sum_check(pg, rank, world, seed, n=1031, dtype=torch.float32) -> str:
    """An all_reduce on `pg` against the float64 reference; '' when right."""
    inputs = [refs.make_input(seed, r, n, dtype, "SUM") for r in range(world)]
    x = inputs[rank].clone()
    pg.allreduce([x]).wait()
    ref = refs.reference(inputs, dtype, "SUM")
    err = refs.compare(x, inputs, ref, dtype, "SUM")
    return f"all_reduce of {n} {dtype} on {world} ranks: {err}" if err else ""


def _timed_failure(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        return {"error": None, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}


def leaves(rank, world, leaver):
    """`leaver` destroys a Fairring subgroup after its op #0 while its
    process lives on; the others' next all_reduce on it fails at once,
    naming it.  The default group goes on working for everyone."""
    g = dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=30))
    t = torch.ones(8)
    dist.all_reduce(t, group=g)
    out = {"first": float(t[0])}
    dist.barrier()  # op #0 done everywhere
    if rank == leaver:
        dist.destroy_process_group(g)
        dist.barrier()
    else:
        dist.barrier()  # the leaver has left
        out["next"] = _timed_failure(lambda: g.allreduce([torch.ones(8)]).wait())
        out["error_type"] = _error_type(g)
    # The default group (another group) is untouched.
    x = torch.full((3,), float(rank))
    dist.all_reduce(x)
    out["default_ok"] = bool(torch.all(x == sum(range(world))))
    dist.barrier()
    return out


def set_timeout_governs_later_ops(rank, world):
    """A group created with a 60 s timeout, set_timeout(2 s) on every rank:
    an all_reduce that rank 1 never calls fails on the others within a few
    seconds ("Timed out"), and getError says TIMEOUT (or REMOTE_ERROR where
    another rank's timeout arrived first)."""
    g = dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=60))
    g.allreduce([torch.ones(4)]).wait()
    g.set_timeout(timedelta(seconds=2))
    before = _error_type(g)
    out = {"before": before}
    if rank != 1:
        out["stalled"] = _timed_failure(lambda: g.allreduce([torch.ones(4)]).wait())
        out["error_type"] = _error_type(g)
    dist.barrier()
    try:
        _backend(g).set_timeout(timedelta(seconds=0))
        out["zero"] = None
    except Exception as e:  # noqa: BLE001
        out["zero"] = f"{type(e).__name__}: {e}"
    return out


def shrink_after_loss(rank, world, lost, how, flags):
    """`lost` goes (how: "kill": SIGKILL; "leave": destroys the default
    group and exits cleanly later) after op #0; the survivors' next
    all_reduce fails naming it, then they shrink the default group and go
    on: results against the reference after the shrink and after a second
    shrink (down to fewer ranks), timed from the error to the first
    completed all_reduce."""
    out = {}
    err = _sum_check(c10d._get_default_group(), rank, world, 11)
    out["before"] = err
    dist.barrier()
    # The lost rank goes once every rank is past the barrier: a rank still
    # inside it when a survivor's next op fails would fail it too (a failure
    # fails every op in flight on the group, even one the failing rank had
    # finished), which is the group's rule, not what this test is about.
    store = c10d._get_default_store()
    store.set(f"past-barrier/{rank}", "1")
    store.wait([f"past-barrier/{r}" for r in range(world)])
    if rank == lost:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        dist.destroy_process_group()
        time.sleep(2)  # alive while the others shrink (they take ~0.2 s)
        return {"left": True}
    failed = _timed_failure(lambda: dist.all_reduce(torch.ones(4)))
    out["failed"] = failed
    t0 = time.monotonic()
    pg = dist.shrink_group([lost], shrink_flags=flags)
    out["new_rank"], out["new_size"] = pg.rank(), pg.size()
    out["after"] = _sum_check(pg, pg.rank(), pg.size(), 12, n=4099)
    out["recovery_s"] = time.monotonic() - t0
    out["topology"] = _backend(pg).topology()
    out["is_default"] = c10d._get_default_group() is pg
    # Every collective kind on the shrunk group, against its reference.
    y = torch.arange(6, dtype=torch.float64) + pg.rank()
    dist.broadcast(y, src=0)
    out["broadcast_ok"] = bool(torch.equal(y, torch.arange(6, dtype=torch.float64)))
    # Twice: the shrunk group's last rank goes too (it leaves cleanly).
    if pg.size() > 2:
        last = pg.size() - 1
        if pg.rank() == last:
            dist.destroy_process_group()
            return out
        pg2 = dist.shrink_group([last])
        out["second"] = _sum_check(pg2, pg2.rank(), pg2.size(), 13, n=65537)
        out["second_size"] = pg2.size()
    return out


def shrink_bad_calls(rank, world):
    """Shrink's argument errors: excluding every rank, a rank out of range,
    the same rank twice, and the caller itself (direct backend calls: torch
    checks some of them first for dist.shrink_group)."""
    be = _backend(c10d._get_default_group())
    out = {}
    for name, ranks in (("all", list(range(world))), ("range", [world + 2]), ("twice", [1, 1]), ("self", [rank])):
        try:
            be.shrink(ranks, 0, None)
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    out["still"] = _sum_check(c10d._get_default_group(), rank, world, 21)
    return out


def split(rank, world):
    """split_group into {0, 1} and {2, ...}: each part its own group, with
    its own numbering and hierarchy; the parent goes on."""
    pg = c10d._get_default_group()
    mine = [0, 1] if rank < 2 else list(range(2, world))
    child = pg.split_group(mine, timeout=timedelta(seconds=30), group_name=f"split-{mine[0]}")
    out = {"size": child.size(), "rank": child.rank()}
    out["child"] = _sum_check(child, child.rank(), child.size(), 31, n=4099)
    out["parent"] = _sum_check(pg, rank, world, 32)
    out["topology"] = _backend(child).topology()
    return out


# ---- ranks as threads of one process (thread_groups.run_threads) ----

def threads_leave(box, rank, world, how):
    """Rank world-1 leaves its group after op #0 (how: "shutdown", or
    "drop": its last reference goes, as when torchft's wrapper drops it);
    the others' next all_reduce fails at once with the conventional words."""
    pg = box[0]
    t = torch.ones(4)
    pg.allreduce([t]).wait()
    if rank == world - 1:
        if how == "shutdown":
            pg.shutdown()
        else:
            box.clear()
            del pg
        return {"left": True}
    time.sleep(0.2)
    res = _timed_failure(lambda: pg.allreduce([torch.ones(4)]).wait())
    res["error_type"] = _error_type(pg)
    return res


def threads_shrink(pg, rank, world):
    """Rank world-1 shuts down after op #0; the others shrink (the backend's
    shrink, as torch's shrink_group calls it) and all_reduce on the child."""
    pg.allreduce([torch.ones(4)]).wait()
    if rank == world - 1:
        pg.shutdown()
        return {"left": True}
    time.sleep(0.2)
    failed = _timed_failure(lambda: pg.allreduce([torch.ones(4)]).wait())
    be = _backend(pg).shrink([world - 1], 0, None)
    child = dist.ProcessGroup(dist.HashStore(), be.rank(), be.size())
    child._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    child._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, be)
    out = {"failed": failed, "size": be.size(), "after": _sum_check(child, be.rank(), be.size(), 41, n=1031)}
    child.shutdown()
    return out


def abort_hooks(rank, world):
    """torch >= 2.14: each rank registers an abort hook on a Fairring group;
    rank 0 aborts it, the others' next all_reduce fails.  Every rank's hook
    ran exactly once (at abort(), or at the first failed op), and an
    unregistered one never."""
    g = dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=30))
    ran = []
    g.register_abort_hook(1, lambda: ran.append("kept"))
    g.register_abort_hook(2, lambda: ran.append("unregistered"))
    g.unregister_abort_hook(2)
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    dist.barrier()
    out = {}
    if rank == 0:
        g.abort()
        out["op"] = ""
    else:
        out["op"] = _timed_failure(lambda: dist.all_reduce(torch.ones(4), group=g))["error"]
        _timed_failure(lambda: dist.all_reduce(torch.ones(4), group=g))  # a second failure runs nothing
    dist.barrier()
    out["ran"] = ran
    return out


def shrink_keeps_options(rank, world, lost):
    """The lost rank is SIGKILLed after op #0; the survivors shrink.  The
    child keeps the parent's options (FAIRRING_REDUCTION_SERVERS,
    FAIRRING_WIRE_DTYPE from the test's environment): its all_reduce of
    values exact in bf16 matches the reference, and `fine` (1 + 2^-10 on
    every rank) shows whether the rails rounded it."""
    t = torch.full((1031,), float(rank + 1))
    dist.all_reduce(t)
    out = {"before": float(t[0])}
    store = c10d._get_default_store()
    store.set(f"past-op0/{rank}", "1")
    store.wait([f"past-op0/{r}" for r in range(world)])
    if rank == lost:
        os.kill(os.getpid(), signal.SIGKILL)
    out["failed"] = _timed_failure(lambda: dist.all_reduce(torch.ones(4)))
    t0 = time.monotonic()
    pg = dist.shrink_group([lost])
    n = pg.size()
    exact = torch.full((65537,), float(pg.rank() + 1))
    dist.all_reduce(exact, group=pg)
    out["recovery_s"] = time.monotonic() - t0
    out["exact"] = bool((exact == n * (n + 1) / 2).all())
    fine = torch.full((4099,), 1 + 2.0**-10)
    dist.all_reduce(fine, group=pg)
    out["fine"] = sorted(set(fine.tolist()))
    out["nodes"] = _backend(pg).topology()["num_nodes"]
    return out


def ephemeral_timeout(rank, world):
    """torch >= 2.14: a group with a 2 s timeout; rank 0 adds 4 s for its
    next ops (_add_ephemeral_timeout).  Rank 1 comes 3 s late to op A: rank
    0 waits for it and A completes.  The extension ended with A: rank 1 is 3 s
    late to op B too, and rank 0 times out at about 2 s."""
    g = dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=2))
    dist.all_reduce(torch.ones(4), group=g)
    dist.barrier()
    out = {}
    if rank == 0:
        g._add_ephemeral_timeout(timedelta(seconds=4))
        out["a"] = _timed_failure(lambda: dist.all_reduce(torch.ones(4), group=g))
    else:
        time.sleep(3)
        dist.all_reduce(torch.ones(4), group=g)
    dist.barrier()
    if rank == 0:
        out["b"] = _timed_failure(lambda: dist.all_reduce(torch.ones(4), group=g))
    else:
        time.sleep(3)
        _timed_failure(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier()
    return out
