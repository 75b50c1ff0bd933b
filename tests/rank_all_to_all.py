"""Code that runs inside the ranks of tests/test_all_to_all.py: all_to_all
on Fairring (collectives/all_to_all.cpp) against a reference built
independently on every rank (every rank's input is generated from the seed;
block `rank` of sender s's input must land, bit for bit, in block s of our
output), for every dtype, odd sizes, several slices, non-contiguous and
multi-dimensional tensors, the list form, in place, and many in flight
mixed with all-reduces on the same tensors."""
from __future__ import annotations

import io

import time

import torch
import torch.distributed as dist

import refs
from rank_all_reduce import Failures


def _bits(t):
    # (contiguous() keeps the stride of a one-element view: clone instead)
    t = t.detach().reshape(-1).clone(memory_format=torch.contiguous_format)
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1).to(torch.uint8)


def _inputs(seed, world, n, dtype):
    """Every rank's input: W blocks of n elements (block d goes to rank d)."""
    return [refs.make_input(seed, r, world * n, dtype, "SUM") for r in range(world)]


def _want(inputs, rank, n):
    """Our output: block s is sender s's block `rank`."""
    return torch.cat([x[rank * n:(rank + 1) * n] for x in inputs])


def _check(failures, name, got, want):
    if got.shape != want.shape:
        failures.add(f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    elif not torch.equal(_bits(got), _bits(want)):
        bad = (got.reshape(-1) != want.reshape(-1)).nonzero()
        where = bad[0].item() if bad.numel() else "?"
        failures.add(f"{name}: wrong result (first differing element {where} of {got.numel()})")


def _native_kinds(since):
    import fairring_py

    return [r["kind"] for r in fairring_py.dump_recent(file=io.StringIO()) if r["seq"] > since]


def _last_seq():
    import fairring_py

    recs = fairring_py.dump_recent(file=io.StringIO())
    return recs[-1]["seq"] if recs else -1


def sec_all_to_all(rank, world, cfg):
    failures = Failures()
    first = _last_seq()
    seed = 8000
    dtypes = sorted({dt for dt, _ in refs.matrix()}, key=str)
    # Every dtype, odd sizes, one flat tensor each way.
    for dtype in dtypes:
        for n in cfg["sizes"]:
            seed += 1
            ins = _inputs(seed, world, n, dtype)
            out = torch.empty(world * n, dtype=dtype)
            try:
                dist.all_to_all_single(out, ins[rank].clone())
            except Exception as e:  # noqa: BLE001
                failures.add(f"{refs.dtype_name(dtype)} n={n}: raised {type(e).__name__}: {str(e)[:300]}")
                continue
            _check(failures, f"{refs.dtype_name(dtype)} n={n}", out, _want(ins, rank, n))
    # Several slices.
    seed += 1
    n = cfg["big"]
    ins = _inputs(seed, world, n, torch.float32)
    out = torch.empty(world * n)
    dist.all_to_all_single(out, ins[rank])
    _check(failures, f"big n={n}", out, _want(ins, rank, n))
    # Rows of a 2-D tensor, with equal splits given explicitly.
    seed += 1
    rows, cols = 3, 7
    ins = _inputs(seed, world, rows * cols, torch.float64)
    out = torch.empty(world * rows, cols, dtype=torch.float64)
    dist.all_to_all_single(out, ins[rank].reshape(world * rows, cols), [rows] * world, [rows] * world)
    _check(failures, "2-D rows with equal splits", out.reshape(-1), _want(ins, rank, rows * cols))
    # Non-contiguous input and output: every other element of longer tensors.
    seed += 1
    n = 1031
    ins = _inputs(seed, world, n, torch.int32)
    src = torch.zeros(2 * world * n, dtype=torch.int32)
    src[::2] = ins[rank]
    dst = torch.full((2 * world * n,), -5, dtype=torch.int32)
    dist.all_to_all_single(dst[::2], src[::2])
    _check(failures, "strided output", dst[::2], _want(ins, rank, n))
    if not torch.all(dst[1::2] == -5):
        failures.add("strided output: the elements between the output's were written")
    # In place: the output is the input.
    seed += 1
    ins = _inputs(seed, world, 4099, torch.float32)
    t = ins[rank].clone()
    dist.all_to_all_single(t, t)
    _check(failures, "in place", t, _want(ins, rank, 4099))
    # The list form.
    seed += 1
    n = 13
    ins = _inputs(seed, world, n, torch.bfloat16)
    outs = [torch.empty(n, dtype=torch.bfloat16) for _ in range(world)]
    dist.all_to_all(outs, list(ins[rank].clone().split(n)))
    _check(failures, "list form", torch.cat(outs), _want(ins, rank, n))
    # Many in flight, mixed with all-reduces on the same tensors, in issue order:
    # all_reduce(x); all_to_all(y <- x); all_reduce(y).
    works, cases = [], []
    for i in range(6):
        seed += 1
        n = 65537 if i % 2 else 5
        ins = _inputs(seed, world, n, torch.float64)
        x = ins[rank].clone()
        y = torch.empty_like(x)
        works.append(dist.all_reduce(x, async_op=True))
        works.append(dist.all_to_all_single(y, x, async_op=True))
        works.append(dist.all_reduce(y, async_op=True))
        cases.append((y, ins, n))
    for w in works:
        w.wait()
    for i, (y, ins, n) in enumerate(cases):
        summed = sum(x.double() for x in ins)  # every rank's x after the first all-reduce
        # Rank r's y holds W copies of summed's block r; the second all-reduce
        # adds them up: every block is the sum of summed's blocks.
        block = sum(summed[r * n:(r + 1) * n] for r in range(world))
        want = torch.cat([block] * world)
        # Sums of float64 in different orders: compare with a tolerance.
        if not torch.allclose(y, want, rtol=1e-12, atol=1e-12):
            failures.add(f"in flight {i} (n={n}): all_reduce -> all_to_all -> all_reduce out of order")
    kinds = set(_native_kinds(first))
    if kinds - {"all_to_all", "all_to_all_sizes", "all_reduce"} or "all_to_all" not in kinds:
        failures.add(f"the all-to-alls did not all run natively: recorded kinds {sorted(kinds)}")
    return {"failures": list(failures)}


def uneven(rank, world, big):
    """Unequal splits (the sizes shared first, then the hierarchical
    all-to-all with blocks of up to the largest): the right blocks for every
    dtype, with zero-sized blocks, rows of 2-D tensors, strided and in-place
    tensors, the list form of unequal sizes, several slices, a rank whose
    splits happen to be equal among peers' unequal ones, and several in
    flight mixed with all-reduces on the same tensors."""
    failures = Failures()
    first = _last_seq()

    def expect(ins, n):
        """Our output: from each sender s, its block for us."""
        want = []
        for s in range(world):
            start = sum(n(s, d) for d in range(rank))
            want.append(ins[s][start:start + n(s, rank)])
        return torch.cat(want)

    few = {torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64}
    for dtype in sorted({dt for dt, _ in refs.matrix()}, key=str):  # every dtype
        for scale in (1, 1000) if dtype in few else (1,):
            # Rank s sends ((s + d) % 3) x scale elements to rank d (some zero).
            def n(s, d):
                return ((s + d) % 3) * scale

            send = [n(rank, d) for d in range(world)]
            recv = [n(s, rank) for s in range(world)]
            ins = [refs.make_input(8500 + scale, s, sum(n(s, d) for d in range(world)), dtype, "SUM")
                   for s in range(world)]
            want = expect(ins, n)
            out = torch.empty(sum(recv), dtype=dtype)
            dist.all_to_all_single(out, ins[rank], recv, send)
            _check(failures, f"{refs.dtype_name(dtype)} x{scale}", out, want)
            holder = torch.zeros(2 * sum(recv), dtype=dtype)
            w = dist.all_to_all_single(holder[::2], ins[rank], recv, send, async_op=True)
            outs = [torch.empty(recv[s], dtype=dtype) for s in range(world)]
            w2 = dist.all_to_all(outs, list(ins[rank].split(send)), async_op=True)
            w.wait()
            w2.wait()
            _check(failures, f"{refs.dtype_name(dtype)} x{scale} strided", holder[::2], want)
            if not torch.all(holder[1::2] == 0):
                failures.add(f"{refs.dtype_name(dtype)} x{scale} strided: the elements between were written")
            _check(failures, f"{refs.dtype_name(dtype)} x{scale} list form", torch.cat(outs), want)
    # Rows of a 2-D tensor with a strided input, several slices, and blocks of
    # very different sizes (one up to `big` rows, one empty per rank).
    cols = 3

    def rows(s, d):
        return 0 if d == (s + 1) % world else (big if s == d else 1 + 7 * s + 3 * d)

    ins = [refs.make_input(8700, s, cols * sum(rows(s, d) for d in range(world)), torch.float32, "SUM")
           for s in range(world)]
    src = torch.zeros(ins[rank].numel() // cols, 2 * cols)
    src[:, ::2] = ins[rank].reshape(-1, cols)
    out = torch.empty(sum(rows(s, rank) for s in range(world)), cols)
    dist.all_to_all_single(out, src[:, ::2], [rows(s, rank) for s in range(world)],
                           [rows(rank, d) for d in range(world)])
    _check(failures, "2-D rows, strided input, several slices", out.reshape(-1),
           expect(ins, lambda s, d: rows(s, d) * cols))
    # In place (the output is the input): the same sizes both ways.
    def sym(s, d):
        return 5 + s + d

    ins = [refs.make_input(8800, s, sum(sym(s, d) for d in range(world)), torch.float64, "SUM")
           for s in range(world)]
    t = ins[rank].clone()
    sizes = [sym(rank, d) for d in range(world)]
    dist.all_to_all_single(t, t, sizes, sizes)
    _check(failures, "in place", t, expect(ins, sym))
    # Rank 0's splits are all equal (2 each way) while its peers' are not:
    # every rank takes the same path all the same.
    def mixed(s, d):
        return 2 if 0 in (s, d) else 1 + (s * 3 + d) % 4

    ins = [refs.make_input(8900, s, sum(mixed(s, d) for d in range(world)), torch.int32, "SUM") for s in range(world)]
    out = torch.empty(sum(mixed(s, rank) for s in range(world)), dtype=torch.int32)
    dist.all_to_all_single(out, ins[rank], [mixed(s, rank) for s in range(world)],
                           [mixed(rank, d) for d in range(world)])
    _check(failures, "equal splits on rank 0 only", out, expect(ins, mixed))
    # The recent ops record what this rank sent (not W x the largest block).
    import fairring_py

    last = fairring_py.dump_recent(file=io.StringIO())[-1]
    sent = 4 * sum(mixed(rank, d) for d in range(world))
    if last["kind"] != "all_to_all" or last["bytes"] != sent:
        failures.add(f"recent ops recorded {last['kind']} of {last['bytes']} bytes, want all_to_all of {sent}")
    # Several in flight, in issue order with all-reduces on the same tensors:
    # all_reduce(x); all_to_all(y <- x); all_reduce(x) (x read, then written).
    works, cases = [], []
    for i in range(4):
        def m(s, d, i=i):  # every rank sends and receives as much in all (the all-reduces)
            return (1 + (s + d) % world + i) * (4099 if i % 2 else 1)

        ins = [refs.make_input(9000 + i, s, sum(m(s, d) for d in range(world)), torch.float64, "SUM")
               for s in range(world)]
        x = ins[rank].clone()
        y = torch.empty(sum(m(s, rank) for s in range(world)), dtype=torch.float64)
        works.append(dist.all_reduce(x, async_op=True))
        works.append(dist.all_to_all_single(y, x, [m(s, rank) for s in range(world)],
                                            [m(rank, d) for d in range(world)], async_op=True))
        works.append(dist.all_reduce(x, async_op=True))
        cases.append((x, y, ins, m))
    for w in works:
        w.wait()
    for i, (x, y, ins, m) in enumerate(cases):
        summed = sum(v.double() for v in ins)  # every rank's x after the first all-reduce
        want = expect([summed] * world, m)
        if not torch.allclose(y, want, rtol=1e-12, atol=1e-12):
            failures.add(f"in flight {i}: all_reduce -> all_to_all -> all_reduce out of order (y)")
        if not torch.allclose(x, summed * world, rtol=1e-12, atol=1e-12):
            failures.add(f"in flight {i}: the second all_reduce did not see the first's result")
    kinds = set(_native_kinds(first))
    if kinds != {"all_to_all_sizes", "all_to_all", "all_reduce"}:
        failures.add(f"unequal splits recorded as {sorted(kinds)}")
    return {"failures": list(failures)}


def uneven_all_gather(rank, world):
    """all_gather into a list of one tensor per rank of that rank's input size
    (gloo refuses it): native, through the hierarchy (one op: every rank knows
    every size from its outputs), every dtype, one-element and empty inputs."""
    failures = Failures()
    first = _last_seq()
    for dtype in [torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64]:
        for scale in (0, 1, 1000):
            size = [j * scale + (j % 2) for j in range(world)]  # some empty
            ins = [refs.make_input(8600 + scale, j, size[j], dtype, "SUM") for j in range(world)]
            outs = [torch.empty(size[j], dtype=dtype) for j in range(world)]
            dist.all_gather(outs, ins[rank])
            for j in range(world):
                _check(failures, f"{refs.dtype_name(dtype)} x{scale} from {j}", outs[j], ins[j])
    kinds = set(_native_kinds(first))
    if kinds != {"all_gatherv"}:
        failures.add(f"uneven all_gather recorded as {sorted(kinds)}")
    return {"failures": list(failures)}


def mismatched_uneven_all_gather(rank, world):
    """Rank 1 passes one element more than rank 0's list expects from it
    (its own list agrees with it): every rank's all_gather fails with a
    mismatch within the group's timeout, and nothing is written into rank 0's
    block for rank 1 beyond its size.  Then a rank whose input is not the
    size of its own block of the list gets a ValueError naming both sizes,
    and outputs of another dtype than the input an error naming both dtypes,
    before anything is issued."""
    sizes = [j + 2 for j in range(world)]
    mine = sizes[rank] + (1 if rank == 1 else 0)
    expected = list(sizes)
    if rank != 0:
        expected[1] += 1
    outs = [torch.full((n,), -1.0) for n in expected]
    t0 = time.monotonic()
    err = None
    try:
        dist.all_gather(outs, torch.full((mine,), float(rank)))
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - t0
    local = None
    try:
        dist.all_gather([torch.empty(n) for n in sizes], torch.empty(sizes[rank] + 1))
    except Exception as e:  # noqa: BLE001
        local = f"{type(e).__name__}: {e}"
    wrong_dtype = None
    try:
        dist.all_gather([torch.empty(n, dtype=torch.float64) for n in sizes], torch.empty(sizes[rank]))
    except Exception as e:  # noqa: BLE001
        wrong_dtype = f"{type(e).__name__}: {e}"
    return {"error": err, "elapsed": elapsed, "local": local, "wrong_dtype": wrong_dtype}


def mismatched_splits(rank, world):
    """Every rank sends d + 1 elements to rank d, but rank 0 expects one more
    from rank 1: every rank's all-to-all fails naming both sizes, before
    anything moves; the group goes on."""
    send = [d + 1 for d in range(world)]
    recv = [rank + 1] * world
    if rank == 0:
        recv[1] += 1
    err = None
    try:
        dist.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(send)), recv, send)
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    t = torch.ones(3)
    dist.all_reduce(t)
    return {"error": err, "after": t.tolist()}


def bad_arguments_on_one_rank(rank, world):
    """Rank 0 passes a negative split, then (to the backend directly: torch
    itself refuses it) a list whose inputs are of two dtypes; its peers'
    arguments are fine.  Rank 0 gets its own error, every peer one that names
    rank 0, at once (the sizes are shared first), and the group goes on."""
    errors = []
    splits = [2] * world
    bad = [-1] + [2] * (world - 1) if rank == 0 else splits
    try:
        dist.all_to_all_single(torch.empty(2 * world), torch.ones(2 * world), splits, bad)
        errors.append(None)
    except Exception as e:  # noqa: BLE001
        errors.append(f"{type(e).__name__}: {e}")
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    ins = [torch.ones(3, dtype=torch.float64 if rank == 0 and j == 1 else torch.float32) for j in range(world)]
    outs = [torch.empty(3) for _ in range(world)]
    try:
        backend.alltoall(outs, ins, dist.AllToAllOptions()).wait()
        errors.append(None)
    except Exception as e:  # noqa: BLE001
        errors.append(f"{type(e).__name__}: {e}")
    t = torch.ones(3)
    dist.all_reduce(t)
    return {"errors": errors, "after": t.tolist()}


def splits_on_some_ranks(rank, world):
    """Rank 0 passes no splits, its peers pass equal ones: the ranks issued
    different ops, an error on every rank, no hang."""
    splits = None if rank == 0 else [2] * world
    try:
        dist.all_to_all_single(torch.empty(2 * world), torch.ones(2 * world), splits, splits)
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}
    return {"error": None}


def mismatch(rank, world, which):
    """Ranks issue different ops: an error on every rank, no hang."""
    try:
        if which == "size":
            n = 1031 * (1 + rank % 2)
            dist.all_to_all_single(torch.empty(world * n), torch.ones(world * n))
        elif rank == 0:
            dist.all_reduce(torch.ones(world * 1031))
        else:
            dist.all_to_all_single(torch.empty(world * 1031), torch.ones(world * 1031))
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}
    return {"error": None}


def bad_sizes(rank, world):
    """Sizes that are not one equal block per rank: a clear error, nothing issued."""
    dist.all_reduce(torch.ones(1))
    errors = []
    cases = [(torch.empty(world * 3 + 1), torch.ones(world * 3 + 1), None),
             (torch.empty(world * 4), torch.ones(world * 3), None),
             (torch.empty(world * 3), torch.ones(world * 3), [4] + [3] * (world - 1)),
             (torch.empty(world * 3), torch.ones(world * 3), [-1] + [3] * (world - 1))]
    for out, inp, splits in cases:
        try:
            dist.all_to_all_single(out, inp, input_split_sizes=splits)
            errors.append(None)
        except Exception as e:  # noqa: BLE001
            errors.append(str(e))
    x = torch.ones(world * 2)
    y = torch.empty(world * 2)
    dist.all_to_all_single(y, x)
    return {"errors": errors, "group_still_works": bool(torch.all(y == 1))}


def profiler_events(rank, world):
    """torch.profiler shows an all_to_all with splits as its two ops: the sizes
    exchange and the blocks, each under its own name."""
    from torch.profiler import ProfilerActivity, profile

    splits = [1 + r for r in range(world)]
    out = torch.empty(world * (1 + rank))
    inp = torch.arange(float(sum(splits)))
    dist.all_to_all_single(out, inp, [1 + rank] * world, splits)  # warm-up, outside the trace
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_to_all_single(out, inp, [1 + rank] * world, splits)
    names = [e.name for e in prof.events() if e.name.startswith("fairring:")]
    if sorted(names) != ["fairring:all_to_all", "fairring:all_to_all_sizes"]:
        return [f"fairring events {names}, want one fairring:all_to_all_sizes and one fairring:all_to_all"]
    return []

