"""The CUDA multi-input reduction kernel (csrc/kernels/reduce_cuda.cu), through
fairring_py._C._reduce_cuda_for_test, on random data of odd sizes, every
dtype and op: the result must be the same bits as the CPU kernel's (same
combine order, same conversions) and within tolerance of a float64 / exact
reference.  Skipped without a GPU or a CUDA build."""
import pytest
import torch

import refs
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
def test_bad_arguments_are_clear_errors():
    a = torch.ones(8, device="cuda")
    with pytest.raises(ValueError, match="BAND"):
        _C._reduce_cuda_for_test(a, [a, a], "BAND", 0)
    with pytest.raises(ValueError, match="dtype and size"):
        _C._reduce_cuda_for_test(a, [a, torch.ones(9, device="cuda")], "SUM", 0)
    with pytest.raises(ValueError, match="CUDA"):
        _C._reduce_cuda_for_test(torch.ones(8), [torch.ones(8)], "SUM", 0)


@pytest.mark.skipif(BUILT_WITH_CUDA, reason="checks the CPU-only build")
def test_cpu_only_build_says_so():
    assert _C._built_with_cuda() is False
    with pytest.raises(RuntimeError, match="built without CUDA"):
        _C._reduce_cuda_for_test(torch.ones(1), [torch.ones(1)], "SUM", 0)
