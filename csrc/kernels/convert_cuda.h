// The compressed rail message (kernels/wire_format.h) on a CUDA device, for
// the NCCL rail (rails/cuda_rails.*): the same bytes as WireCodec's
// encode / decode on the host (the same prefix, the same element bits as
// narrow_cpu / widen_cpu).  Everything is enqueued on `stream`; nothing
// waits on the host.  Only declared when the extension is built with CUDA
// (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/ScalarType.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/wire_format.h"

namespace fairring {

// Writes the message of `count` elements of `dtype` (float32 / float64) at
// `src` to `dst` (8 + 2 * count bytes of device memory, 8-byte aligned).
// fp16: a max-abs pass accumulates into the prefix's bytes, one thread turns
// that into the prefix (wire::fp16_scale_exp_for_exp2), and the conversion
// reads its exponent from there.
void wire_encode_cuda(HalfFormat fmt, c10::ScalarType dtype, const void* src, int64_t count, void* dst,
                      cudaStream_t stream);

// Widens the message at `src` (8-byte aligned) into `count` elements of
// `dtype` at `dst`.  A prefix that is not `fmt`'s cannot be reported from the
// device: every element becomes NaN instead (ranks that passed group
// creation's settings check never send one).
void wire_decode_cuda(HalfFormat fmt, c10::ScalarType dtype, const void* src, int64_t count, void* dst,
                      cudaStream_t stream);

// The element conversions alone, with a given exponent (narrow_cpu /
// widen_cpu's contract; for tests).
void narrow_cuda(c10::ScalarType src_dtype, HalfFormat fmt, const void* src, uint16_t* dst, int64_t n, int scale_exp,
                 cudaStream_t stream);
void widen_cuda(c10::ScalarType dst_dtype, HalfFormat fmt, const uint16_t* src, void* dst, int64_t n, int scale_exp,
                cudaStream_t stream);

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
