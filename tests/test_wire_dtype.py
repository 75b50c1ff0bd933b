"""Compressed rails (FAIRRING_WIRE_DTYPE): the conversion kernels bit for bit
against torch, and all-reduce / reduce-scatter on simulated clusters: bits
identical on every rank, error within the bound of docs/COMPRESSED_RAILS.md, what must stay exact
stays exact, and ranks that disagree on the option fail group creation."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

import launch
import refs
import test_errors
from topologies import node_ids

from fairring_py import _C

U = {"bf16": 2.0**-8, "fp16": 2.0**-11}
TORCH_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ---- the kernels -------------------------------------------------------------

def _f32(bits):
    return torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32).copy())


def _special_f32():
    """Every class of float32, as bit patterns."""
    bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
            0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,  # subnormals
            0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF,  # smallest / largest normals
            0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0xFFC12345, 0x7FFFFFFF]  # NaNs (payloads)
    for base in (0x3F800000, 0x3F810000, 0xC0490000, 0x00010000, 0x7F7F0000):
        bits += [base | 0x8000, base | 0x7FFF, base | 0x8001, base | 0xFFFF]  # bf16 ties / neighbours
    for base in (0x3F800000, 0x3F802000, 0x38800000, 0x33800000, 0x37000000, 0x477FE000):
        bits += [base | 0x1000, base | 0x0FFF, base | 0x1001, base + 0x3000]  # fp16 ties (normal, subnormal)
    # fp16's range edge: 65504 (max), the last value that rounds to it, the first to inf
    bits += [0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x33000000, 0x33000001, 0x32FFFFFF]
    g = np.random.default_rng(11)
    bits += list(g.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32))
    return _f32(bits)


@pytest.fixture(params=["generic", "avx2"])
def isa(request):
    before = _C._reduce_isa_for_test()
    try:
        _C._reduce_isa_for_test(request.param)
    except RuntimeError:
        pytest.skip(f"{request.param} kernels not available here")
    yield request.param
    _C._reduce_isa_for_test("auto")
    assert _C._reduce_isa_for_test() == before


def _same_bits_or_both_nan(got_bits, want_bits, fmt, x):
    """Same bits, except that NaN may be any NaN on the torch side (torch's
    vectorised conversions keep payload bits, its scalar ones do not)."""
    g = got_bits.view(TORCH_HALF[fmt]).float()
    w = want_bits.view(TORCH_HALF[fmt]).float()
    bad = ~(torch.isnan(g) & torch.isnan(w)) & (got_bits != want_bits)
    assert not bool(bad.any()), (
        f"{fmt}: {int(bad.sum())} differ, e.g. inputs {[hex(v & 0xFFFFFFFF) for v in x[bad][:5].view(torch.int32).tolist()]} "
        f"got {[hex(v & 0xFFFF) for v in got_bits[bad][:5].tolist()]} "
        f"want {[hex(v & 0xFFFF) for v in want_bits[bad][:5].tolist()]}")


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_narrow_f32_matches_torch(isa, fmt):
    x = _special_f32()
    got = _C._wire_narrow_for_test(x, fmt)
    want = x.to(TORCH_HALF[fmt]).view(torch.int16)
    _same_bits_or_both_nan(got, want, fmt, x)
    # NaN stays NaN; the canonical quiet NaN with its sign (as c10's scalar conversion).
    nan = torch.isnan(x)
    canon = 0x7FC0 if fmt == "bf16" else 0x7E00
    sign = (x[nan].view(torch.int32) < 0).to(torch.int32) * 0x8000
    expected = canon | sign if fmt == "fp16" else torch.full_like(sign, canon)
    assert torch.equal(got[nan].to(torch.int32) & 0xFFFF, expected)
    # Misaligned start and a length that is not a multiple of 8 (vector tails).
    got_tail = _C._wire_narrow_for_test(x[3:1000], fmt)
    assert torch.equal(got_tail, got[3:1000])


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_widen_every_pattern_matches_torch(isa, fmt):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    want = bits.view(TORCH_HALF[fmt]).float()
    for dtype in (torch.float32, torch.float64):
        got = _C._wire_widen_for_test(bits, fmt, dtype)
        ok = (got.float() == want) | (torch.isnan(got.float()) & torch.isnan(want))
        assert bool(ok.all()), f"{fmt}->{dtype}: {int((~ok).sum())} patterns differ"
        # Signed zeros keep their sign.
        assert torch.equal(torch.signbit(got.float()), torch.signbit(want))


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_scale_is_exact_power_of_two(isa, fmt):
    # (The rails scale fp16 messages only; the kernels take a scale for both.)
    x = torch.randn(10_001, dtype=torch.float32) * 1e6
    for e in (-7, 0, 5, 20):
        got = _C._wire_narrow_for_test(x, fmt, e)
        want = (x * 2.0**e).to(TORCH_HALF[fmt]).view(torch.int16)
        assert torch.equal(got, want)
        assert torch.equal(_C._wire_narrow_for_test(x.double(), fmt, e), want)
        back = _C._wire_widen_for_test(got, fmt, torch.float32, e)
        assert torch.equal(back, want.view(TORCH_HALF[fmt]).float() * 2.0**-e)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_narrow_f64_rounds_once(isa, fmt):
    x32 = _special_f32()
    x32 = x32[torch.isfinite(x32)]
    # float64 values that are float32 values: same bits as the float32 path.
    got = _C._wire_narrow_for_test(x32.double(), fmt)
    assert torch.equal(got, _C._wire_narrow_for_test(x32, fmt))
    # Just above a tie of the wire format, by less than float32 can hold: a
    # double rounding through float32 would land on the tie and round to even.
    one_ulp = 2.0**-7 if fmt == "bf16" else 2.0**-10
    d = torch.tensor([1.0 + one_ulp / 2 + 2.0**-40, -(1.0 + one_ulp / 2 + 2.0**-40), 1.0 + one_ulp / 2],
                     dtype=torch.float64)
    got = _C._wire_narrow_for_test(d, fmt).view(TORCH_HALF[fmt]).double()
    assert got.tolist() == [1.0 + one_ulp, -(1.0 + one_ulp), 1.0]


def _prefix(msg):
    """(tag, scale exponent) of a message's 8-byte prefix."""
    tag, e = msg[:8].numpy().view(np.uint32)
    return int(tag), int(np.int32(e))


def wire_messages():
    """Messages worth encoding: every fp32 class, and maxima at the edges of
    the fp16 scale (subnormal, tiny and huge float64, all zero, no finite
    value).  Shared with the CUDA codec's test (tests/test_gpu_kernels.py)."""
    x = _special_f32()
    g = torch.Generator().manual_seed(3)
    out = {"special": x, "random": torch.randn(100_003, generator=g) * 1e3,
           "subnormal max": _f32([0x00000001, 0x80000003, 0x00012345, 0]),
           "zeros": torch.zeros(17), "no finite": _f32([0x7F800000, 0xFFC00000, 0xFF800000]), "empty": torch.zeros(0),
           "huge f64": torch.tensor([1e300, -3.0, 2.0**135, 7e-300], dtype=torch.float64),
           "tiny f64": torch.tensor([1e-300, -5e-310, 0.0], dtype=torch.float64),
           "f64 at 2^15": torch.tensor([2.0**15, -2.0**15 * (1 - 2.0**-53), 1.0], dtype=torch.float64)}
    out["special f64"] = x.double() * 3.0
    return out


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_message_format(isa, fmt):
    """The rails' message: tag, fp16's exponent from the largest finite |x|,
    the elements narrowed with it; decoding widens them back."""
    for name, x in wire_messages().items():
        msg = _C._wire_encode_for_test(x, fmt)
        assert msg.numel() == 8 + 2 * x.numel(), name
        tag, e = _prefix(msg)
        assert tag == 0x57495200 | (2 if fmt == "fp16" else 1), name
        finite = x[torch.isfinite(x)].double().abs()
        top = float(finite.max()) if finite.numel() else 0.0
        if fmt == "bf16" or top == 0.0:
            assert e == 0, name
        else:
            assert -120 <= e <= 120, name
            if -120 < e < 120:
                assert 2.0**14 <= top * 2.0**e < 2.0**15, f"{name}: max {top} e {e}"
        assert torch.equal(msg[8:].view(torch.int16), _C._wire_narrow_for_test(x, fmt, e)), name
        back = _C._wire_decode_for_test(msg, fmt, x.dtype)
        widened = _C._wire_widen_for_test(msg[8:].view(torch.int16), fmt, x.dtype, e)
        assert torch.equal(back.view(torch.uint8), widened.view(torch.uint8)), name
    with pytest.raises(RuntimeError, match="malformed compressed rail message"):
        _C._wire_decode_for_test(_C._wire_encode_for_test(torch.ones(4), fmt), "bf16" if fmt == "fp16" else "fp16",
                                 torch.float32)


# ---- the collectives -----------------------------------------------------------

SIZES = [1, 13, 1031, 65537, 300_007]  # the last one spans several 1 MiB slices


def _digest(t):
    return hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _inputs(world, seed, n, dtype):
    out = []
    for r in range(world):
        g = torch.Generator()
        g.manual_seed(seed * 1009 + r)
        # Mixed signs and magnitudes (cancellation), within fp16's scaled range.
        out.append(((torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1)
                    * torch.exp2(torch.randint(-6, 7, (n,), generator=g).double())).to(dtype))
    return out


def bound_failure(name, got, ins, op, nodes, fmt, result_rounded=True):
    """docs/COMPRESSED_RAILS.md: |r - S| <= u|S| + (1+u)^2 (u + (N+K) u_in) M
    (no u|S| when the result is not rounded: reduce-scatter).  `ins`: every
    rank's input for the elements of `got`.  A failure line, or None."""
    world = len(ins)
    u = U.get(fmt, 0.0)
    unit_in = 2.0**-24 if got.dtype == torch.float32 else 2.0**-53
    exact = sum(t.double() for t in ins)
    mag = sum(t.double().abs() for t in ins)
    if op == "AVG":
        exact, mag = exact / world, mag / world
    k = world // nodes
    bound = (u * exact.abs() if result_rounded else 0) + (1 + u) ** 2 * (u + (nodes + k) * unit_in) * mag + 1e-300
    err = (got.double() - exact).abs()
    if not bool((err > bound).any()):
        return None
    i = int(torch.argmax(err / bound))
    return f"{name}: error {err[i].item():.3g} > bound {bound[i].item():.3g} at {i} (exact {exact[i].item():.6g})"


def wire_session(rank, world, fmt, nodes):
    """All-reduces and reduce-scatters under FAIRRING_WIRE_DTYPE=fmt (from the
    environment).  Returns digests (compared across ranks by the test) and a
    list of failures of the checks that one rank can make alone."""
    failures, digests = [], {}
    seed = 0
    for dtype in (torch.float32, torch.float64):
        for op in ("SUM", "AVG"):
            for n in SIZES:
                seed += 1
                ins = _inputs(world, seed, n, dtype)
                x = ins[rank].clone()
                dist.all_reduce(x, op=refs.op_of(op))
                name = f"all_reduce {dtype} {op} n={n}"
                digests[name] = _digest(x)
                if nodes == 1:
                    # No rails: the option changes nothing.  Two ranks: one rounding.
                    want = ins[0] + ins[1]
                    want = want / world if op == "AVG" else want
                    if not torch.equal(x, want):
                        failures.append(f"{name}: single node result differs from the exact float sum")
                    continue
                failure = bound_failure(name, x, ins, op, nodes, fmt)
                if failure:
                    failures.append(failure)
                if fmt == "bf16" and dtype == torch.float32 and op == "SUM":
                    # The result was rounded to bf16 once: every value is a bf16 value.
                    if not torch.equal(x, x.to(torch.bfloat16).float()):
                        failures.append(f"{name}: result is not bf16-rounded (compression not applied?)")
    # Exact for what is not compressed: ints, MAX/MIN.
    for dtype, op in ((torch.int32, "SUM"), (torch.float32, "MAX"), (torch.float32, "MIN"), (torch.int64, "SUM")):
        for n in (13, 65537):
            seed += 1
            ins = [refs.make_input(seed, r, n, dtype, op) for r in range(world)]
            x = ins[rank].clone()
            dist.all_reduce(x, op=refs.op_of(op))
            want = refs.reference(ins, dtype, op)
            if not torch.equal(x, want.to(dtype)):
                failures.append(f"all_reduce {dtype} {op} n={n}: not exact")
    # Reduce-scatter: compressed contributions, the result stays with its rank.
    for dtype in (torch.float32, torch.float64):
        for per_rank in (7, 70_001):
            seed += 1
            ins = _inputs(world, seed, per_rank * world, dtype)
            out = torch.empty(per_rank, dtype=dtype)
            dist.reduce_scatter_tensor(out, ins[rank].clone())
            mine = [t[rank * per_rank:(rank + 1) * per_rank] for t in ins]
            name = f"reduce_scatter {dtype} n={per_rank}"
            failure = bound_failure(name, out, mine, "SUM", nodes, fmt, result_rounded=False)
            if failure:
                failures.append(failure)
            exact = sum(t.double() for t in mine)
            if nodes > 1 and fmt != "none" and bool((out.double() == exact).all()) and per_rank > 1000:
                failures.append(f"{name}: exact (compression not applied?)")
    return {"failures": failures, "digests": digests}


# Small slices and two slots: many slices per op, so every per-slot wire
# buffer is reused while others are in flight.
SMALL = {"FAIRRING_SLICE_SIZE": "64K", "FAIRRING_PARALLELISM": "2", "FAIRRING_TOTAL_MEMORY": "4M"}
# (topology in tests/topologies.py, wire dtype, more environment)
CASES = [("1x2", "bf16", {}), ("2x1", "bf16", {}), ("2x2", "bf16", {}), ("3x1", "bf16", {}), ("2x2", "fp16", {}),
         ("3x1", "fp16", {}), ("2x2", "bf16", SMALL)]


def assert_session_ok(res):
    """wire_session's results: no rank's own check failed, and every rank
    has rank 0's bits."""
    problems = [f"rank {r.rank}: {f}" for r in res for f in r.value["failures"]]
    first = res[0].value["digests"]
    for r in res[1:]:
        diff = [k for k in first if r.value["digests"][k] != first[k]]
        if diff:
            problems.append(f"rank {r.rank}: bits differ from rank 0 in {diff[:5]}")
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize("topo,fmt,env", CASES, ids=[f"{t}-{f}" + ("-small-slices" if e else "") for t, f, e in CASES])
def test_compressed_collectives(topo, fmt, env):
    ids = node_ids(topo)
    res = launch.run_ranks(wire_session, ids, args=(fmt, len(set(ids))), env={"FAIRRING_WIRE_DTYPE": fmt, **env},
                           timeout_s=150)
    assert_session_ok(res)


def test_mismatched_wire_dtype_fails_group_creation():
    """One rank with FAIRRING_WIRE_DTYPE=bf16, the others with the default:
    every rank fails group creation, naming the variable and the other rank."""
    # Each rank finds the settings differ (a ValueError on every rank, as for
    # any setting of its own).
    test_errors._init_fails_everywhere(node_ids("2x1"), 1, "FAIRRING_WIRE_DTYPE", "bf16", others_type="ValueError")


def test_option_parsing():
    from fairring_py.options import Options, resolve

    assert resolve(environ={}).wire_dtype == "none"
    assert resolve(environ={"FAIRRING_WIRE_DTYPE": " BF16 "}).wire_dtype == "bf16"
    assert resolve(Options(wire_dtype="fp16"), environ={"FAIRRING_WIRE_DTYPE": "bf16"}).wire_dtype == "fp16"
    with pytest.raises(ValueError, match="FAIRRING_WIRE_DTYPE must be one of none, bf16, fp16"):
        resolve(environ={"FAIRRING_WIRE_DTYPE": "fp8"})
    with pytest.raises(ValueError, match="Options.wire_dtype"):
        resolve(Options(wire_dtype="float16"), environ={})
