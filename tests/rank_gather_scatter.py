"""Code that runs inside the ranks of tests/test_gather_scatter.py: gather
and scatter on Fairring (collectives/gather.cpp, scatter.cpp) against a
reference built on every rank from the seed, bit for bit: every dtype, odd
sizes, every root, several slices, non-contiguous tensors, gather_object /
scatter_object_list, many in flight mixed with all-reduces on the same
tensors; the tensors a rank only reads come back unchanged."""
from __future__ import annotations


import torch
import torch.distributed as dist

import refs
from rank_all_to_all import _bits, _check, _last_seq, _native_kinds
from rank_all_reduce import Failures


def _gather_case(rank, world, seed, dtype, n, root, failures, make=None):
    pieces = [refs.make_input(seed, r, n, dtype, "SUM") for r in range(world)]
    mine = make(pieces[rank].clone()) if make else pieces[rank].clone()
    before = mine.clone()
    outs = [torch.full_like(pieces[0], 0) for _ in range(world)] if rank == root else None
    name = f"gather {refs.dtype_name(dtype)} n={n} root={root}"
    try:
        dist.gather(mine, outs, dst=root)
    except Exception as e:  # noqa: BLE001
        failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
        return
    if rank == root:
        _check(failures, name, torch.cat(outs), torch.cat(pieces))
    if not torch.equal(_bits(mine), _bits(before)):
        failures.add(f"{name}: the input changed")


def _scatter_case(rank, world, seed, dtype, n, root, failures, make=None):
    pieces = [refs.make_input(seed, r, n, dtype, "SUM") for r in range(world)]
    ins = [p.clone() for p in pieces] if rank == root else None
    out = torch.zeros(n, dtype=dtype)
    out = make(out) if make else out
    name = f"scatter {refs.dtype_name(dtype)} n={n} root={root}"
    try:
        dist.scatter(out, ins, src=root)
    except Exception as e:  # noqa: BLE001
        failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
        return
    _check(failures, name, out.contiguous(), pieces[rank])
    if rank == root and not all(torch.equal(_bits(a), _bits(b)) for a, b in zip(ins, pieces)):
        failures.add(f"{name}: the root's inputs changed")


def _strided(x):
    """x as every other element of a longer tensor."""
    host = torch.zeros(2 * x.numel(), dtype=x.dtype)
    host[::2] = x
    return host[::2]


def sec_gather_scatter(rank, world, cfg):
    failures = Failures()
    first = _last_seq()
    seed = 9000
    dtypes = sorted({dt for dt, _ in refs.matrix()}, key=str)
    for dtype in dtypes:
        for n in cfg["sizes"]:
            seed += 1
            _gather_case(rank, world, seed, dtype, n, seed % world, failures)
            _scatter_case(rank, world, seed, dtype, n, (seed + 1) % world, failures)
    for root in range(world):
        seed += 1
        _gather_case(rank, world, seed, torch.float32, cfg["big"], root, failures)
        _scatter_case(rank, world, seed, torch.float32, cfg["big"], root, failures)
    seed += 1
    _gather_case(rank, world, seed, torch.int64, 1031, world - 1, failures, make=_strided)
    _scatter_case(rank, world, seed, torch.int64, 1031, world - 1, failures, make=_strided)
    # Many in flight, with all-reduces on the same tensors, in issue order:
    # all_reduce(x); gather(x -> root); scatter(root's gathered list -> y); all_reduce(y).
    works, cases = [], []
    for i in range(4):
        seed += 1
        n = 65537 if i % 2 else 7
        root = i % world
        pieces = [refs.make_input(seed, r, n, torch.float64, "SUM") for r in range(world)]
        x = pieces[rank].clone()
        got = [torch.empty(n, dtype=torch.float64) for _ in range(world)] if rank == root else None
        y = torch.empty(n, dtype=torch.float64)
        works.append(dist.all_reduce(x, async_op=True))
        works.append(dist.gather(x, got, dst=root, async_op=True))
        works.append(dist.scatter(y, got, src=root, async_op=True))
        works.append(dist.all_reduce(y, async_op=True))
        cases.append((y, pieces))
    for w in works:
        w.wait()
    for i, (y, pieces) in enumerate(cases):
        # Every x is the sum; the root scatters W copies of it; y summed W times.
        want = sum(p.double() for p in pieces) * world
        if not torch.allclose(y, want, rtol=1e-12, atol=1e-12):
            failures.add(f"in flight {i}: all_reduce -> gather -> scatter -> all_reduce out of order")
    kinds = set(_native_kinds(first))
    if kinds != {"gather", "scatter", "all_reduce"}:
        failures.add(f"the gathers and scatters did not all run natively: recorded kinds {sorted(kinds)}")
    # The object forms go through them too.
    objs = [None] * world if rank == 0 else None
    dist.gather_object({"rank": rank, "pad": "x" * (rank * 37)}, objs, dst=0)
    if rank == 0 and [o["rank"] for o in objs] != list(range(world)):
        failures.add(f"gather_object: {objs}")
    got = [None]
    dist.scatter_object_list(got, [f"to {r}" for r in range(world)] if rank == world - 1 else None, src=world - 1)
    if got != [f"to {rank}"]:
        failures.add(f"scatter_object_list: {got}")
    return {"failures": list(failures)}


def bad_args(rank, world):
    """A root outside the group: a clear error on every rank, and the group
    goes on.  A root's list of the wrong length or size, which only the root
    can see: its own clear error there, and at once one naming it on the
    others (the root still takes the op's turn, rejected); that group has
    failed then, so each case runs on a group of its own, and the default
    group still works after."""
    dist.all_reduce(torch.ones(1))
    errors = {}
    try:
        dist.gather(torch.ones(3), None, dst=world + 2)
    except Exception as e:  # noqa: BLE001
        errors["root"] = str(e)
    for name, lst in [("length", [torch.empty(3)] * (world + 1)), ("size", [torch.empty(4)] * world)]:
        group = dist.new_group(list(range(world)))
        try:
            dist.scatter(torch.empty(3), lst if rank == 0 else None, src=0, group=group)
        except Exception as e:  # noqa: BLE001
            errors[name] = str(e)
        dist.destroy_process_group(group)
    x = torch.full((3,), float(rank))
    out = [torch.empty(3) for _ in range(world)] if rank == 0 else None
    dist.gather(x, out, dst=0)
    ok = rank != 0 or torch.equal(torch.cat(out), torch.arange(world).repeat_interleave(3).float())
    return {"errors": errors, "group_still_works": bool(ok)}


def mismatch(rank, world, which):
    """Ranks issue different ops: an error on every rank, no hang.  A rank
    whose own part involved no mismatched peer (on 2 x 2, a non-root rank of
    the other node whose node-mate and rail peer issued what it did) may
    finish that op; the group has failed, so its next op says why."""
    try:
        if which == "root":
            dist.gather(torch.ones(1031), [torch.empty(1031) for _ in range(world)] if rank == rank % 2 else None,
                        dst=rank % 2)
        elif rank == 0:
            dist.scatter(torch.empty(1031), [torch.ones(1031)] * world, src=0)
        else:
            dist.gather(torch.ones(1031), None, dst=0)
        dist.all_reduce(torch.ones(1))
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}
    return {"error": None}
