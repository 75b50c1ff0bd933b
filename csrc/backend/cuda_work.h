// The Work Fairring returns for a collective of CUDA tensors.  Like
// ProcessGroupNCCL's, it is "done" once the op's device work is enqueued:
// wait() blocks the host only until then, and makes the caller's current
// stream wait for the op's last event; the future is CUDA-aware (created with
// the device), so consumers that wait on it or chain on it (DDP's comm hook)
// are ordered after the op through CUDA events, not host synchronisation.
// is_completed() is true once the device work is over too.  If the engine's
// watchdog gives up on the device work (pipeline/held_ops.h), the Work turns
// failed: is_completed() is true, exception() says why, wait() raises it.
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "common/cuda_resources.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fairring {

class CudaFairringWork : public c10d::Work {
 public:
  // `kind`: the collective's name, for messages ("all_gather").
  CudaFairringWork(int rank, c10d::OpType type, std::string kind, std::vector<at::Tensor> outputs, c10::Device device);

  // The event recorded after the op's last device work (shared with the op).
  const std::shared_ptr<CudaEvent>& done_event() const { return done_; }

  // Host side done (every slice enqueued, or failed).  Quick, never blocks.
  void mark_done(std::exception_ptr error);
  // Completes the future with `stream` (which waits on done_event()) as the
  // current stream, so the future's consumers wait for the op on the device.
  void complete_future(std::exception_ptr error, const c10::cuda::CUDAStream& stream);
  // The device work failed or was given up on, after the host side
  // succeeded.  Only the first error counts; a host error stays.
  void fail_on_device(std::exception_ptr error);

  // Blocks until the op is enqueued, then makes the current stream wait for it.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  bool isCompleted() override;
  std::exception_ptr exception() const override;
  bool isSuccess() const override { return !exception(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  void stream_wait();
  std::exception_ptr device_error() const;

  std::string kind_;
  std::vector<at::Tensor> outputs_;
  c10::Device device_;
  std::shared_ptr<CudaEvent> done_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex device_mu_;
  std::exception_ptr device_error_;  // fail_on_device
};

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
