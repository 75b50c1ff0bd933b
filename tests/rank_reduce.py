"""Code that runs inside the ranks of tests/test_reduce.py: dist.reduce on
Fairring (collectives/reduce.cpp) against the float64 / exact reference of
refs.py, for every dtype and op, odd sizes, every root; the non-root tensors
must come back unchanged, bit for bit."""
from __future__ import annotations

import io

import torch
import torch.distributed as dist

import refs
from rank_all_reduce import Failures


def _bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def _case(rank, world, seed, dtype, op, n, root, failures, make=None):
    inputs = [refs.make_input(seed, r, n, dtype, op) for r in range(world)]
    mine = inputs[rank].clone()
    t = make(mine) if make else mine
    before = t.clone()
    name = f"{refs.dtype_name(dtype)} {op} n={n} root={root}"
    try:
        dist.reduce(t, dst=root, op=refs.op_of(op))
    except Exception as e:  # noqa: BLE001
        failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
        return
    if rank == root:
        err = refs.compare(t.contiguous().reshape(-1), inputs, refs.reference(inputs, dtype, op), dtype, op)
        if err:
            failures.add(f"{name}: {err}")
    elif not torch.equal(_bits(t), _bits(before)):
        failures.add(f"{name}: the non-root tensor changed")


def _native_kinds(since):
    import fairring_py

    return [r["kind"] for r in fairring_py.dump_recent(file=io.StringIO()) if r["seq"] > since]


def sec_reduce(rank, world, cfg):
    import fairring_py

    failures = Failures()
    recs = fairring_py.dump_recent(file=io.StringIO())
    first = recs[-1]["seq"] if recs else -1
    seed = 7000
    for dtype, op in refs.matrix():
        for n in cfg["sizes"]:
            seed += 1
            _case(rank, world, seed, dtype, op, n, seed % world, failures)
    # Large (several slices) and every root.
    for root in range(world):
        seed += 1
        _case(rank, world, seed, torch.float32, "SUM", cfg.get("big", 1 << 20) + 7, root, failures)
    # Non-contiguous: every other element of a longer tensor, and a transposed view.
    seed += 1
    _case(rank, world, seed, torch.float64, "SUM", 1031, 1 % world, failures,
          make=lambda x: torch.zeros(2 * x.numel(), dtype=x.dtype).index_put_(
              (torch.arange(0, 2 * x.numel(), 2),), x)[::2])
    # PREMUL_SUM: scaled on the root, and the non-roots' tensors not scaled in place.
    seed += 1
    inputs = [refs.make_input(seed, r, 4099, torch.float32, "SUM") for r in range(world)]
    t = inputs[rank].clone()
    dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(2.0))
    if rank == 0:
        want = sum(x.double() for x in inputs) * 2.0
        if not torch.allclose(t.double(), want, rtol=1e-5, atol=1e-5):
            failures.add("PREMUL_SUM(2.0): wrong result on the root")
    elif not torch.equal(t, inputs[rank]):
        failures.add("PREMUL_SUM(2.0): a non-root's tensor was scaled in place")
    # Async reduces in flight, then the results.
    works, cases = [], []
    for i in range(8):
        seed += 1
        ins = [refs.make_input(seed, r, 65537, torch.float32, "SUM") for r in range(world)]
        x = ins[rank].clone()
        works.append(dist.reduce(x, dst=i % world, async_op=True))
        cases.append((x, ins, i % world))
    for w, (x, ins, root) in zip(works, cases):
        w.wait()
        if rank == root:
            err = refs.compare(x, ins, refs.reference(ins, torch.float32, "SUM"), torch.float32, "SUM")
            if err:
                failures.add(f"async reduce to {root}: {err}")
        elif not torch.equal(x, ins[rank]):
            failures.add(f"async reduce to {root}: the non-root tensor changed")
    kinds = set(_native_kinds(first))
    if kinds != {"reduce"}:
        failures.add(f"the reduces did not all run natively: recorded kinds {sorted(kinds)}")
    return {"failures": list(failures)}


def bad_root(rank, world):
    """A root outside the group is a clear error on the caller, nothing issued."""
    dist.all_reduce(torch.ones(1))  # every rank is up
    t = torch.ones(4)
    error = None
    try:
        dist.reduce(t, dst=world + 3)
    except Exception as e:  # noqa: BLE001
        error = str(e)
    # Nothing was issued: the group still works, and t is as it was.
    x = torch.ones(3)
    dist.reduce(x, dst=0)
    ok = bool(torch.all(x == (world if rank == 0 else 1))) and bool(torch.all(t == 1))
    return {"error": error, "group_still_works": ok}


def mismatch(rank, world, which):
    """Ranks issue different ops: an error on every rank, no hang."""
    t = torch.ones(1031)
    try:
        if which == "root":
            dist.reduce(t, dst=rank % 2)
        else:
            if rank == 0:
                dist.all_reduce(t)
            else:
                dist.reduce(t, dst=0)
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}
    return {"error": None}


def wire_case(rank, world):
    """FAIRRING_WIRE_DTYPE=bf16: the pieces sent to the servers and the sums
    sent to the root are rounded to bfloat16 (8 significant bits) once each,
    so the root's float32 SUM is within 2 x 2^-8 of the sum of magnitudes
    per element; the non-roots' tensors are unchanged."""
    failures = Failures()
    for root, n in [(0, 1), (world - 1, 1031), (1, 300_007)]:
        inputs = [refs.make_input(9100 + n, r, n, torch.float32, "SUM") for r in range(world)]
        t = inputs[rank].clone()
        dist.reduce(t, dst=root)
        if rank == root:
            want = sum(x.double() for x in inputs)
            bound = 2 * 2.0 ** -8 * sum(x.double().abs() for x in inputs) + 1e-30
            worst = ((t.double() - want).abs() / bound).max().item()
            if worst > 1:
                failures.add(f"n={n} root={root}: error {worst:.2f} x the bf16 bound")
        elif not torch.equal(t, inputs[rank]):
            failures.add(f"n={n} root={root}: the non-root tensor changed")
    return {"failures": list(failures)}
