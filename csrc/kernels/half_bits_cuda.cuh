// Device helpers shared by the CUDA kernels (reduce_cuda.cu, convert_cuda.cu):
// the float16 / bfloat16 <-> float32 conversions, bit-exact ports of the CPU
// ones (kernels/reduce_impl.h: round to nearest even, canonical NaNs), and
// the grid size of a grid-stride launch.  Only for nvcc.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace fairring {
namespace cuda_bits {

__device__ __forceinline__ uint32_t mask_if(bool c) { return 0u - static_cast<uint32_t>(c); }

__device__ __forceinline__ uint32_t select_bits(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// IEEE binary16 -> binary32, exact; NaNs made quiet.
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (static_cast<uint32_t>(h) >> 10) & 0x1Fu;
  const uint32_t m = static_cast<uint32_t>(h) & 0x3FFu;
  const uint32_t normal = ((e + 112u) << 23) | (m << 13);
  const uint32_t inf_nan = 0x7F800000u | (m << 13) | (mask_if(m != 0u) & 0x00400000u);
  const uint32_t subnormal = __float_as_uint(__fmul_rn(__uint2float_rn(m), 0x1p-24f));
  const uint32_t mag = select_bits(mask_if(e == 0u), subnormal, select_bits(mask_if(e == 31u), inf_nan, normal));
  return __uint_as_float(sign | mag);
}

// binary32 -> binary16, round to nearest even, overflow to +-inf, NaN ->
// 0x7E00 with the input's sign.
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  const uint32_t normal = (ax + 0x0FFFu + ((ax >> 13) & 1u) - (112u << 23)) >> 13;
  const float magic = __fadd_rn(__fmul_rn(__uint_as_float(ax), 0x1p24f), 0x1p23f);
  const uint32_t subnormal = __float_as_uint(magic) - 0x4B000000u;
  const uint32_t mag = select_bits(
      mask_if(ax > 0x7F800000u), 0x7E00u,
      select_bits(mask_if(ax >= 0x477FF000u), 0x7C00u, select_bits(mask_if(ax >= 0x38800000u), normal, subnormal)));
  return static_cast<uint16_t>(sign | mag);
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// binary32 -> bfloat16, round to nearest even; NaN -> 0x7FC0.
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(select_bits(mask_if((x & 0x7FFFFFFFu) > 0x7F800000u), 0x7FC0u, rounded));
}

// Blocks to launch for `work_items` items of `threads` threads: enough to
// fill every SM several times over (grid-stride loops do the rest), no more
// than the work needs.
inline int launch_blocks(int64_t work_items, int threads) {
  static std::atomic<int> sms_of[64];  // per device; 0 = not queried yet
  int device = 0;
  cudaGetDevice(&device);
  int sms = device >= 0 && device < 64 ? sms_of[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 1;
    if (device >= 0 && device < 64) sms_of[device].store(sms, std::memory_order_relaxed);
  }
  const int64_t wanted = (work_items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * (2048 / threads);
  return static_cast<int>(wanted < 1 ? 1 : (wanted < cap ? wanted : cap));
}

}  // namespace cuda_bits
}  // namespace fairring
