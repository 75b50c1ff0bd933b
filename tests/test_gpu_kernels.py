"""The CUDA multi-input reduction kernel (csrc/kernels/reduce_cuda.cu), through
fairring_py._C._reduce_cuda_for_test, on random data of odd sizes, every
dtype and op: the result must be the same bits as the CPU kernel's (same
combine order, same conversions) and within tolerance of a float64 / exact
reference.  And the wire conversions of compressed rails
(csrc/kernels/convert_cuda.cu): the same bits as the CPU ones.  Skipped
without a GPU or a CUDA build."""
import pytest
import torch

import refs
import test_kernels
import test_wire_dtype
from gpu_support import BUILT_WITH_CUDA, requires_gpu
from fairring_py import _C

DTYPES = refs.FLOAT_DTYPES + refs.INT_DTYPES + [torch.bool]
CASES = [(d, op) for d in DTYPES for op in refs.ops_for(d)]
SIZES = [1, 2, 7, 13, 127, 1031, 4099, 65537, 1_000_003]
NUM_INPUTS = [1, 2, 3, 5, 8]


def _bits(t):
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype == torch.bool else t.view(-1).view(torch.uint8)


def _run(dtype, op, n, k, seed, offset=0, in_place=False):
    """GPU and CPU kernel results for k random inputs of n elements.  `offset`
    shifts every buffer by that many elements (unaligned pointers)."""
    inputs = [refs.make_input(seed, r, n, dtype, op) for r in range(k)]
    divisor = k if op == "AVG" else 0
    cpu_out = torch.empty_like(inputs[0])
    _C._reduce_for_test(cpu_out, inputs, op, divisor)

    def on_gpu(t):
        buf = torch.zeros(n + offset, dtype=dtype, device="cuda")
        buf[offset:] = t.cuda()
        return buf[offset:]

    g_in = [on_gpu(t) for t in inputs]
    g_out = g_in[0] if in_place else on_gpu(torch.zeros(n, dtype=dtype))
    _C._reduce_cuda_for_test(g_out, g_in, op, divisor)
    torch.cuda.synchronize()
    return inputs, cpu_out, g_out.cpu()


@requires_gpu
@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{refs.dtype_name(d)}-{o}" for d, o in CASES])
def test_matches_cpu_kernel_and_reference(dtype, op):
    for si, n in enumerate(SIZES):
        for k in NUM_INPUTS if n < 100_000 else [2, 8]:
            inputs, cpu_out, gpu_out = _run(dtype, op, n, k, seed=1000 * si + k)
            assert torch.equal(_bits(gpu_out), _bits(cpu_out)), f"n={n} k={k}: GPU bits differ from the CPU kernel"
            ref = refs.reference(inputs, dtype, op)
            err = refs.compare(gpu_out, inputs, ref, dtype, op)
            assert err is None, f"n={n} k={k}: {err}"


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8])
@pytest.mark.parametrize("offset", [1, 3])
def test_unaligned_buffers_take_the_scalar_path(dtype, offset):
    for n in [1, 17, 4099, 65537]:
        inputs, cpu_out, gpu_out = _run(dtype, "SUM", n, 3, seed=n + offset, offset=offset)
        assert torch.equal(_bits(gpu_out), _bits(cpu_out)), f"n={n} offset={offset}"


@requires_gpu
@pytest.mark.parametrize("dtype,op", [(torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int32, "BXOR")])
def test_in_place(dtype, op):
    inputs, cpu_out, gpu_out = _run(dtype, op, 65537, 4, seed=5, in_place=True)
    assert torch.equal(_bits(gpu_out), _bits(cpu_out))


@requires_gpu
def test_many_inputs():
    # More inputs than the kernel's unroll, as a node of many ranks has.
    inputs, cpu_out, gpu_out = _run(torch.float32, "SUM", 10007, 37, seed=9)
    assert torch.equal(_bits(gpu_out), _bits(cpu_out))


@requires_gpu
def test_half_nan_and_inf_bits_match_cpu():
    vals = torch.tensor([float("nan"), float("inf"), -float("inf"), 65504.0, 6e-8, -0.0, 1.0, 2.0] * 3)
    for dtype in (torch.float16, torch.bfloat16):
        a = vals.to(dtype)
        b = vals.flip(0).to(dtype)
        for op in ("SUM", "MAX", "MIN", "PRODUCT"):
            cpu_out = torch.empty_like(a)
            _C._reduce_for_test(cpu_out, [a, b], op, 0)
            g = torch.empty_like(a, device="cuda")
            _C._reduce_cuda_for_test(g, [a.cuda(), b.cuda()], op, 0)
            assert torch.equal(_bits(g.cpu()), _bits(cpu_out)), f"{dtype} {op}"


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "AVG"])
def test_float_nan_bits_match_cpu(dtype, op):
    """Every way a sum, product or AVG can give a NaN (test_kernels._nan_cases:
    NaN operands of both signs and several payloads, signalling ones, inf -
    inf, 0 x inf): the GPU kernel's bits are the CPU kernel's (nan_rule.h)."""
    a, b = test_kernels._nan_cases(dtype)
    c = torch.full_like(a, 3.0)
    for inputs in ([a, b], [b, a], [a, b, c]):
        divisor = len(inputs) if op == "AVG" else 0
        cpu_out = torch.empty_like(a)
        _C._reduce_for_test(cpu_out, inputs, op, divisor)
        g = torch.empty_like(a, device="cuda")
        _C._reduce_cuda_for_test(g, [t.cuda() for t in inputs], op, divisor)
        torch.cuda.synchronize()
        wrong = (_bits(g.cpu()).view(-1) != _bits(cpu_out).view(-1)).sum().item()
        assert wrong == 0, f"{dtype} {op} with {len(inputs)} inputs: {wrong} bytes differ from the CPU kernel"


@requires_gpu
def test_bad_arguments_are_clear_errors():
    a = torch.ones(8, device="cuda")
    with pytest.raises(ValueError, match="BAND"):
        _C._reduce_cuda_for_test(a, [a, a], "BAND", 0)
    with pytest.raises(ValueError, match="dtype and size"):
        _C._reduce_cuda_for_test(a, [a, torch.ones(9, device="cuda")], "SUM", 0)
    with pytest.raises(ValueError, match="CUDA"):
        _C._reduce_cuda_for_test(torch.ones(8), [torch.ones(8)], "SUM", 0)


# ---- the wire conversions of compressed rails (csrc/kernels/convert_cuda.cu) ----
# The NCCL rail's codec must write and read the very bytes the CPU codec does
# (the TCP rails, and Fairring's CPU all-reduce in the same group): compared
# bit for bit with the CPU hooks, NaNs included.

WIRE_FORMATS = ["bf16", "fp16"]
SCALES = [0, -7, 5, 20, 120, -120]


def _raw(t):
    return t.contiguous().view(-1).view(torch.uint8)


def _hex(bits16):
    return [hex(v & 0xFFFF) for v in bits16.tolist()]


@requires_gpu
@pytest.mark.parametrize("fmt", WIRE_FORMATS)
def test_wire_narrow_matches_cpu(fmt):
    x = test_wire_dtype._special_f32()
    for src in (x, x.double(), x.double() * (1 + 2.0**-30)):  # the last: float64 between float32 values
        for e in SCALES:
            want = _C._wire_narrow_for_test(src, fmt, e)
            got = _C._wire_narrow_cuda_for_test(src.cuda(), fmt, e).cpu()
            bad = got != want
            assert not bool(bad.any()), (
                f"{src.dtype} e={e}: {int(bad.sum())} differ, e.g. inputs {src[bad][:4].tolist()} "
                f"got {_hex(got[bad][:4])} want {_hex(want[bad][:4])}")
    # Misaligned start, odd length.
    tail = _C._wire_narrow_cuda_for_test(x.cuda()[3:1000], fmt).cpu()
    assert torch.equal(tail, _C._wire_narrow_for_test(x[3:1000], fmt))


@requires_gpu
@pytest.mark.parametrize("fmt", WIRE_FORMATS)
def test_wire_widen_every_pattern_matches_cpu(fmt):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    for dtype in (torch.float32, torch.float64):
        for e in SCALES:
            want = _C._wire_widen_for_test(bits, fmt, dtype, e)
            got = _C._wire_widen_cuda_for_test(bits.cuda(), fmt, dtype, e).cpu()
            same = (_raw(got).view(-1, got.element_size()) == _raw(want).view(-1, want.element_size())).all(1)
            assert bool(same.all()), (f"{fmt}->{dtype} e={e}: {int((~same).sum())} patterns differ, e.g. "
                                      f"{_hex(bits[~same][:4])}")


@requires_gpu
@pytest.mark.parametrize("fmt", WIRE_FORMATS)
def test_wire_message_matches_cpu(fmt):
    """Whole messages: the prefix (fp16's exponent from the device's max-abs
    pass) and the elements, and their decoding."""
    cases = test_wire_dtype.wire_messages()
    cases["large"] = torch.randn(3_000_017) * torch.exp2(torch.randint(-20, 20, (3_000_017,)).float())
    cases["large"][1_234_567] = 3.0e30  # one maximum far from the rest: every block's share must count
    for name, x in cases.items():
        want = _C._wire_encode_for_test(x, fmt)
        got = _C._wire_encode_cuda_for_test(x.cuda(), fmt).cpu()
        prefix = test_wire_dtype._prefix
        assert torch.equal(got[:8], want[:8]), f"{name}: prefix {prefix(got)} != {prefix(want)}"
        assert torch.equal(got, want), f"{name}: elements differ"
        back = _C._wire_decode_cuda_for_test(want.cuda(), fmt, x.dtype).cpu()
        assert torch.equal(_raw(back), _raw(_C._wire_decode_for_test(want, fmt, x.dtype))), f"{name}: decode differs"


@requires_gpu
def test_wire_decode_of_a_foreign_message_gives_nans():
    msg = _C._wire_encode_cuda_for_test(torch.ones(5, device="cuda"), "fp16")
    out = _C._wire_decode_cuda_for_test(msg, "bf16", torch.float32)
    assert bool(torch.isnan(out).all())


@pytest.mark.skipif(BUILT_WITH_CUDA, reason="checks the CPU-only build")
def test_cpu_only_build_says_so():
    assert _C._built_with_cuda() is False
    with pytest.raises(RuntimeError, match="built without CUDA"):
        _C._reduce_cuda_for_test(torch.ones(1), [torch.ones(1)], "SUM", 0)
    with pytest.raises(RuntimeError, match="built without CUDA"):
        _C._wire_encode_cuda_for_test(torch.ones(1), "bf16")
