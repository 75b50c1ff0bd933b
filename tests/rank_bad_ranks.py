"""Rank arguments that are not ranks of the group, walked over every public
call that takes one: each must be a ValueError on the rank that passed it,
naming the argument and its value, and leave the group working (nothing was
numbered, so the ranks stay matched).  Run by test_bad_ranks.py, on processes
(`walk`, through torch.distributed's functions and the group's own methods)
and on threads of one process (`walk_group`, the group's methods)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def bad_values(world: int, rank: int) -> list:
    """Negative, the any-source sentinel (-1), the world size, past it, the
    largest int (what a C++ int holds) and one past what an int holds."""
    return sorted({-1, -5, -(2**31), world, world + 7, 2**31 - 1})


def _attempt(results: list, name: str, value, fn) -> None:
    try:
        fn()
        results.append((name, value, None, ""))
    except Exception as e:  # noqa: BLE001
        results.append((name, value, type(e).__name__, str(e)))


def _calls_on_group(pg, rank: int, world: int) -> dict:
    """What a rank argument `v` reaches through the group's own methods
    (the backend's entry points, as torchft and direct users call them);
    each builds what it needs, so a bad call touches nothing shared."""
    t = lambda: torch.ones(4)  # noqa: E731

    def root(kind, v):
        o = kind()
        o.rootRank = v
        return o

    return {
        "pg.send": lambda v: pg.send([t()], v, 0).wait(),
        "pg.send (two tensors: delegated)": lambda v: pg.send([t(), t()], v, 0).wait(),
        "pg.recv": lambda v: pg.recv([t()], v, 0).wait(),
        "pg.broadcast": lambda v: pg.broadcast([t()], root(dist.BroadcastOptions, v)).wait(),
        "pg.broadcast (two tensors: delegated)": lambda v: pg.broadcast([t(), t()], root(dist.BroadcastOptions, v)).wait(),
        "pg.reduce": lambda v: pg.reduce([t()], root(dist.ReduceOptions, v)).wait(),
        "pg.gather": lambda v: pg.gather([[t() for _ in range(world)]], [t()], root(dist.GatherOptions, v)).wait(),
        "pg.scatter": lambda v: pg.scatter([t()], [[t() for _ in range(world)]], root(dist.ScatterOptions, v)).wait(),
    }


def _check_still_works(pg, rank: int, world: int) -> list:
    """After the bad calls: an all-reduce and a ring of sends, right."""
    failures = []
    x = torch.full((5,), float(rank + 1))
    pg.allreduce([x]).wait()
    want = world * (world + 1) / 2
    if not torch.equal(x, torch.full((5,), want)):
        failures.append(f"all_reduce after the bad calls gave {x.tolist()}, not {want}")
    got = torch.empty(3)
    works = [pg.send([torch.full((3,), float(rank))], (rank + 1) % world, 9)]
    works.append(pg.recv([got], (rank - 1) % world, 9))
    for w in works:
        w.wait()
    if not torch.equal(got, torch.full((3,), float((rank - 1) % world))):
        failures.append(f"ring send/recv after the bad calls gave {got.tolist()}")
    return failures


def walk_group(pg, rank: int, world: int) -> dict:
    """Every group method that takes a rank, with every bad value (and this
    rank itself for send and recv), then a check that the group still works."""
    results = []
    for name, call in _calls_on_group(pg, rank, world).items():
        p2p = "send" in name or "recv" in name
        # A root is an int64 in the options: one past what an int holds too.
        for v in bad_values(world, rank) + ([rank] if p2p else [2**40]):
            _attempt(results, name, v, lambda: call(v))
    return {"results": results, "failures": _check_still_works(pg, rank, world)}


def walk(rank: int, world: int) -> dict:
    """walk_group on the default group, and torch.distributed's functions
    (send, isend, recv, irecv, batch_isend_irecv's P2POp, the collectives
    with a root, and the group_dst / group_src forms) with every bad value."""
    out = walk_group(c10d._get_default_group(), rank, world)
    results = out["results"]
    t = lambda: torch.ones(4)  # noqa: E731
    calls = {
        "dist.send": lambda v: dist.send(t(), dst=v),
        "dist.isend": lambda v: dist.isend(t(), dst=v).wait(),
        "dist.recv": lambda v: dist.recv(t(), src=v),
        "dist.irecv": lambda v: dist.irecv(t(), src=v).wait(),
        "dist.send(group_dst)": lambda v: dist.send(t(), group_dst=v),
        "dist.recv(group_src)": lambda v: dist.recv(t(), group_src=v),
        "batch_isend_irecv(isend)": lambda v: [w.wait() for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t(), v)])],
        "batch_isend_irecv(irecv)": lambda v: [w.wait() for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, t(), v)])],
        "dist.broadcast": lambda v: dist.broadcast(t(), src=v),
        "dist.broadcast(group_src)": lambda v: dist.broadcast(t(), group_src=v),
        "dist.reduce": lambda v: dist.reduce(t(), dst=v),
        "dist.gather": lambda v: dist.gather(t(), [t() for _ in range(world)] if rank == v else None, dst=v),
        "dist.scatter": lambda v: dist.scatter(t(), [t() for _ in range(world)] if rank == v else None, src=v),
    }
    for name, call in calls.items():
        for v in bad_values(world, rank):
            _attempt(results, name, v, lambda: call(v))
    out["failures"] += _check_still_works(c10d._get_default_group(), rank, world)
    dist.barrier()
    return out
