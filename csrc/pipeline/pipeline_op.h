// One collective as the pipeline core sees it; each device's engine derives
// its op from it (allreduce/op.h, allreduce/cuda_engine.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <functional>

#include "common/op_key.h"
#include "common/reduce_op.h"

namespace fairring {

struct PipelineOp {
  virtual ~PipelineOp() = default;

  uint64_t seq = 0;  // issue order on the engine, from 0 (set by Pipeline::submit)
  Collective collective = Collective::kAllReduce;
  at::Tensor buffer;  // contiguous; reduced in place (blockwise collectives: the input, only read)
  at::Tensor output;  // contiguous; the result of a blockwise collective (plan.h)
  c10::ScalarType dtype = c10::ScalarType::Float;
  RedOp op = RedOp::kSum;
  int64_t numel = 0;
  int32_t root = 0;  // a broadcast's root
  // Called once when the op is done (host side): from the pipeline's
  // thread, or from the issuing thread when it ran inline or the group had
  // already failed.  Must be quick and must not block (it marks the Work done).
  std::function<void(std::exception_ptr)> on_complete;

  OpKey key() const {
    OpKey k;
    k.op_seq = seq;
    k.numel = numel;
    k.collective = static_cast<int32_t>(collective);
    k.dtype = static_cast<int32_t>(dtype);
    k.op = static_cast<int32_t>(op);
    k.root = root;
    return k;
  }
};

}  // namespace fairring
