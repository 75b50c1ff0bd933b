// What an all-reduce call's tensors become for the engines (CPU and CUDA
// alike): one contiguous buffer reduced in place, and the caller's tensors
// to copy the result back into when the buffer is not the tensor itself.
// The checks a user's tensors must pass live here, once.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "common/reduce_op.h"

namespace fairring {

struct ReduceInput {
  at::Tensor buffer;              // contiguous
  std::vector<at::Tensor> users;  // empty when `buffer` is the caller's tensor
  c10::ScalarType dtype;          // as the kernels see it (complex travels as its real type)
  int64_t numel = 0;              // elements of `dtype`
  // Copies the caller's tensors into `buffer` when it is not one of them
  // (null otherwise): the op's stage (pipeline_op.h), which runs it when
  // the issue order allows, not necessarily at the call.
  std::function<void()> fill;
  // The caller's tensors read where they are, one block each (a blockwise
  // collective's list of one tensor per rank: PipelineOp::input_blocks);
  // `buffer` is then the first of them, for its dtype and device only.
  std::vector<at::Tensor> blocks;
};

// A tensor whose memory is its values, in order (contiguous, no conjugate or
// negative bit): a collective can read or write it directly.
bool plain_tensor(const at::Tensor& t);

// `tensors`: one tensor, or several of one dtype and device flattened into
// one buffer.  Throws a c10::Error that names the problem for what cannot be
// reduced: elements that share memory (expanded or overlapping views),
// mixed dtypes, an op the dtype does not support.
// `kind` names the collective in the errors.
// `as_blocks`: several plain tensors are kept as `blocks` instead of being
// copied into one buffer (unless `copy`).
ReduceInput prepare_reduce_input(const std::vector<at::Tensor>& tensors, RedOp op, const char* kind = "all_reduce",
                                 bool copy = false, bool as_blocks = false);
// The same checks and buffer, for a collective that only moves the data.
// `copy`: `buffer` is always a copy, never the caller's tensor (the op
// changes it, but must only read the caller's).
ReduceInput prepare_input(const std::vector<at::Tensor>& tensors, const char* kind, bool copy = false,
                          bool as_blocks = false);

// The op's stage (pipeline_op.h): `in.fill`, then `scale` (PREMUL_SUM's
// factor, or null) applied to the buffer in place.
std::function<void()> stage_of(const ReduceInput& in, std::function<void(at::Tensor&)> scale);

}  // namespace fairring
