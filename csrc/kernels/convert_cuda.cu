// Compressed rail messages on the device: float32 / float64 <-> bfloat16 /
// float16 with a power-of-two scale, and fp16's scale from a max-abs pass.
//
// Same bits as the CPU kernels (kernels/convert_impl.h), which is why this
// is more than a cast:
//  - the scale is applied with one IEEE multiply (_rn intrinsics: no
//    contraction), exact wherever it matters (a power of two);
//  - GPU arithmetic returns the canonical NaN 0x7FFFFFFF for any NaN operand,
//    where x86 keeps the NaN's sign and payload (quieted): NaNs skip the
//    multiply and are quieted by hand (the half conversions then keep only
//    the sign, as on the CPU);
//  - float64 is rounded to float32 toward zero with the sticky bit set
//    ("round to odd", as convert_impl.h's f64_to_f32_odd), then to the
//    wire format: rounded once, correctly;
//  - the exponent comes from the bits of the largest finite |x| (integer
//    max: the order of non-negative floats), then wire_format.h's helper.
// Grid-stride loops, int64 indices.  Must not be compiled with
// --use_fast_math (flush-to-zero would change subnormals).

#include "kernels/convert_cuda.h"

#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/half_bits_cuda.cuh"

namespace fairring {
namespace {

using namespace cuda_bits;
using u64 = unsigned long long;  // atomicMax's and __shfl_down_sync's 64-bit type

constexpr int kThreads = 256;

// ---- Per element -------------------------------------------------------------

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
__device__ __forceinline__ float quiet_nan<float>() { return __uint_as_float(0x7FC00000u); }
template <>
__device__ __forceinline__ double quiet_nan<double>() { return __longlong_as_double(0x7FF8000000000000ll); }

// ---- The kernels ----------------------------------------------------------------

__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

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

// *max_bits = max(*max_bits, largest finite |src[i]|'s bits): a warp's max,
// then one atomic per warp.  `max_bits` starts at 0 (memset).
template <typename T>
__global__ void __launch_bounds__(kThreads) max_abs_kernel(const T* src, int64_t n, Bits<T>* max_bits) {
  Bits<T> m = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const Bits<T> a = abs_bits(src[i]);
    m = a < inf_bits(T()) && a > m ? a : m;
  }
  for (int off = 16; off > 0; off >>= 1) {  // every lane gets here: no early return above
    const Bits<T> other = __shfl_down_sync(0xFFFFFFFFu, m, off);
    m = other > m ? other : m;
  }
  if ((threadIdx.x & 31u) == 0 && m != 0) atomicMax(max_bits, m);
}

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

// One thread: the prefix, over the bytes the max-abs pass left (fp16) or
// with exponent 0 (bf16).
template <typename T>
__global__ void prefix_kernel(wire::Prefix* prefix, HalfFormat fmt) {
  int e = 0;
  if (fmt == HalfFormat::kFloat16) {
    const Bits<T> m = *reinterpret_cast<const Bits<T>*>(prefix);
    e = m == 0 ? 0 : wire::fp16_scale_exp_for_exp2(frexp_exp(m));
  }
  *prefix = wire::Prefix{wire::tag_of(fmt), e};
}

// The exponent: the message's prefix, or `fixed_exp` without one.
template <typename T, bool kFp16>
__global__ void __launch_bounds__(kThreads)
    narrow_kernel(const T* src, uint16_t* dst, int64_t n, const wire::Prefix* prefix, int fixed_exp) {
  const T scale = pow2<T>(prefix ? prefix->scale_exp : fixed_exp);
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = narrow_one(src[i], scale, kFp16);
}

// A prefix that is not this format's gives NaNs (see convert_cuda.h).
template <typename T, bool kFp16>
__global__ void __launch_bounds__(kThreads)
    widen_kernel(const uint16_t* src, T* dst, int64_t n, const wire::Prefix* prefix, int fixed_exp) {
  int e = fixed_exp;
  if (prefix) {
    const wire::Prefix p = *prefix;
    if (!wire::prefix_ok(p, kFp16 ? HalfFormat::kFloat16 : HalfFormat::kBFloat16)) {
      for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = quiet_nan<T>();
      return;
    }
    e = p.scale_exp;
  }
  const T inv_scale = pow2<T>(-e);
  for (int64_t i = first_index(); i < n; i += grid_stride()) widen_one(src[i], inv_scale, kFp16, dst + i);
}

// ---- Launches --------------------------------------------------------------------

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, what, ": kernel launch failed: ", cudaGetErrorString(err));
}

void check_dtype(c10::ScalarType dtype, const char* what) {
  TORCH_CHECK(dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Double, what,
              ": float32 or float64 only, got ", c10::toString(dtype));
}

// Kernel launches by element type and format (run's arguments are the kernel's).
template <typename T, bool kFp16>
struct Narrow {
  static void run(const void* src, uint16_t* dst, int64_t n, const wire::Prefix* prefix, int e, cudaStream_t s) {
    narrow_kernel<T, kFp16><<<launch_blocks(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(src), dst, n,
                                                                           prefix, e);
  }
};

template <typename T, bool kFp16>
struct Widen {
  static void run(const uint16_t* src, void* dst, int64_t n, const wire::Prefix* prefix, int e, cudaStream_t s) {
    widen_kernel<T, kFp16><<<launch_blocks(n, kThreads), kThreads, 0, s>>>(src, static_cast<T*>(dst), n, prefix, e);
  }
};

template <template <typename, bool> class Launch, typename... Args>
void dispatch(c10::ScalarType dtype, HalfFormat fmt, Args... args) {
  const bool fp16 = fmt == HalfFormat::kFloat16;
  if (dtype == c10::ScalarType::Double) {
    fp16 ? Launch<double, true>::run(args...) : Launch<double, false>::run(args...);
  } else {
    fp16 ? Launch<float, true>::run(args...) : Launch<float, false>::run(args...);
  }
}

template <typename T>
void write_prefix(HalfFormat fmt, const T* src, int64_t count, wire::Prefix* prefix, cudaStream_t s) {
  if (fmt == HalfFormat::kFloat16) {
    const cudaError_t err = cudaMemsetAsync(prefix, 0, sizeof(wire::Prefix), s);
    TORCH_CHECK(err == cudaSuccess, "wire_encode_cuda: cudaMemsetAsync failed: ", cudaGetErrorString(err));
    if (count > 0) {
      max_abs_kernel<T><<<launch_blocks(count, kThreads), kThreads, 0, s>>>(src, count,
                                                                              reinterpret_cast<Bits<T>*>(prefix));
    }
  }
  prefix_kernel<T><<<1, 1, 0, s>>>(prefix, fmt);
}

void check_message(const void* msg, const char* what) {
  TORCH_CHECK(msg != nullptr && reinterpret_cast<uintptr_t>(msg) % alignof(uint64_t) == 0, what,
              ": the message must be 8-byte aligned device memory");
}

uint16_t* elements_of(void* msg) { return reinterpret_cast<uint16_t*>(static_cast<char*>(msg) + wire::kPrefixBytes); }

}  // namespace

void wire_encode_cuda(HalfFormat fmt, c10::ScalarType dtype, const void* src, int64_t count, void* dst,
                      cudaStream_t stream) {
  check_dtype(dtype, "wire_encode_cuda");
  check_message(dst, "wire_encode_cuda");
  TORCH_CHECK(count >= 0 && (count == 0 || src != nullptr), "wire_encode_cuda: bad source");
  auto* prefix = static_cast<wire::Prefix*>(dst);
  const wire::Prefix* scale_from = prefix;
  if (dtype == c10::ScalarType::Double) {
    write_prefix(fmt, static_cast<const double*>(src), count, prefix, stream);
  } else {
    write_prefix(fmt, static_cast<const float*>(src), count, prefix, stream);
  }
  if (count > 0) dispatch<Narrow>(dtype, fmt, src, elements_of(dst), count, scale_from, 0, stream);
  check_launch("wire_encode_cuda");
}

void wire_decode_cuda(HalfFormat fmt, c10::ScalarType dtype, const void* src, int64_t count, void* dst,
                      cudaStream_t stream) {
  check_dtype(dtype, "wire_decode_cuda");
  check_message(src, "wire_decode_cuda");
  TORCH_CHECK(count >= 0 && (count == 0 || dst != nullptr), "wire_decode_cuda: bad destination");
  if (count == 0) return;
  const uint16_t* elements = elements_of(const_cast<void*>(src));
  dispatch<Widen>(dtype, fmt, elements, dst, count, static_cast<const wire::Prefix*>(src), 0, stream);
  check_launch("wire_decode_cuda");
}

void narrow_cuda(c10::ScalarType src_dtype, HalfFormat fmt, const void* src, uint16_t* dst, int64_t n,
                 int scale_exp, cudaStream_t stream) {
  check_dtype(src_dtype, "narrow_cuda");
  TORCH_CHECK(scale_exp >= -wire::kMaxScaleExp && scale_exp <= wire::kMaxScaleExp, "narrow_cuda: |scale_exp| > ",
              wire::kMaxScaleExp);
  if (n <= 0) return;
  dispatch<Narrow>(src_dtype, fmt, src, dst, n, static_cast<const wire::Prefix*>(nullptr), scale_exp, stream);
  check_launch("narrow_cuda");
}

void widen_cuda(c10::ScalarType dst_dtype, HalfFormat fmt, const uint16_t* src, void* dst, int64_t n, int scale_exp,
                cudaStream_t stream) {
  check_dtype(dst_dtype, "widen_cuda");
  TORCH_CHECK(scale_exp >= -wire::kMaxScaleExp && scale_exp <= wire::kMaxScaleExp, "widen_cuda: |scale_exp| > ",
              wire::kMaxScaleExp);
  if (n <= 0) return;
  dispatch<Widen>(dst_dtype, fmt, src, dst, n, static_cast<const wire::Prefix*>(nullptr), scale_exp, stream);
  check_launch("widen_cuda");
}

}  // namespace fairring
