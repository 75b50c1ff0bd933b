// Multi-input element-wise reduction on a CUDA device (reduce_cuda.cu).
// Only declared when the extension is built with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/ScalarType.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/reduce_op.h"

namespace fairring {

// The most inputs one launch combines (the pointers travel as a kernel
// argument); as many as a node may have local ranks.
constexpr int kMaxCudaReduceInputs = 256;

// out[i] = in[0][i] (op) in[1][i] (op) ... (op) in[n-1][i] on `stream`, with the
// same semantics and the same bits as reduce_cpu (kernels/reduce_cpu.h): fixed
// order 0..n-1, one IEEE operation per step (no contraction), float16 and
// bfloat16 accumulated in float32 and rounded once to nearest even, the
// combined value divided by `divisor` if it is > 0 (floating types only).
// Every pointer is device memory the current device can access (local or
// opened through CUDA IPC); `out` may be exactly one of the inputs.  The
// (dtype, op, divisor) combination must have been validated with
// reduce_unsupported_reason.  Asynchronous: returns after the launch, and
// throws (c10::Error) if the launch failed.
void reduce_cuda(c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int num_inputs, int64_t count,
                 int64_t divisor, cudaStream_t stream);

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
