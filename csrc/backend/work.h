// The Work object Fairring returns for its own collectives.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

namespace fairring {

class FairringWork : public c10d::Work {
 public:
  // `profiling_title` names the op in torch.profiler traces ("fairring:all_reduce").
  FairringWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, const char* profiling_title);

  // Completes the work: wait() returns (or throws).  Quick, never blocks.
  void mark_done(std::exception_ptr error);
  // Completes the future, running its callbacks (DDP's comm hook chains on it).
  void complete_future(std::exception_ptr error);

  // Returns once the op is done and its future completed, so that
  // get_future().value() works right after wait().
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace fairring
