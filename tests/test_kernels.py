"""Tests of the CPU multi-input reduction kernels (csrc/kernels/reduce_cpu*),
through the fairring_py._C._reduce_for_test hook.

References are computed independently with torch ops:
  * exact: the same sequential combine order in the kernel's accumulation type
    (float32 for float16/bfloat16, rounded once at the end; the dtype itself
    otherwise; torch's integer ops wrap like the kernel's);
  * approximate: a float64 reduction, compared with a tolerance.
"""
import pytest
import torch

from fairring_py import _C

OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]
HALF_DTYPES = (torch.float16, torch.bfloat16)
DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}

SMALL_SIZES = [0, 1, 7, 31, 255, 256, 257]
# Around the kernels' block sizes (1024 float64 / 2048 float32 / 8192 byte
# accumulators), so that partial and multiple blocks are covered.
BLOCK_EDGE_SIZES = [1023, 1025, 2049, 8193]
LARGE_SIZE = 1000003
NUM_INPUTS = [1, 2, 3, 5, 8]


def supported(dtype, op):
    if op == "AVG":
        return dtype.is_floating_point
    if op in ("BAND", "BOR", "BXOR"):
        return not dtype.is_floating_point
    return True


SUPPORTED = [(d, o) for d in ALL_DTYPES for o in OPS if supported(d, o)]
UNSUPPORTED = [(d, o) for d in ALL_DTYPES for o in OPS if not supported(d, o)]


def _id(dtype_op):
    dtype, op = dtype_op
    return f"{DTYPE_NAMES[dtype]}-{op}"


# ---------------------------------------------------------------- data


def make_input(dtype, op, size, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, (size,), generator=gen).bool()
    if dtype.is_floating_point:
        gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        if op == "PRODUCT":
            # Magnitudes around 1 so that 8-way products neither overflow nor
            # underflow, random signs.
            mag = torch.rand(size, generator=gen, dtype=gen_dtype) + 0.5
            sign = torch.randint(0, 2, (size,), generator=gen, dtype=torch.int8) * 2 - 1
            return (mag * sign).to(dtype)
        x = torch.randn(size, generator=gen, dtype=gen_dtype)
        if dtype in HALF_DTYPES:
            # Span subnormal to large magnitudes, so that rounding on the way
            # back covers normal, subnormal and (fp16) overflow cases.
            exp = torch.randint(-26, 12, (size,), generator=gen, dtype=torch.int32)
            x = torch.ldexp(x, exp)
        else:
            x = x * 100
        return x.to(dtype)
    info = torch.iinfo(dtype)
    if op == "PRODUCT":
        lo, hi = (-4, 5) if info.min < 0 else (0, 6)  # small: wraps, but not to 0
    else:
        lo, hi = info.min, info.max  # the full range: SUM wraps around
    return torch.randint(lo, hi, (size,), generator=gen, dtype=dtype)


def make_inputs(dtype, op, n, size, seed):
    gen = torch.Generator().manual_seed(seed)
    return [make_input(dtype, op, size, gen) for _ in range(n)]


# ----------------------------------------------------------- references


def acc_dtype(dtype):
    return torch.float32 if dtype in HALF_DTYPES else dtype


def combine(op, a, b):
    if a.dtype == torch.bool:
        if op in ("SUM", "MAX", "BOR"):
            return torch.logical_or(a, b)
        if op in ("PRODUCT", "MIN", "BAND"):
            return torch.logical_and(a, b)
        return torch.logical_xor(a, b)
    return {
        "SUM": torch.add,
        "AVG": torch.add,
        "PRODUCT": torch.mul,
        "MIN": torch.minimum,
        "MAX": torch.maximum,
        "BAND": torch.bitwise_and,
        "BOR": torch.bitwise_or,
        "BXOR": torch.bitwise_xor,
    }[op](a, b)


def exact_reference(op, inputs, divisor):
    """Same order, same accumulation type, one rounding: bit-exact."""
    dtype = inputs[0].dtype
    acc = inputs[0].to(acc_dtype(dtype))
    for x in inputs[1:]:
        acc = combine(op, acc, x.to(acc.dtype))
    if divisor > 0:
        # Divide by a tensor: an IEEE division per element, like the kernel.
        acc = acc / torch.full_like(acc, divisor)
    return acc.to(dtype)


def float64_reference(op, inputs, divisor):
    acc = inputs[0].double()
    for x in inputs[1:]:
        acc = combine(op, acc, x.double())
    if divisor > 0:
        acc = acc / divisor
    return acc


def as_bits(t):
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(view[t.element_size()]) if t.is_floating_point() else t


def assert_bitwise_equal(actual, expected, op):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if not actual.is_floating_point():
        assert torch.equal(actual, expected)
        return
    if torch.equal(as_bits(actual), as_bits(expected)):
        return
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    assert torch.equal(nan_a, nan_e), "NaN positions differ"
    keep = ~nan_a
    if op in ("MIN", "MAX"):
        # Compare values: min/max of +0 and -0 may pick either zero.
        assert torch.equal(actual[keep], expected[keep])
    else:
        assert torch.equal(as_bits(actual[keep]), as_bits(expected[keep]))


def assert_close_to_float64(actual, inputs, op, divisor):
    ref = float64_reference(op, inputs, divisor)
    dtype = actual.dtype
    scale = ref.abs()
    if op in ("SUM", "AVG"):
        # Cancellation: allow the float32/float64 accumulation error relative
        # to the sum of magnitudes, plus one rounding to the storage type.
        mags = inputs[0].double().abs()
        for x in inputs[1:]:
            mags += x.double().abs()
        scale += mags / divisor if divisor > 0 else mags
    rel = {
        torch.float64: 1e-12,
        torch.float32: 1e-5,
        torch.float16: 2.0**-10,
        torch.bfloat16: 2.0**-7,
    }[dtype]
    tiny = {torch.float16: 2.0**-24, torch.bfloat16: 1e-38}.get(dtype, 0.0)
    # Only where the result is finite in the storage type.
    skip = ~torch.isfinite(ref) | ref.abs().ge(torch.finfo(dtype).max)
    err = (actual.double() - ref).abs()
    ok = err.le(scale.mul_(rel).add_(tiny)) | skip
    assert bool(ok.all()), f"{int((~ok).sum())} elements off the float64 reference"


def run(out, inputs, op, divisor=0):
    _C._reduce_for_test(out, inputs, op, divisor)
    return out


def divisors_for(dtype, op):
    if not dtype.is_floating_point:
        return [0]
    return [0, 3] if op == "AVG" else [0]


def check_case(dtype, op, n, size, seed, float64_check=True):
    inputs = make_inputs(dtype, op, n, size, seed)
    for divisor in divisors_for(dtype, op):
        out = torch.empty(size, dtype=dtype)
        run(out, inputs, op, divisor)
        assert_bitwise_equal(out, exact_reference(op, inputs, divisor), op)
        if dtype.is_floating_point and size > 0 and float64_check:
            assert_close_to_float64(out, inputs, op, divisor)


# ---------------------------------------------------------------- tests


def test_hook_exists():
    assert hasattr(_C, "_reduce_for_test")
    assert _C._reduce_isa_for_test() in ("avx2", "generic")


@pytest.mark.parametrize("dtype_op", SUPPORTED, ids=_id)
def test_matches_reference(dtype_op):
    dtype, op = dtype_op
    seed = 1000 * ALL_DTYPES.index(dtype) + OPS.index(op)
    for size in SMALL_SIZES:
        for n in NUM_INPUTS:
            check_case(dtype, op, n, size, seed + 7 * size + n)
    for size in BLOCK_EDGE_SIZES:
        for n in (2, 5):
            check_case(dtype, op, n, size, seed + 7 * size + n)
    # (The float64 comparison, slow at this size, runs on the sizes above and
    # in test_large_float32_sum.)
    check_case(dtype, op, 3, LARGE_SIZE, seed, float64_check=False)


@pytest.mark.parametrize("n", NUM_INPUTS)
def test_large_float32_sum(n):
    check_case(torch.float32, "SUM", n, LARGE_SIZE, 77 + n)


def test_integer_wraparound():
    for dtype in INT_DTYPES:
        info = torch.iinfo(dtype)
        big = torch.full((300,), info.max, dtype=dtype)
        small = torch.full((300,), info.min, dtype=dtype)
        one = torch.ones(300, dtype=dtype)
        two = torch.full((300,), 2, dtype=dtype)
        out = torch.empty(300, dtype=dtype)
        run(out, [big, one], "SUM")
        assert torch.equal(out, torch.full_like(out, info.min))  # max + 1 wraps to min
        run(out, [small, big, one, one], "SUM")
        assert torch.equal(out, torch.add(torch.add(torch.add(small, big), one), one))
        run(out, [big, two], "PRODUCT")
        assert torch.equal(out, torch.mul(big, two))
        assert torch.equal(out, torch.full_like(out, -2 if info.min < 0 else info.max - 1))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("op", ["MIN", "MAX", "SUM", "PRODUCT"])
def test_nan_propagation(dtype, op):
    size = 1000
    gen = torch.Generator().manual_seed(5)
    for n in (2, 3, 5, 8):
        inputs = make_inputs(dtype, op, n, size, 11 + n)
        for k, x in enumerate(inputs):
            mask = torch.rand(size, generator=gen) < 0.05
            x[mask] = float("nan")
            x[k] = float("nan")  # each input has at least one NaN of its own
        any_nan = torch.stack([torch.isnan(x) for x in inputs]).any(0)
        out = run(torch.empty(size, dtype=dtype), inputs, op)
        assert torch.equal(torch.isnan(out), any_nan)
        assert_bitwise_equal(out, exact_reference(op, inputs, 0), op)
    # NaN against +-inf: still NaN, in either position.
    nan = torch.full((9,), float("nan"), dtype=dtype)
    inf = torch.full((9,), float("inf"), dtype=dtype)
    for pair in ([nan, inf], [inf, nan], [-inf, nan], [nan, -inf]):
        out = run(torch.empty(9, dtype=dtype), pair, op)
        assert bool(torch.isnan(out).all())


def available_isas():
    """The kernel builds this machine can run ('generic', and 'avx2' if any)."""
    isas = ["generic"]
    try:
        _C._reduce_isa_for_test("avx2")
        isas.append("avx2")
    except RuntimeError:
        pass
    finally:
        _C._reduce_isa_for_test("auto")
    return isas


def run_with_isa(isa, out, inputs, op, divisor=0):
    try:
        assert _C._reduce_isa_for_test(isa) == isa
        return run(out, inputs, op, divisor)
    finally:
        _C._reduce_isa_for_test("auto")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_half_conversions_all_bit_patterns(dtype):
    # 65533 elements: not a multiple of the vector width, so the scalar tails
    # are covered as well.
    bits = torch.arange(-(2**15), 2**15 - 3, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    y = x.flip(0).clone()
    for isa in available_isas():
        # Every 16-bit pattern goes through the float32 path (divisor 1 forces
        # the convert / divide / round trip): exact except that NaNs stay NaN.
        out = run_with_isa(isa, torch.empty_like(x), [x], "AVG", 1)
        assert_bitwise_equal(out, x.clone(), "SUM")
        # Sums and quotients of all patterns: rounding float32 -> half
        # (normal, subnormal, overflow to inf, ties to even) matches torch's.
        for divisor in (0, 3, 7):
            out = run_with_isa(isa, torch.empty_like(x), [x, y], "AVG", divisor)
            assert_bitwise_equal(out, exact_reference("SUM", [x, y], divisor), "SUM")
        for op in ("PRODUCT", "MIN", "MAX"):
            out = run_with_isa(isa, torch.empty_like(x), [x, y, x], op)
            assert_bitwise_equal(out, exact_reference(op, [x, y, x], 0), op)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("op", ["SUM", "AVG", "PRODUCT", "MIN", "MAX"])
def test_half_isas_agree_on_all_bit_patterns(dtype, op):
    # NaN payloads included: every build must give the same bits.
    bits = torch.arange(-(2**15), 2**15 - 3, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    inputs = [x, x.flip(0).clone(), x.roll(12345)]
    divisor = 3 if op == "AVG" else 0
    results = [
        as_bits(run_with_isa(isa, torch.empty_like(x), inputs, op, divisor))
        for isa in available_isas()
    ]
    for r in results[1:]:
        assert torch.equal(r, results[0])


@pytest.mark.parametrize("dtype_op", SUPPORTED, ids=_id)
def test_in_place(dtype_op):
    dtype, op = dtype_op
    for n in (1, 3, 8):
        for pos in sorted({0, n // 2, n - 1}):
            for size in (0, 255, 2500):
                inputs = make_inputs(dtype, op, n, size, 123 + n + pos)
                for divisor in divisors_for(dtype, op):
                    expected = exact_reference(op, inputs, divisor)
                    work = [x.clone() for x in inputs]
                    out = work[pos]
                    run(out, work, op, divisor)
                    assert_bitwise_equal(out, expected, op)
                    for k in range(n):  # the other inputs are untouched
                        if k != pos:
                            assert_bitwise_equal(work[k], inputs[k], "SUM")


@pytest.mark.parametrize("dtype_op", SUPPORTED, ids=_id)
def test_deterministic_and_isa_independent(dtype_op):
    dtype, op = dtype_op
    size = 20011
    inputs = make_inputs(dtype, op, 5, size, 99)
    if dtype.is_floating_point:
        inputs[2][::97] = float("nan")
        inputs[3][::89] = float("inf")
    divisor = 3 if op == "AVG" else 0
    first = run(torch.empty(size, dtype=dtype), inputs, op, divisor)
    second = run(torch.empty(size, dtype=dtype), inputs, op, divisor)
    assert torch.equal(as_bits(first), as_bits(second))
    # The generic build and the AVX2 build give the same bits.
    for isa in available_isas():
        again = run_with_isa(isa, torch.empty(size, dtype=dtype), inputs, op, divisor)
        assert torch.equal(as_bits(first), as_bits(again)), isa


@pytest.mark.parametrize("dtype_op", UNSUPPORTED, ids=_id)
def test_unsupported_combinations_raise(dtype_op):
    dtype, op = dtype_op
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(RuntimeError) as info:
        run(torch.empty(4, dtype=dtype), [x, x], op)
    msg = str(info.value)
    assert op in msg and DTYPE_NAMES[dtype] in msg, msg
    if op == "AVG":
        assert "floating-point" in msg
    else:
        assert "integer or bool" in msg


@pytest.mark.parametrize("dtype,name", [(torch.complex64, "complex64"), (torch.uint16, "uint16")])
def test_unsupported_dtypes_raise(dtype, name):
    x = torch.zeros(4, dtype=dtype)
    for op in OPS:
        with pytest.raises(RuntimeError, match=f"dtype {name} is not supported"):
            run(torch.empty(4, dtype=dtype), [x, x], op)


def test_divisor_rejected_for_integers():
    x = torch.ones(4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="int32"):
        run(torch.empty(4, dtype=torch.int32), [x, x], "SUM", 2)


def test_bad_arguments():
    x = torch.ones(8)
    with pytest.raises(ValueError, match="unknown reduction op"):
        run(torch.empty(8), [x, x], "MEAN")
    with pytest.raises(ValueError, match="at least one input"):
        run(torch.empty(8), [], "SUM")
    with pytest.raises(ValueError, match="contiguous"):
        run(torch.empty(8), [torch.ones(16)[::2], x], "SUM")
    with pytest.raises(ValueError, match="dtype"):
        run(torch.empty(8), [x, x.double()], "SUM")
    with pytest.raises(ValueError, match="elements"):
        run(torch.empty(8), [x, torch.ones(9)], "SUM")
    base = torch.ones(16)
    with pytest.raises(ValueError, match="overlap"):
        run(base[1:9], [base[0:8], x], "SUM")
    # Lower-case op names are accepted.
    out = run(torch.empty(8), [x, x], "sum")
    assert torch.equal(out, torch.full((8,), 2.0))


# ---- NaNs: the CUDA kernels' rule (kernels/nan_rule.h) against the CPU's ----

def _nan_cases(dtype):
    """Pairs (a, b) whose sum or product is a NaN in every way one can be:
    a NaN operand (signs, payloads, quiet or signalling) on either side or
    both, and invalid operations on numbers (inf - inf, 0 x inf)."""
    if dtype == torch.float32:
        bits, int_t = [0x7FC00000, 0xFFC00000 - (1 << 32), 0x7FC12345, 0xFFA00001 - (1 << 32), 0x7F800001], torch.int32
    else:
        bits, int_t = [0x7FF8000000000000, -0x0008000000000000, 0x7FF8000012345678, -0x000FFFFFFFFFFFFF,
                       0x7FF0000000000001], torch.int64
    def bits_of(values):
        return torch.tensor(values, dtype=dtype).view(int_t).tolist()

    nums = bits_of([0.0, -0.0, 1.5, -2.25, float("inf"), float("-inf")])
    inf, ninf, zero, nzero = bits_of([float("inf"), float("-inf"), 0.0, -0.0])
    nans = bits
    pairs = [(n, x) for n in nans for x in nums] + [(x, n) for n in nans for x in nums]
    pairs += [(n, m) for n in nans for m in nans]
    pairs += [(inf, ninf), (ninf, inf), (zero, inf), (nzero, inf), (ninf, nzero), (inf, zero)] + [(x, y) for x in nums
                                                                                                for y in nums]
    # Built from bits: a signalling NaN must not go through a Python float.
    a = torch.tensor([p[0] for p in pairs], dtype=int_t).view(dtype)
    b = torch.tensor([p[1] for p in pairs], dtype=int_t).view(dtype)
    return a, b


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "product"])
@pytest.mark.parametrize("isa", ["generic", "auto"])
def test_device_nan_rule_gives_the_cpu_kernels_nans(dtype, op, isa):
    """The CUDA kernels' sum and product return a GPU's canonical NaN, fixed
    up by nan_rule::like_x86; that must give the CPU kernel's bits for every
    NaN case, two inputs and three with AVG's division (a GPU said 0x7FFFFFFF
    where the CPU keeps the operand's sign and payload, or says 0xFFC00000)."""
    _C._reduce_isa_for_test(isa)
    try:
        a, b = _nan_cases(dtype)
        c = torch.full_like(a, 3.0)
        for inputs, divisor in (([a, b], 0), ([a, b, c], 3), ([b, a], 0)):
            cpu = torch.empty_like(a)
            _C._reduce_for_test(cpu, inputs, op, divisor)
            dev = _C._device_nan_rule_for_test(inputs, op, divisor)
            assert torch.isnan(cpu).sum() > len(a) // 3, "the cases are meant to give NaNs"
            wrong = (_bits(cpu) != _bits(dev)).nonzero().flatten().tolist()
            assert not wrong, [(inputs[0][i].item(), inputs[1][i].item(), hex(_bits(cpu)[i].item()),
                                hex(_bits(dev)[i].item())) for i in wrong[:8]]
    finally:
        _C._reduce_isa_for_test("auto")


def _half_of(f32):
    """float32 -> float16 as the kernels round (a NaN becomes 0x7E00 with its
    sign; torch's own conversions do not keep a NaN's sign)."""
    h = f32.half().view(torch.int16).clone()
    sign = (f32.view(torch.int32) < 0).to(torch.int16) * -32768
    return torch.where(torch.isnan(f32), sign | 0x7E00, h)


def test_device_nan_rule_for_half_precision():
    """float16 PRODUCT of -inf and -0.0: the CPU kernel says 0xFE00 (x86's
    negative default NaN, rounded); a GPU's canonical NaN would round to
    0x7E00.  The device computes halves in float32, so the rule in float32
    then rounded must give the CPU kernel's half."""
    a16 = torch.tensor([-1024, 31744, 32256, -512], dtype=torch.int16).view(torch.float16)  # -inf inf nan -nan
    b16 = torch.tensor([-32768, -1024, 15360, 16384], dtype=torch.int16).view(torch.float16)  # -0 -inf 1 2
    a32 = torch.tensor([0xFF800000 - (1 << 32), 0x7F800000, 0x7FC00000, 0xFFC00000 - (1 << 32)],
                       dtype=torch.int32).view(torch.float32)
    b32 = b16.float()  # no NaN among them: exact
    for op in ("product", "sum"):
        cpu = torch.empty_like(a16)
        _C._reduce_for_test(cpu, [a16, b16], op, 0)
        dev = _half_of(_C._device_nan_rule_for_test([a32, b32], op, 0))
        assert cpu.view(torch.int16).tolist() == dev.tolist(), (op, cpu.view(torch.int16), dev)
    cpu = torch.empty_like(a16)
    _C._reduce_for_test(cpu, [a16, b16], "product", 0)
    assert cpu.view(torch.int16)[0].item() == -512  # 0xFE00
