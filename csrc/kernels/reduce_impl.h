// The multi-input reduction kernels, as plain C++ loops written so that GCC
// auto-vectorises them.
//
// NOT a normal header: it has no include guard and includes nothing but
// reduce_ops.h (the element-wise pieces, shared with the CUDA kernels), which
// is written the same way.  A translation unit includes it *inside its own
// namespace* after including <cstdint>, <cstring>, <type_traits>, <utility>,
// <c10/core/ScalarType.h>, "common/reduce_op.h", "kernels/host_device.h" and
// "kernels/nan_rule.h" itself (and <immintrin.h> if it defines
// FAIRRING_REDUCE_IMPL_F16C), so that each instruction set (the baseline
// build in reduce_cpu.cpp, the AVX2 build in reduce_cpu_avx2.cpp) gets its own
// copy of these templates under its own mangled names (no ODR clash between
// the two instantiations).  It defines, in the enclosing namespace:
//
//   void reduce_impl(c10::ScalarType dtype, ::fairring::RedOp op, void* out,
//                    const void* const* inputs, int num_inputs, int64_t count,
//                    int64_t divisor);
//
// which assumes the (dtype, op, divisor) combination was validated by the
// caller (reduce_cpu).
//
// Every variant computes bit-identical results: the combine order is fixed
// (in[0], in[1], ..., in[n-1]), each step is a single IEEE operation (no
// contraction, no reassociation), and the half-precision conversions are
// exact / round to nearest even with canonical NaNs whether done with bit
// manipulation or F16C.

namespace detail {

// Bytes of accumulator per block: small enough to stay in L1 while every
// input streams through it, large enough to amortise the per-block overhead.
constexpr int64_t kBlockBytes = 8192;

// The conversions, the *Cvt types and the Op* types, shared with the CUDA
// kernels.
#include "kernels/reduce_ops.h"

#if defined(FAIRRING_REDUCE_IMPL_F16C)
constexpr bool kHaveF16C = true;
#else
constexpr bool kHaveF16C = false;
#endif

// ---- The blocked kernels ------------------------------------------------------
//
// The inputs are processed in blocks of kBlockBytes of accumulator.  Per
// block, up to kGroup inputs are combined in one fused pass (each element
// loaded, combined in order, and written once), so that n <= kGroup inputs
// take a single pass straight into `out`, and more inputs go through the
// local accumulator `acc`: acc = in[0..3], acc = acc (op) in[4..7], ..., and
// the last group's pass writes `out`.  Streaming all of a group's inputs
// together keeps the hardware prefetchers busy; longer groups gained little
// (~5% for 8 inputs) and cost compile time.  (Beware loop shapes GCC can
// unroll-and-jam at -O3: a perfect nest of an inner j loop inside a k loop
// over inputs got jammed into a scalar loop, 2x slower.)
//
// `out` may be exactly one of the inputs: it is only written by the last pass
// over a block, after every input's elements of that block were read, and
// each element is read before it is written in the same iteration, so the
// loop has no loop-carried dependence; FAIRRING_IVDEP tells the vectoriser
// so, instead of it adding a runtime overlap check that an in-place call
// would fail (and run scalar).  `acc` is a local array, aliasing nothing.

#ifndef FAIRRING_IVDEP
#if defined(__clang__)
#define FAIRRING_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define FAIRRING_IVDEP _Pragma("GCC ivdep")
#else
#define FAIRRING_IVDEP
#endif
#endif

constexpr int kGroup = 4;

// v (op) load(x), or v unchanged when !kApply (the group's first element
// when it starts the accumulation).
template <bool kApply, typename Cvt, typename Op>
inline typename Cvt::Acc step(typename Cvt::Acc v, typename Cvt::Storage x) {
  if constexpr (kApply) {
    return Op::apply(v, Cvt::load(x));
  } else {
    return v;
  }
}

// Elements [begin, len) of a fused pass, one at a time in plain C++ (GCC
// vectorises it): v = acc[j] (kFromAcc) or load(p[0][j]), combined with
// load(p[i][j]) for the rest of the group in order; the result goes to
// acc[j], or, if kToOut, to out[j] (divided first if kDivide).
template <typename Cvt, typename Op, bool kFromAcc, bool kToOut, bool kDivide, size_t... I>
inline void scalar_pass(typename Cvt::Acc* acc, typename Cvt::Storage* out, const typename Cvt::Storage* const* p,
                        int64_t begin, int64_t len, typename Cvt::Acc div, std::index_sequence<I...>) {
  using S = typename Cvt::Storage;
  using A = typename Cvt::Acc;
  const S* const q[sizeof...(I)] = {p[I]...};
  if constexpr (kToOut) {
    FAIRRING_IVDEP
    for (int64_t j = begin; j < len; ++j) {
      A v;
      if constexpr (kFromAcc) {
        v = acc[j];
      } else {
        v = Cvt::load(q[0][j]);
      }
      ((v = step < kFromAcc || I != 0, Cvt, Op > (v, q[I][j])), ...);
      if constexpr (kDivide) {
        out[j] = Cvt::store(divide(v, div));
      } else {
        out[j] = Cvt::store(v);
      }
    }
  } else {
    for (int64_t j = begin; j < len; ++j) {
      A v;
      if constexpr (kFromAcc) {
        v = acc[j];
      } else {
        v = Cvt::load(q[0][j]);
      }
      ((v = step < kFromAcc || I != 0, Cvt, Op > (v, q[I][j])), ...);
      acc[j] = v;
    }
  }
}

#if defined(FAIRRING_REDUCE_IMPL_F16C)
// float16 with F16C: the fused pass below on 8 floats at a time, with vector
// versions of the operations that give exactly the scalar Op::apply results
// (min/max: same comparisons and NaN rule, selected with blends).
inline __m256 f16c_load(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void f16c_store(uint16_t* p, __m256 v) {
  // Any NaN -> the quiet NaN with its sign, which rounds to 0x7E00 | sign
  // like f32_to_f16 (F16C alone would keep the top payload bits).
  const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m256 canonical =
      _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
  v = _mm256_blendv_ps(v, canonical, is_nan);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

inline __m256 vec_apply(OpSum, __m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 vec_apply(OpProduct, __m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
inline __m256 vec_apply(OpMin, __m256 a, __m256 b) {  // b != b ? b : (b < a ? b : a)
  const __m256 r = _mm256_blendv_ps(a, b, _mm256_cmp_ps(b, a, _CMP_LT_OQ));
  return _mm256_blendv_ps(r, b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
}
inline __m256 vec_apply(OpMax, __m256 a, __m256 b) {  // b != b ? b : (a < b ? b : a)
  const __m256 r = _mm256_blendv_ps(a, b, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  return _mm256_blendv_ps(r, b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
}

template <bool kApply, typename Op>
inline __m256 vec_step(__m256 v, const uint16_t* x) {
  if constexpr (kApply) {
    return vec_apply(Op{}, v, f16c_load(x));
  } else {
    return v;
  }
}

template <typename Op, bool kFromAcc, bool kToOut, bool kDivide, size_t... I>
inline void f16c_fused_pass(float* acc, uint16_t* out, const uint16_t* const* p, int64_t len, float div,
                            std::index_sequence<I...>) {
  const uint16_t* const q[sizeof...(I)] = {p[I]...};
  const __m256 vdiv = _mm256_set1_ps(div);
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    __m256 v;
    if constexpr (kFromAcc) {
      v = _mm256_load_ps(acc + j);
    } else {
      v = f16c_load(q[0] + j);
    }
    ((v = vec_step < kFromAcc || I != 0, Op > (v, q[I] + j)), ...);
    if constexpr (kToOut) {
      if constexpr (kDivide) {
        v = _mm256_div_ps(v, vdiv);
      }
      f16c_store(out + j, v);  // after every load of these 8 elements
    } else {
      _mm256_store_ps(acc + j, v);
    }
  }
  // The last < 8 elements, same results.
  scalar_pass<HalfCvt, Op, kFromAcc, kToOut, kDivide>(acc, out, p, j, len, div, std::index_sequence<I...>());
}
#endif  // FAIRRING_REDUCE_IMPL_F16C

// One pass over a block: v = acc[j] (kFromAcc) or load(p[0][j]), combined
// with load(p[i][j]) for the rest of the group in order; the result goes to
// acc[j], or, if kToOut, to out[j] (divided first if kDivide).
template <typename Cvt, typename Op, bool kFromAcc, bool kToOut, bool kDivide, size_t... I>
inline void fused_pass(typename Cvt::Acc* acc, typename Cvt::Storage* out, const typename Cvt::Storage* const* p,
                       int64_t len, typename Cvt::Acc div, std::index_sequence<I...>) {
#if defined(FAIRRING_REDUCE_IMPL_F16C)
  if constexpr (std::is_same_v<Cvt, HalfCvt>) {
    f16c_fused_pass<Op, kFromAcc, kToOut, kDivide>(acc, out, p, len, div, std::index_sequence<I...>());
    return;
  }
#endif
  scalar_pass<Cvt, Op, kFromAcc, kToOut, kDivide>(acc, out, p, 0, len, div, std::index_sequence<I...>());
}

// fused_pass over `g` (1..kGroup) inputs, chosen at run time.
template <typename Cvt, typename Op, bool kFromAcc, bool kDivide>
inline void group_pass(int g, bool to_out, typename Cvt::Acc* acc, typename Cvt::Storage* out,
                       const typename Cvt::Storage* const* p, int64_t len, typename Cvt::Acc div) {
  static_assert(kGroup == 4, "group_pass handles groups of 1..4");
#define FAIRRING_GROUP_CASE(G)                                                                             \
  case G:                                                                                                  \
    if (to_out) {                                                                                          \
      fused_pass<Cvt, Op, kFromAcc, true, kDivide>(acc, out, p, len, div, std::make_index_sequence<G>());  \
    } else {                                                                                               \
      fused_pass<Cvt, Op, kFromAcc, false, kDivide>(acc, out, p, len, div, std::make_index_sequence<G>()); \
    }                                                                                                      \
    return;
  switch (g) {
    FAIRRING_GROUP_CASE(1)
    FAIRRING_GROUP_CASE(2)
    FAIRRING_GROUP_CASE(3)
    FAIRRING_GROUP_CASE(4)
    default:
      return;
  }
#undef FAIRRING_GROUP_CASE
}

// float16 without F16C: the bit-twiddling conversion is long enough that
// fusing it into the combine loops spills registers, so whole (small) blocks
// are converted at a time instead (kernel_block_convert).  With F16C (the
// AVX2 build) the fused passes convert 8 elements per instruction
// (f16c_fused_pass).  All give the same bits: F16C converts exactly / rounds
// to nearest even like f16_to_f32 / f32_to_f16, and NaNs are made canonical
// before rounding.
template <typename Cvt>
struct BlockConvert : std::false_type {};
template <>
struct BlockConvert<HalfCvt> : std::integral_constant<bool, !kHaveF16C> {
  static void load(float* dst, const uint16_t* src, int64_t len) {
    for (int64_t j = 0; j < len; ++j) dst[j] = f16_to_f32(src[j]);
  }
  static void store(uint16_t* dst, const float* src, int64_t len) {
    for (int64_t j = 0; j < len; ++j) dst[j] = f32_to_f16(src[j]);
  }
};

// For storage types converted a block at a time (float16 without F16C):
// each input's block is converted into `tmp`, then combined into `acc`;
// `acc` is converted into `out` at the end.  The blocks are small so that all
// the input streams advance together (as in the fused passes), which keeps
// the hardware prefetchers busy: 256 elements measured ~2x faster for 8
// inputs than 2048.
template <typename Cvt, typename Op, bool kDivide>
void kernel_block_convert(typename Cvt::Storage* out, const typename Cvt::Storage* const* in, int n, int64_t count,
                          typename Cvt::Acc div) {
  using A = typename Cvt::Acc;
  constexpr int64_t kBlock = 256;
  alignas(64) A acc[kBlock];
  alignas(64) A tmp[kBlock];

  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = count - base < kBlock ? count - base : kBlock;
    BlockConvert<Cvt>::load(acc, in[0] + base, len);
    for (int k = 1; k < n; ++k) {
      BlockConvert<Cvt>::load(tmp, in[k] + base, len);
      for (int64_t j = 0; j < len; ++j) {
        acc[j] = Op::apply(acc[j], tmp[j]);
      }
    }
    if constexpr (kDivide) {
      for (int64_t j = 0; j < len; ++j) {
        acc[j] = divide(acc[j], div);
      }
    }
    BlockConvert<Cvt>::store(out + base, acc, len);
  }
}

template <typename Cvt, typename Op, bool kDivide>
void kernel(typename Cvt::Storage* out, const typename Cvt::Storage* const* in, int n, int64_t count,
            typename Cvt::Acc div) {
  if constexpr (BlockConvert<Cvt>::value) {
    kernel_block_convert<Cvt, Op, kDivide>(out, in, n, count, div);
  } else {
    using S = typename Cvt::Storage;
    using A = typename Cvt::Acc;
    constexpr int64_t kBlock = kBlockBytes / static_cast<int64_t>(sizeof(A));
    alignas(64) A acc[kBlock];

    for (int64_t base = 0; base < count; base += kBlock) {
      const int64_t len = count - base < kBlock ? count - base : kBlock;
      const S* p[kGroup];
      int k = 0;
      while (k < n) {
        const int g = n - k < kGroup ? n - k : kGroup;
        for (int i = 0; i < g; ++i) {
          p[i] = in[k + i] + base;
        }
        const bool last = k + g == n;
        if (k == 0) {
          group_pass<Cvt, Op, false, kDivide>(g, last, acc, out + base, p, len, div);
        } else {
          group_pass<Cvt, Op, true, kDivide>(g, last, acc, out + base, p, len, div);
        }
        k += g;
      }
    }
  }
}

template <typename Cvt, typename Op>
void run(void* out, const void* const* inputs, int n, int64_t count, int64_t divisor) {
  using S = typename Cvt::Storage;
  using A = typename Cvt::Acc;
  S* o = static_cast<S*>(out);
  const S* const* in = reinterpret_cast<const S* const*>(inputs);
  if constexpr (std::is_floating_point_v<A>) {
    if (divisor > 0) {
      kernel<Cvt, Op, true>(o, in, n, count, static_cast<A>(divisor));
      return;
    }
  }
  // Integer types never get a divisor (reduce_cpu rejects it).
  kernel<Cvt, Op, false>(o, in, n, count, A(0));
}

// SUM/AVG/PRODUCT/MIN/MAX for floating-point storage.
template <typename Cvt>
void run_float(::fairring::RedOp op, void* out, const void* const* in, int n, int64_t count, int64_t divisor) {
  switch (op) {
    case ::fairring::RedOp::kSum:
    case ::fairring::RedOp::kAvg:
      return run<Cvt, OpSum>(out, in, n, count, divisor);
    case ::fairring::RedOp::kProduct:
      return run<Cvt, OpProduct>(out, in, n, count, divisor);
    case ::fairring::RedOp::kMin:
      return run<Cvt, OpMin>(out, in, n, count, divisor);
    case ::fairring::RedOp::kMax:
      return run<Cvt, OpMax>(out, in, n, count, divisor);
    default:
      return;  // rejected by the caller
  }
}

// Everything but AVG for integer storage.
template <typename T>
void run_int(::fairring::RedOp op, void* out, const void* const* in, int n, int64_t count) {
  using C = PlainCvt<T>;
  switch (op) {
    case ::fairring::RedOp::kSum:
      return run<C, OpSum>(out, in, n, count, 0);
    case ::fairring::RedOp::kProduct:
      return run<C, OpProduct>(out, in, n, count, 0);
    case ::fairring::RedOp::kMin:
      return run<C, OpMin>(out, in, n, count, 0);
    case ::fairring::RedOp::kMax:
      return run<C, OpMax>(out, in, n, count, 0);
    case ::fairring::RedOp::kBand:
      return run<C, OpAnd>(out, in, n, count, 0);
    case ::fairring::RedOp::kBor:
      return run<C, OpOr>(out, in, n, count, 0);
    case ::fairring::RedOp::kBxor:
      return run<C, OpXor>(out, in, n, count, 0);
    default:
      return;  // rejected by the caller
  }
}

// bool: SUM/MAX/BOR are logical OR, PRODUCT/MIN/BAND logical AND, BXOR XOR.
inline void run_bool(::fairring::RedOp op, void* out, const void* const* in, int n, int64_t count) {
  switch (op) {
    case ::fairring::RedOp::kSum:
    case ::fairring::RedOp::kMax:
    case ::fairring::RedOp::kBor:
      return run<BoolCvt, OpOr>(out, in, n, count, 0);
    case ::fairring::RedOp::kProduct:
    case ::fairring::RedOp::kMin:
    case ::fairring::RedOp::kBand:
      return run<BoolCvt, OpAnd>(out, in, n, count, 0);
    case ::fairring::RedOp::kBxor:
      return run<BoolCvt, OpXor>(out, in, n, count, 0);
    default:
      return;  // rejected by the caller
  }
}

}  // namespace detail

void reduce_impl(c10::ScalarType dtype, ::fairring::RedOp op, void* out, const void* const* inputs, int num_inputs,
                 int64_t count, int64_t divisor) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return detail::run_float<detail::PlainCvt<float>>(op, out, inputs, num_inputs, count, divisor);
    case c10::ScalarType::Double:
      return detail::run_float<detail::PlainCvt<double>>(op, out, inputs, num_inputs, count, divisor);
    case c10::ScalarType::Half:
      return detail::run_float<detail::HalfCvt>(op, out, inputs, num_inputs, count, divisor);
    case c10::ScalarType::BFloat16:
      return detail::run_float<detail::BFloat16Cvt>(op, out, inputs, num_inputs, count, divisor);
    case c10::ScalarType::Char:
      return detail::run_int<int8_t>(op, out, inputs, num_inputs, count);
    case c10::ScalarType::Byte:
      return detail::run_int<uint8_t>(op, out, inputs, num_inputs, count);
    case c10::ScalarType::Short:
      return detail::run_int<int16_t>(op, out, inputs, num_inputs, count);
    case c10::ScalarType::Int:
      return detail::run_int<int32_t>(op, out, inputs, num_inputs, count);
    case c10::ScalarType::Long:
      return detail::run_int<int64_t>(op, out, inputs, num_inputs, count);
    case c10::ScalarType::Bool:
      return detail::run_bool(op, out, inputs, num_inputs, count);
    default:
      return;  // rejected by the caller
  }
}
