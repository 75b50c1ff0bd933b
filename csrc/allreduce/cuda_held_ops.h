// Completed CUDA ops whose device work may still run, held (with their
// tensors) until it is over.  The engine's streams are its own and die with
// it, so it cannot recordStream on them: instead the caching allocator gets
// a tensor back only once the op's `done` event has passed.  One thread polls
// the oldest op's event (ops finish in issue order on the engine's tail
// stream).  Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "pipeline/pipeline_op.h"

namespace fairring {

class CudaEvent;

class HeldOps {
 public:
  // `done_event(op)`: the op's done event, or null if none of its device
  // work was enqueued.  `failed()`: the group failed, so held device work
  // may wait forever on a dead peer: it stays held.  `fault(why)`: querying
  // an op's event reported a device error (an illegal address, say): the
  // group fails with it (called from HeldOps' thread, no lock held).
  HeldOps(int rank, c10::Device device, std::function<const CudaEvent*(const PipelineOp&)> done_event,
          std::function<bool()> failed, std::function<void(const std::string&)> fault,
          std::chrono::milliseconds teardown_limit);
  // Waits (up to teardown_limit, not at all after a failure) for the held
  // ops' device work, then leaks what is left rather than free it under a
  // running kernel.
  ~HeldOps();

  void hold(std::shared_ptr<PipelineOp> op);
  // True once nothing is held (or the group failed), before `until`.
  bool wait_released(std::chrono::steady_clock::time_point until);

 private:
  void loop();
  // Pops the front ops whose device work is over; under mu_, dropping each
  // outside it.  False when the front one is still running.
  void release_finished(std::unique_lock<std::mutex>& lock);

  const int rank_;
  const c10::Device device_;
  std::function<const CudaEvent*(const PipelineOp&)> done_event_;
  std::function<bool()> failed_;
  std::function<void(const std::string&)> fault_;
  const std::chrono::milliseconds teardown_limit_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<PipelineOp>> held_;
  bool dropping_ = false;  // the thread is dropping an op outside the lock
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
