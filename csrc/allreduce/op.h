// One all-reduce as the schedule sees it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "common/dtype_name.h"
#include "common/reduce_op.h"

namespace fairring {

struct AllreduceOp {
  uint64_t seq = 0;       // issue order on the process group, from 0 (set by Engine::submit)
  at::Tensor buffer;      // contiguous tensor reduced in place
  // The caller's tensors when they are not `buffer` itself (non-contiguous,
  // or several flattened into it): the result is copied back into them, in
  // order, at the end.
  std::vector<at::Tensor> users;
  c10::ScalarType dtype = c10::ScalarType::Float;
  RedOp op = RedOp::kSum;
  int64_t numel = 0;
  // Called once with nullptr on success: from the engine's thread, or from
  // the issuing thread when the group had already failed.  Must be quick and
  // must not block (it marks the Work done).
  std::function<void(std::exception_ptr)> on_complete;
  // Then called once from the engine's completion thread, in completion
  // order.  May block: future callbacks (DDP comm hooks, user code) run here,
  // off the pipeline, so they cannot stall the slices of other ops.
  std::function<void(std::exception_ptr)> after_complete;
};

// "1000 elements of float32 with SUM", for error messages.  Complex tensors
// travel as their real view (twice the elements).
inline std::string describe(int64_t numel, int32_t dtype, int32_t op) {
  return std::to_string(numel) + " elements of " + dtype_name(static_cast<c10::ScalarType>(dtype)) +
      " with " + redop_name(static_cast<RedOp>(op));
}

}  // namespace fairring
