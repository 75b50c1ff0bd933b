// One collective of CPU tensors as the host engine sees it.
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <vector>

#include "pipeline/pipeline_op.h"

namespace fairring {

struct HostOp : PipelineOp {  // Called once after on_complete, from a completion worker in completion
  // order (or from the caller of an inline op).  May block: future callbacks
  // (DDP comm hooks, user code) run here, off the pipeline, so they cannot
  // stall the slices of other ops.
  std::function<void(std::exception_ptr)> after_complete;
};

}  // namespace fairring
