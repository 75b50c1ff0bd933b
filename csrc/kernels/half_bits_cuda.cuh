// Device helpers shared by the CUDA kernels (reduce_cuda.cu, convert_cuda.cu):
// the element-wise pieces of the reductions and the float16 / bfloat16
// conversions, the CPU kernels' own (kernels/reduce_ops.h, compiled here for
// the device), and the grid size of a grid-stride launch.  Only for nvcc.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/host_device.h"
#include "kernels/nan_rule.h"

namespace fairring {
namespace cuda_bits {

#include "kernels/reduce_ops.h"

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
