// The element-wise pieces of every reduction, one copy for the CPU and the
// CUDA kernels: the float16 / bfloat16 <-> float32 conversions, how each
// dtype is loaded into its accumulator and stored back (the *Cvt types), and
// the operations (the Op* types).  The CPU kernel tests run this very code;
// only the primitive IEEE operations below differ by compiler (host: the
// plain operators; device: the _rn intrinsics, which nvcc cannot contract
// into an FMA, with x86's NaNs, nan_rule.h), so that both give the same bits.
//
// NOT a normal header (like reduce_impl.h): no include guard, includes
// nothing.  It is included *inside a namespace*, after <cstdint>, <cstring>,
// <type_traits>, "kernels/host_device.h" and "kernels/nan_rule.h": by
// reduce_impl.h, once per CPU instruction set (each gets its own mangled
// copy; no ODR clash between the baseline and the AVX2 build), and by
// half_bits_cuda.cuh for the CUDA kernels.
//
// The combine order is fixed by the callers (in[0], in[1], ..., in[n-1]);
// each step here is a single IEEE operation (no contraction, no
// reassociation); the half-precision conversions are exact / round to
// nearest even with canonical NaNs.

// ---- Primitive IEEE operations ------------------------------------------------

FAIRRING_HOST_DEVICE inline uint32_t f32_bits(float f) { return ::fairring::nan_rule::bit_cast<uint32_t>(f); }
FAIRRING_HOST_DEVICE inline float f32_from_bits(uint32_t u) { return ::fairring::nan_rule::bit_cast<float>(u); }

#if defined(__CUDA_ARCH__)
FAIRRING_HOST_DEVICE inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
FAIRRING_HOST_DEVICE inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
FAIRRING_HOST_DEVICE inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
FAIRRING_HOST_DEVICE inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
// The NaN of a sum or product as x86 returns it (a GPU returns one canonical NaN).
template <typename T>
FAIRRING_HOST_DEVICE inline T with_x86_nan(T a, T b, T r) {
  return ::fairring::nan_rule::like_x86(a, b, r);
}
#else
FAIRRING_HOST_DEVICE inline float add_rn(float a, float b) { return a + b; }
FAIRRING_HOST_DEVICE inline double add_rn(double a, double b) { return a + b; }
FAIRRING_HOST_DEVICE inline float mul_rn(float a, float b) { return a * b; }
FAIRRING_HOST_DEVICE inline double mul_rn(double a, double b) { return a * b; }
// The hardware's NaN already is x86's.
template <typename T>
FAIRRING_HOST_DEVICE inline T with_x86_nan(T, T, T r) {
  return r;
}
#endif

// ---- Half-precision conversions ------------------------------------------------

// All-ones if `c`, else zero; and a bitwise select with such a mask.  The
// conversions pick between candidates this way rather than with ?: so that
// GCC sees no control flow it would refuse to if-convert (it will not
// speculate floating-point work out of a branch), and the CPU loops vectorise.
FAIRRING_HOST_DEVICE inline uint32_t mask_if(bool c) { return 0u - static_cast<uint32_t>(c); }

FAIRRING_HOST_DEVICE inline uint32_t select_bits(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// IEEE binary16 -> binary32, exact.
FAIRRING_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (static_cast<uint32_t>(h) >> 10) & 0x1Fu;
  const uint32_t m = static_cast<uint32_t>(h) & 0x3FFu;
  const uint32_t normal = ((e + 112u) << 23) | (m << 13);
  // Inf, or NaN made quiet (as c10 and F16C do).
  const uint32_t inf_nan = 0x7F800000u | (m << 13) | (mask_if(m != 0u) & 0x00400000u);
  // Subnormal: m * 2^-24, exact in float32 (m == 0 gives +0).  Computed for
  // every lane and picked with a mask.
  const uint32_t subnormal = f32_bits(mul_rn(static_cast<float>(static_cast<int32_t>(m)), 0x1p-24f));
  const uint32_t mag = select_bits(mask_if(e == 0u), subnormal, select_bits(mask_if(e == 31u), inf_nan, normal));
  return f32_from_bits(sign | mag);
}

// binary32 -> binary16, round to nearest even; overflow goes to +-inf and any
// NaN becomes the quiet NaN 0x7E00 with the input's sign (as c10::Half does).
FAIRRING_HOST_DEVICE inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  // Normal half (|f| >= 2^-14): drop 13 mantissa bits with RNE and rebias the
  // exponent by 127 - 15 = 112; a mantissa carry rolls into the exponent.
  const uint32_t normal = (ax + 0x0FFFu + ((ax >> 13) & 1u) - (112u << 23)) >> 13;
  // Subnormal half (or zero), |f| < 2^-14: the result is round(|f| * 2^24)
  // (< 2^10).  Scaling by 2^24 is exact; adding 2^23 makes the FPU round the
  // fraction away with round-to-nearest-even, leaving the integer in the low
  // mantissa bits.  (Fusing the two into an FMA gives the same bits, as the
  // product is exact.)  Rounding up to 1024 yields the smallest normal half.
  const float magic = add_rn(mul_rn(f32_from_bits(ax), 0x1p24f), 0x1p23f);
  const uint32_t subnormal = f32_bits(magic) - 0x4B000000u;  // bits of 2^23
  const uint32_t mag = select_bits(
      mask_if(ax > 0x7F800000u), 0x7E00u,
      select_bits(mask_if(ax >= 0x477FF000u), 0x7C00u, select_bits(mask_if(ax >= 0x38800000u), normal, subnormal)));
  return static_cast<uint16_t>(sign | mag);
}

// bfloat16 -> binary32, exact.
FAIRRING_HOST_DEVICE inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// binary32 -> bfloat16, round to nearest even; NaN -> 0x7FC0 (as c10 does).
FAIRRING_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(select_bits(mask_if((x & 0x7FFFFFFFu) > 0x7F800000u), 0x7FC0u, rounded));
}

// ---- Storage <-> accumulator ---------------------------------------------------

template <typename T>
struct PlainCvt {
  using Storage = T;
  using Acc = T;
  FAIRRING_HOST_DEVICE static Acc load(T x) { return x; }
  FAIRRING_HOST_DEVICE static T store(Acc a) { return a; }
};

struct HalfCvt {
  using Storage = uint16_t;
  using Acc = float;
  FAIRRING_HOST_DEVICE static Acc load(uint16_t x) { return f16_to_f32(x); }
  FAIRRING_HOST_DEVICE static uint16_t store(Acc a) { return f32_to_f16(a); }
};

struct BFloat16Cvt {
  using Storage = uint16_t;
  using Acc = float;
  FAIRRING_HOST_DEVICE static Acc load(uint16_t x) { return bf16_to_f32(x); }
  FAIRRING_HOST_DEVICE static uint16_t store(Acc a) { return f32_to_bf16(a); }
};

// bool is one byte holding 0 or 1; normalised anyway so that stray byte
// values still give a 0/1 result.
struct BoolCvt {
  using Storage = uint8_t;
  using Acc = uint8_t;
  FAIRRING_HOST_DEVICE static Acc load(uint8_t x) { return static_cast<uint8_t>(x != 0); }
  FAIRRING_HOST_DEVICE static uint8_t store(Acc a) { return a; }
};

// ---- Operations ------------------------------------------------------------------

// Integer arithmetic is done in the unsigned type of the same width, promoted
// to at least unsigned int so that narrow types never overflow a signed int:
// two's-complement wrap-around without relying on -fwrapv.
template <typename A>
using WideUnsigned = std::conditional_t<(sizeof(A) < sizeof(unsigned int)), unsigned int, std::make_unsigned_t<A>>;

// SUM and PRODUCT: integers wrap around in WideUnsigned; floating point
// rounds to nearest with the x86 NaN rule (nan_rule.h).  F gives both forms
// of its operation.
struct Plus {
  template <typename W>
  FAIRRING_HOST_DEVICE W operator()(W x, W y) const {
    return x + y;
  }
  template <typename A>
  FAIRRING_HOST_DEVICE static A rounded(A a, A b) {
    return add_rn(a, b);
  }
};
struct Times {
  template <typename W>
  FAIRRING_HOST_DEVICE W operator()(W x, W y) const {
    return x * y;
  }
  template <typename A>
  FAIRRING_HOST_DEVICE static A rounded(A a, A b) {
    return mul_rn(a, b);
  }
};

template <typename F>
struct Arithmetic {
  template <typename A>
  FAIRRING_HOST_DEVICE static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      using W = WideUnsigned<A>;
      return static_cast<A>(static_cast<W>(F{}(static_cast<W>(static_cast<std::make_unsigned_t<A>>(a)),
                                               static_cast<W>(static_cast<std::make_unsigned_t<A>>(b)))));
    } else {
      return with_x86_nan(a, b, F::rounded(a, b));
    }
  }
};
using OpSum = Arithmetic<Plus>;
using OpProduct = Arithmetic<Times>;

// torch.minimum / torch.maximum semantics: a NaN in either operand gives NaN.
struct OpMin {
  template <typename A>
  FAIRRING_HOST_DEVICE static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      return b != b ? b : (b < a ? b : a);
    } else {
      return b < a ? b : a;
    }
  }
};

struct OpMax {
  template <typename A>
  FAIRRING_HOST_DEVICE static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      return b != b ? b : (a < b ? b : a);
    } else {
      return a < b ? b : a;
    }
  }
};

struct OpAnd {
  template <typename A>
  FAIRRING_HOST_DEVICE static A apply(A a, A b) {
    return static_cast<A>(a & b);
  }
};

struct OpOr {
  template <typename A>
  FAIRRING_HOST_DEVICE static A apply(A a, A b) {
    return static_cast<A>(a | b);
  }
};

struct OpXor {
  template <typename A>
  FAIRRING_HOST_DEVICE static A apply(A a, A b) {
    return static_cast<A>(a ^ b);
  }
};

// (a / d) in the accumulator type, one IEEE division (AVG).
template <typename A>
FAIRRING_HOST_DEVICE inline A divide(A a, A d) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) return with_x86_nan(a, d, __fdiv_rn(a, d));
  if constexpr (std::is_same_v<A, double>) return with_x86_nan(a, d, __ddiv_rn(a, d));
#endif
  return a / d;
}
