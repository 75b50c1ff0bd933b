// CUDA multi-input reduction: one pass over memory, 16-byte vectorised loads
// and stores when every buffer is 16-byte aligned (with a scalar tail),
// a grid sized from the device's SM count.
//
// The results are the same bits as the CPU kernels (kernels/reduce_impl.h):
// the inputs are combined strictly in order 0..n-1 with the very operations
// and conversions the CPU kernels use (kernels/reduce_ops.h), whose IEEE
// steps are the _rn intrinsics here (so nvcc cannot contract a multiply and
// an add into an FMA) with x86's NaNs.  This
// file must not be compiled with --use_fast_math (flush-to-zero and
// approximate division would change the bits).

#include "kernels/reduce_cuda.h"

#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/half_bits_cuda.cuh"

namespace fairring {
namespace {

using namespace cuda_bits;

// The *Cvt and Op* types and divide(): kernels/reduce_ops.h, shared with the
// CPU kernels (through half_bits_cuda.cuh).

// ---- The kernel -----------------------------------------------------------------

// Passed by value (about 2 KiB, under the 4 KiB kernel-argument limit).
struct Args {
  void* out;
  const void* in[kMaxCudaReduceInputs];
  int n;
  int64_t count;
  double divisor;
};

constexpr int kThreads = 256;
// At least this many blocks per SM (1024 threads; at most 64 registers a
// thread), so that enough loads are in flight to saturate HBM.
constexpr int kMinBlocksPerSm = 4;
constexpr int kInputUnroll = 4;  // loads issued together per thread

template <typename S>
union Vec {
  uint4 raw;
  S s[sizeof(uint4) / sizeof(S)];
};

template <typename Cvt, typename Op, bool kDivide>
__device__ __forceinline__ typename Cvt::Storage finish(typename Cvt::Acc v, typename Cvt::Acc div) {
  if constexpr (kDivide) v = divide(v, div);
  return Cvt::store(v);
}

// kVector: every pointer is 16-byte aligned; whole 16-byte vectors first,
// then the last count % (16 / sizeof(S)) elements one by one.
template <typename Cvt, typename Op, bool kDivide, bool kVector>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) reduce_kernel(const Args args) {
  using S = typename Cvt::Storage;
  using A = typename Cvt::Acc;
  constexpr int kV = sizeof(uint4) / sizeof(S);
  const A div = static_cast<A>(args.divisor);
  const int n = args.n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_from = 0;

  if constexpr (kVector) {
    const int64_t nvec = args.count / kV;
    scalar_from = nvec * kV;
    for (int64_t v = tid; v < nvec; v += stride) {
      Vec<S> x;
      x.raw = reinterpret_cast<const uint4*>(args.in[0])[v];
      A acc[kV];
#pragma unroll
      for (int j = 0; j < kV; ++j) acc[j] = Cvt::load(x.s[j]);
      int i = 1;
      for (; i + kInputUnroll <= n; i += kInputUnroll) {
        Vec<S> y[kInputUnroll];
#pragma unroll
        for (int u = 0; u < kInputUnroll; ++u) y[u].raw = reinterpret_cast<const uint4*>(args.in[i + u])[v];
#pragma unroll
        for (int u = 0; u < kInputUnroll; ++u) {
#pragma unroll
          for (int j = 0; j < kV; ++j) acc[j] = Op::apply(acc[j], Cvt::load(y[u].s[j]));
        }
      }
      for (; i < n; ++i) {
        Vec<S> y;
        y.raw = reinterpret_cast<const uint4*>(args.in[i])[v];
#pragma unroll
        for (int j = 0; j < kV; ++j) acc[j] = Op::apply(acc[j], Cvt::load(y.s[j]));
      }
      Vec<S> o;
#pragma unroll
      for (int j = 0; j < kV; ++j) o.s[j] = finish<Cvt, Op, kDivide>(acc[j], div);
      reinterpret_cast<uint4*>(args.out)[v] = o.raw;
    }
  }

  S* out = static_cast<S*>(args.out);
  for (int64_t e = scalar_from + tid; e < args.count; e += stride) {
    A acc = Cvt::load(static_cast<const S*>(args.in[0])[e]);
    for (int i = 1; i < n; ++i) acc = Op::apply(acc, Cvt::load(static_cast<const S*>(args.in[i])[e]));
    out[e] = finish<Cvt, Op, kDivide>(acc, div);
  }
}

template <typename Cvt, typename Op, bool kDivide>
void launch(const Args& args, cudaStream_t stream) {
  using S = typename Cvt::Storage;
  constexpr int kV = sizeof(uint4) / sizeof(S);
  bool aligned = reinterpret_cast<uintptr_t>(args.out) % sizeof(uint4) == 0;
  for (int i = 0; i < args.n; ++i) aligned = aligned && reinterpret_cast<uintptr_t>(args.in[i]) % sizeof(uint4) == 0;
  if (aligned && args.count >= kV) {
    const int64_t items = args.count / kV + args.count % kV;
    reduce_kernel<Cvt, Op, kDivide, true><<<launch_blocks(items, kThreads), kThreads, 0, stream>>>(args);
  } else {
    reduce_kernel<Cvt, Op, kDivide, false><<<launch_blocks(args.count, kThreads), kThreads, 0, stream>>>(args);
  }
}

template <typename Cvt, typename Op>
void run(const Args& args, cudaStream_t stream) {
  if constexpr (std::is_floating_point<typename Cvt::Acc>::value) {
    if (args.divisor > 0) return launch<Cvt, Op, true>(args, stream);
  }
  launch<Cvt, Op, false>(args, stream);
}

template <typename Cvt>
void run_float(RedOp op, const Args& a, cudaStream_t s) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return run<Cvt, OpSum>(a, s);
    case RedOp::kProduct:
      return run<Cvt, OpProduct>(a, s);
    case RedOp::kMin:
      return run<Cvt, OpMin>(a, s);
    case RedOp::kMax:
      return run<Cvt, OpMax>(a, s);
    default:
      TORCH_CHECK(false, "reduce_cuda: ", redop_name(op), " is not defined for floating-point tensors");
  }
}

template <typename T>
void run_int(RedOp op, const Args& a, cudaStream_t s) {
  using C = PlainCvt<T>;
  switch (op) {
    case RedOp::kSum:
      return run<C, OpSum>(a, s);
    case RedOp::kProduct:
      return run<C, OpProduct>(a, s);
    case RedOp::kMin:
      return run<C, OpMin>(a, s);
    case RedOp::kMax:
      return run<C, OpMax>(a, s);
    case RedOp::kBand:
      return run<C, OpAnd>(a, s);
    case RedOp::kBor:
      return run<C, OpOr>(a, s);
    case RedOp::kBxor:
      return run<C, OpXor>(a, s);
    default:
      TORCH_CHECK(false, "reduce_cuda: ", redop_name(op), " is not defined for integer tensors");
  }
}

// bool: SUM/MAX/BOR are OR, PRODUCT/MIN/BAND are AND, BXOR is XOR.
void run_bool(RedOp op, const Args& a, cudaStream_t s) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kMax:
    case RedOp::kBor:
      return run<BoolCvt, OpOr>(a, s);
    case RedOp::kProduct:
    case RedOp::kMin:
    case RedOp::kBand:
      return run<BoolCvt, OpAnd>(a, s);
    case RedOp::kBxor:
      return run<BoolCvt, OpXor>(a, s);
    default:
      TORCH_CHECK(false, "reduce_cuda: ", redop_name(op), " is not defined for bool tensors");
  }
}

}  // namespace

void reduce_cuda(c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int num_inputs, int64_t count,
                 int64_t divisor, cudaStream_t stream) {
  TORCH_CHECK(num_inputs >= 1 && num_inputs <= kMaxCudaReduceInputs, "reduce_cuda takes 1 to ", kMaxCudaReduceInputs,
              " inputs, got ", num_inputs);
  TORCH_CHECK(count >= 0, "reduce_cuda: negative element count ", count);
  if (count == 0) return;
  TORCH_CHECK(out != nullptr && inputs != nullptr, "reduce_cuda: null buffer");
  // One input and no divisor is a copy: keep its bits exactly, as reduce_cpu does.
  if (num_inputs == 1 && divisor <= 0) {
    if (out != inputs[0]) {
      const cudaError_t err = cudaMemcpyAsync(out, inputs[0], static_cast<size_t>(count) * c10::elementSize(dtype),
                                              cudaMemcpyDeviceToDevice, stream);
      TORCH_CHECK(err == cudaSuccess, "reduce_cuda: copy failed: ", cudaGetErrorString(err));
    }
    return;
  }
  Args args;
  args.out = out;
  args.n = num_inputs;
  args.count = count;
  args.divisor = static_cast<double>(divisor);
  for (int i = 0; i < num_inputs; ++i) {
    TORCH_CHECK(inputs[i] != nullptr, "reduce_cuda: input ", i, " is null");
    args.in[i] = inputs[i];
  }
  for (int i = num_inputs; i < kMaxCudaReduceInputs; ++i) args.in[i] = nullptr;
  switch (dtype) {
    case c10::ScalarType::Float:
      run_float<PlainCvt<float>>(op, args, stream);
      break;
    case c10::ScalarType::Double:
      run_float<PlainCvt<double>>(op, args, stream);
      break;
    case c10::ScalarType::Half:
      run_float<HalfCvt>(op, args, stream);
      break;
    case c10::ScalarType::BFloat16:
      run_float<BFloat16Cvt>(op, args, stream);
      break;
    case c10::ScalarType::Char:
      run_int<int8_t>(op, args, stream);
      break;
    case c10::ScalarType::Byte:
      run_int<uint8_t>(op, args, stream);
      break;
    case c10::ScalarType::Short:
      run_int<int16_t>(op, args, stream);
      break;
    case c10::ScalarType::Int:
      run_int<int32_t>(op, args, stream);
      break;
    case c10::ScalarType::Long:
      run_int<int64_t>(op, args, stream);
      break;
    case c10::ScalarType::Bool:
      run_bool(op, args, stream);
      break;
    default:
      TORCH_CHECK(false, "reduce_cuda: unsupported dtype ", c10::toString(dtype));
  }
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "reduce_cuda: kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace fairring
