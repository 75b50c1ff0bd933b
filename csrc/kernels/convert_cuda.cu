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
// Those steps are in wire_elem_cuda.cuh.  Grid-stride loops, int64 indices.
// Must not be compiled with --use_fast_math (flush-to-zero would change
// subnormals).

#include "kernels/convert_cuda.h"

#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/half_bits_cuda.cuh"
#include "kernels/wire_elem_cuda.cuh"

namespace fairring {
namespace {

using namespace cuda_bits;

constexpr int kThreads = 256;

// ---- The kernels ----------------------------------------------------------------

__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

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

// One thread: the prefix, over the bytes the max-abs pass left (fp16) or
// with exponent 0 (bf16).
template <typename T>
__global__ void prefix_kernel(wire::Prefix* prefix, HalfFormat fmt) {
  const int e = fmt == HalfFormat::kFloat16 ? fp16_scale_exp_of_bits(*reinterpret_cast<const Bits<T>*>(prefix)) : 0;
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
    narrow_kernel<T, kFp16>
        <<<launch_blocks(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(src), dst, n, prefix, e);
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
      max_abs_kernel<T>
          <<<launch_blocks(count, kThreads), kThreads, 0, s>>>(src, count, reinterpret_cast<Bits<T>*>(prefix));
    }
  }
  prefix_kernel<T><<<1, 1, 0, s>>>(prefix, fmt);
}

void check_message(const void* msg, const char* what) {
  TORCH_CHECK(msg != nullptr && reinterpret_cast<uintptr_t>(msg) % alignof(uint64_t) == 0, what,
              ": the message must be 8-byte aligned device memory");
}

void check_scale(int scale_exp, const char* what) {
  TORCH_CHECK(scale_exp >= -wire::kMaxScaleExp && scale_exp <= wire::kMaxScaleExp, what, ": |scale_exp| > ",
              wire::kMaxScaleExp);
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

void narrow_cuda(c10::ScalarType src_dtype, HalfFormat fmt, const void* src, uint16_t* dst, int64_t n, int scale_exp,
                 cudaStream_t stream) {
  check_dtype(src_dtype, "narrow_cuda");
  check_scale(scale_exp, "narrow_cuda");
  if (n <= 0) return;
  dispatch<Narrow>(src_dtype, fmt, src, dst, n, static_cast<const wire::Prefix*>(nullptr), scale_exp, stream);
  check_launch("narrow_cuda");
}

void widen_cuda(c10::ScalarType dst_dtype, HalfFormat fmt, const uint16_t* src, void* dst, int64_t n, int scale_exp,
                cudaStream_t stream) {
  check_dtype(dst_dtype, "widen_cuda");
  check_scale(scale_exp, "widen_cuda");
  if (n <= 0) return;
  dispatch<Widen>(dst_dtype, fmt, src, dst, n, static_cast<const wire::Prefix*>(nullptr), scale_exp, stream);
  check_launch("widen_cuda");
}

}  // namespace fairring
