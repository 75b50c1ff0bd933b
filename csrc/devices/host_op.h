// One collective of CPU tensors as the host engine sees it.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <functional>
#include <vector>

#include "pipeline/pipeline_op.h"

namespace fairring {

struct HostOp : PipelineOp {
  // Called once after on_complete, from a completion worker in completion
  // order (or from the caller of an inline op).  May block: future callbacks
  // (DDP comm hooks, user code) run here, off the pipeline, so they cannot
  // stall the slices of other ops.
  std::function<void(std::exception_ptr)> after_complete;
  // Optional, tried first on the thread that completes the op: does
  // after_complete's work right there if that cannot run user code (no
  // callback can be chained yet); true if it did.  Saves a completion
  // worker's wake-up, and the caller's second one, on a wait()'s latency.
  std::function<bool(std::exception_ptr)> complete_here;
};

}  // namespace fairring
