"""Code that runs inside the ranks of tests/test_fresh_memory.py: every
native collective into the kinds of memory trainers pass (a fresh
torch.empty, a reused buffer, an unaligned view into a larger allocation,
huge-page-backed memory), large enough for Fairring's huge-page advice
(kernels/first_touch.h), against refs.py's exact references; the bytes
around a view must stay as they were."""
from __future__ import annotations

import torch
import torch.distributed as dist

import refs
from rank_all_reduce import Failures

# Elements per rank: an output of several MiB, so that its 2 MiB-aligned
# interior is advised; odd, so that nothing lines up by accident.
N = 1_000_003
SENTINEL = -7

ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _memories(numel, dtype, failures, what):
    """(name, tensor, check of what is around it) for each kind of memory."""
    from fairring_py import _C

    yield "fresh", torch.empty(numel, dtype=dtype), None
    reused = torch.full((numel,), SENTINEL, dtype=dtype)
    yield "reused", reused, None
    # A view one element into a larger allocation: not aligned to anything,
    # and the bytes before and after it belong to the user.
    big = torch.full((numel + 4099,), SENTINEL, dtype=dtype)
    view = big[1:1 + numel]

    def around():
        if not (bool((big[:1] == SENTINEL).all()) and bool((big[1 + numel:] == SENTINEL).all())):
            failures.add(f"{what} into an offset view: bytes outside the view changed")

    yield "offset-view", view, around
    hp = torch.empty(numel, dtype=dtype)
    _C._advise_fresh_memory_for_test(hp)  # backed by huge pages from its first write on
    yield "huge-pages", hp, None


def _check(failures, name, got, want):
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].item()
        failures.add(f"{name}: element {bad} is {got[bad].item()}, expected {want[bad].item()}")


def fresh_outputs(rank, world, seed):
    failures = Failures()
    # all_gather: float32 bits are copied exactly.
    ag_in = [refs.make_input(seed, r, N, torch.float32, "SUM") for r in range(world)]
    ag_want = torch.cat(ag_in)
    for kind, out, around in _memories(N * world, torch.float32, failures, "all_gather"):
        ALL_GATHER(out, ag_in[rank])
        _check(failures, f"all_gather into {kind}", out, ag_want)
        if around:
            around()
    # reduce_scatter, all_reduce, reduce: int32 SUM wraps exactly as the reference does.
    rs_in = [refs.make_input(seed + 1, r, N * world, torch.int32, "SUM") for r in range(world)]
    rs_sum = refs.reference(rs_in, torch.int32, "SUM")
    for kind, out, around in _memories(N, torch.int32, failures, "reduce_scatter"):
        REDUCE_SCATTER(out, rs_in[rank].clone())
        _check(failures, f"reduce_scatter into {kind}", out, rs_sum[rank * N:(rank + 1) * N])
        if around:
            around()
    # In place: the tensor holds the input first, so it is never fresh; the
    # views and huge pages still matter.
    for kind, t, around in _memories(N * world, torch.int32, failures, "in-place ops"):
        t.copy_(rs_in[rank])
        dist.all_reduce(t)
        _check(failures, f"all_reduce on {kind}", t, rs_sum)
        t.copy_(rs_in[rank])
        dist.reduce(t, dst=world - 1)
        if rank == world - 1:
            _check(failures, f"reduce on {kind}", t, rs_sum)
        t.copy_(rs_in[rank])
        dist.broadcast(t, src=0)
        _check(failures, f"broadcast on {kind}", t, rs_in[0])
        if around:
            around()
    return {"failures": list(failures)}
