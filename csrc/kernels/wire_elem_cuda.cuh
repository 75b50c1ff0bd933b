// The per-element steps of the CUDA wire codec (convert_cuda.cu): scaling,
// float64 -> float32 rounded to odd, half conversions, NaN handling, and the
// exponent of the largest |x| from its bits.  Device functions only (no
// launches), so that tests/test_convert_cuda_emulated.py can also compile
// them on the host against stand-ins for the intrinsics that behave as the
// GPU's do (canonical NaNs from arithmetic, round-toward-zero conversion)
// and compare them with the CPU kernels where no GPU is.
#pragma once

#include <cstdint>

#include "kernels/half_bits_cuda.cuh"
#include "kernels/wire_format.h"

namespace fairring {
namespace cuda_bits {

using u64 = unsigned long long;  // atomicMax's and __shfl_down_sync's 64-bit type

// 2^e, exactly (|e| <= wire::kMaxScaleExp: normal in both types).
template <typename T>
__device__ __forceinline__ T pow2(int e);
template <>
__device__ __forceinline__ float pow2<float>(int e) {
  return __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
}
template <>
__device__ __forceinline__ double pow2<double>(int e) {
  return __longlong_as_double(static_cast<long long>(1023 + e) << 52);
}

__device__ __forceinline__ uint16_t to_half(float v, bool fp16) { return fp16 ? f32_to_f16(v) : f32_to_bf16(v); }

__device__ __forceinline__ uint16_t narrow_one(float x, float scale, bool fp16) {
  return to_half(x != x ? x : __fmul_rn(x, scale), fp16);
}

// float64 -> float32 rounded to odd; a NaN keeps its sign (all the half
// conversions keep of it).
__device__ __forceinline__ float f64_to_f32_odd(double d) {
  if (d != d) {
    return __uint_as_float((static_cast<uint32_t>(static_cast<u64>(__double_as_longlong(d)) >> 32) & 0x80000000u) |
                           0x7FC00000u);
  }
  const float f = __double2float_rz(d);
  return static_cast<double>(f) == d ? f : __uint_as_float(__float_as_uint(f) | 1u);
}

__device__ __forceinline__ uint16_t narrow_one(double x, double scale, bool fp16) {
  return to_half(f64_to_f32_odd(x != x ? x : __dmul_rn(x, scale)), fp16);
}

__device__ __forceinline__ float from_half(uint16_t h, bool fp16) { return fp16 ? f16_to_f32(h) : bf16_to_f32(h); }

// A NaN made quiet, sign and payload kept (what x86's multiply returns).
__device__ __forceinline__ uint32_t quiet_bits(float f) { return __float_as_uint(f) | 0x00400000u; }

__device__ __forceinline__ void widen_one(uint16_t h, float inv_scale, bool fp16, float* out) {
  const float f = from_half(h, fp16);
  *out = f != f ? __uint_as_float(quiet_bits(f)) : __fmul_rn(f, inv_scale);
}

__device__ __forceinline__ void widen_one(uint16_t h, double inv_scale, bool fp16, double* out) {
  const float f = from_half(h, fp16);
  if (f != f) {  // float -> double of a quiet NaN, as x86 does it: the payload moves up 29 bits
    const u64 q = quiet_bits(f);
    *out = __longlong_as_double(
        static_cast<long long>(((q & 0x80000000u) << 32) | 0x7FF0000000000000ull | ((q & 0x7FFFFFu) << 29)));
    return;
  }
  *out = __dmul_rn(static_cast<double>(f), inv_scale);
}

template <typename T>
__device__ __forceinline__ T quiet_nan();
template <>
__device__ __forceinline__ float quiet_nan<float>() {
  return __uint_as_float(0x7FC00000u);
}
template <>
__device__ __forceinline__ double quiet_nan<double>() {
  return __longlong_as_double(0x7FF8000000000000ll);
}

// The bits of |x| and of infinity, as an unsigned integer of x's width.
__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }
__device__ __forceinline__ u64 abs_bits(double x) {
  return static_cast<u64>(__double_as_longlong(x)) & 0x7FFFFFFFFFFFFFFFull;
}
__device__ __forceinline__ uint32_t inf_bits(float) { return 0x7F800000u; }
__device__ __forceinline__ u64 inf_bits(double) { return 0x7FF0000000000000ull; }

template <typename T>
struct BitsOf;
template <>
struct BitsOf<float> {
  using type = uint32_t;
};
template <>
struct BitsOf<double> {
  using type = u64;
};
template <typename T>
using Bits = typename BitsOf<T>::type;

// frexp's exponent of a nonzero finite |x| from its bits: |x| lies in
// [2^(exp2-1), 2^exp2).
__device__ __forceinline__ int frexp_exp(uint32_t a) {
  const int biased = static_cast<int>(a >> 23);
  return biased != 0 ? biased - 126 : (31 - __clz(static_cast<int>(a))) - 148;  // subnormal: a * 2^-149
}
__device__ __forceinline__ int frexp_exp(u64 a) {
  const int biased = static_cast<int>(a >> 52);
  return biased != 0 ? biased - 1022 : (63 - __clzll(static_cast<long long>(a))) - 1073;  // a * 2^-1074
}

// fp16's scale exponent for a message whose largest finite |x| has the bits
// `m` (0: no nonzero finite value), by wire_format.h's rule.
template <typename B>
__device__ __forceinline__ int fp16_scale_exp_of_bits(B m) {
  return m == 0 ? 0 : wire::fp16_scale_exp_for_exp2(frexp_exp(m));
}

}  // namespace cuda_bits
}  // namespace fairring
