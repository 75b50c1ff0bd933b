// The Work object Fairring returns for its own collectives.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

namespace fairring {

class FairringWork : public c10d::Work {
 public:
  FairringWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  // Completes the work and its future (DDP's comm hook chains on the future).
  void complete(std::exception_ptr error);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace fairring
