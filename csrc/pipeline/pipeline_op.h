// One collective as the pipeline core sees it; each device's engine derives
// its op from it (devices/host_op.h, devices/cuda_engine.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "common/op_key.h"
#include "common/reduce_op.h"
#include "pipeline/collective_def.h"
#include "pipeline/op_order.h"

namespace fairring {

struct PipelineOp {
  virtual ~PipelineOp() = default;

  uint64_t seq = 0;  // issue order on the engine, from 0 (set by Pipeline::submit)
  // The op's number in the group (set by the backend): the one messages
  // show, as the recent-ops dump and the logs do (OpKey::number).
  uint64_t number = 0;
  Collective collective = Collective::kAllReduce;
  const CollectiveDef* def = nullptr;  // its script and cut (set by the backend: collectives/)
  at::Tensor buffer;                   // contiguous; reduced in place (blockwise collectives: the input, only read)
  at::Tensor output;                   // contiguous; the result of a blockwise collective (plan.h)
  // A blockwise collective given one tensor per rank (list forms): each
  // rank's block where the caller has it, contiguous, in place of
  // `buffer`'s / `output`'s (empty: the blocks follow each other there).
  std::vector<at::Tensor> input_blocks;
  std::vector<at::Tensor> output_blocks;
  // An all-to-all of unequal blocks: element i * W + j is the length of the
  // block rank i sends rank j (every rank's, the same on all; `numel` is the
  // largest).  Empty: every block holds `numel` elements.
  std::vector<int64_t> block_counts;
  c10::ScalarType dtype = c10::ScalarType::Float;
  RedOp op = RedOp::kSum;
  int64_t numel = 0;
  int32_t root = 0;       // a broadcast's root
  uint32_t layout = 0;    // OpKey::layout
  bool rejected = false;  // OpKey::rejected
  // The caller's tensors when the result is not written into them directly
  // (non-contiguous, or several flattened into one buffer): the result is
  // copied into them, in order, at the end (copy_to_users).
  std::vector<at::Tensor> users;
  // What the op reads and writes of the caller's memory (op_order.h).
  Footprint footprint;
  // The op's first touch of the caller's memory when `buffer` is not the
  // caller's tensor (fill it: a contiguous or flattened copy, a premultiply),
  // or null.  Pipeline::submit runs it right away unless the op must follow
  // an earlier one; then it runs when the op starts, after that one.
  std::function<void()> stage;
  // Set by Pipeline::submit: the op starts once no op numbered below this
  // is pending (0: it follows none).
  uint64_t follows = 0;
  // Called once when the op is done (host side): from the pipeline's
  // thread, or from the issuing thread when it ran inline or the group had
  // already failed.  Must be quick and must not block (it marks the Work done).
  std::function<void(std::exception_ptr)> on_complete;

  // The result (the buffer, or a blockwise collective's output) into `users`.
  void copy_to_users(bool non_blocking) {
    at::NoGradGuard no_grad;  // a caller's tensor may be a leaf that requires grad
    const at::Tensor flat = (output.defined() ? output : buffer).reshape({-1});
    int64_t offset = 0;
    for (at::Tensor& u : users) {
      u.copy_(flat.narrow(0, offset, u.numel()).view(u.sizes()), non_blocking);
      offset += u.numel();
    }
  }

  OpKey key() const {
    OpKey k;
    k.op_seq = seq;
    k.number = number;
    k.numel = numel;
    k.collective = static_cast<int32_t>(collective);
    k.dtype = static_cast<int32_t>(dtype);
    k.op = static_cast<int32_t>(op);
    k.root = root;
    k.layout = layout;
    k.rejected = rejected ? 1 : 0;
    return k;
  }
};

}  // namespace fairring
