#ifdef FAIRRING_WITH_CUDA

#include "allreduce/cuda_held_ops.h"

#include <cuda_runtime_api.h>

#include <string>

#include "common/cuda_check.h"
#include "common/cuda_resources.h"
#include "common/log.h"
#include "common/op_key.h"

namespace fairring {

namespace {
// How often held ops' device work is checked: often enough that memory goes
// back to the allocator about when the device is done with it.
constexpr auto kPoll = std::chrono::milliseconds(1);
}  // namespace

HeldOps::HeldOps(int rank, c10::Device device, std::function<const CudaEvent*(const PipelineOp&)> done_event,
                 std::function<bool()> failed, std::function<void(const std::string&)> fault,
                 std::chrono::milliseconds teardown_limit)
    : rank_(rank),
      device_(device),
      done_event_(std::move(done_event)),
      failed_(std::move(failed)),
      fault_(std::move(fault)),
      teardown_limit_(teardown_limit) {
  thread_ = std::thread([this] { loop(); });
}

HeldOps::~HeldOps() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HeldOps::hold(std::shared_ptr<PipelineOp> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(std::move(op));
  }
  cv_.notify_all();
}

bool HeldOps::wait_released(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, until, [&] { return (held_.empty() && !dropping_) || failed_(); });
}

void HeldOps::release_finished(std::unique_lock<std::mutex>& lock) {
  while (!held_.empty()) {
    const CudaEvent* done = done_event_(*held_.front());
    if (done) {
      if (failed_()) return;  // its device work may never end
      try {
        if (!cuda_done(cudaEventQuery(done->get()), "querying an all_reduce's completion")) return;
      } catch (const std::exception& e) {
        const std::string why = std::string("a CUDA error in ") + collective_name(held_.front()->collective) + " #" +
                                std::to_string(held_.front()->seq) + "'s device work: " + e.what();
        FAIRRING_LOG(rank_, "%s; its tensors are not released", why.c_str());
        new std::shared_ptr<PipelineOp>(std::move(held_.front()));  // deliberately leaked
        held_.pop_front();
        // A device fault is sticky: every later op would fail on it too.
        lock.unlock();
        fault_(why);
        lock.lock();
        continue;
      }
    }
    std::shared_ptr<PipelineOp> op = std::move(held_.front());
    held_.pop_front();
    // The last reference to a tensor may take a while (or the GIL, for its
    // Python object): not under the lock that hold() takes.
    dropping_ = true;
    lock.unlock();
    op.reset();
    lock.lock();
    dropping_ = false;
  }
}

void HeldOps::loop() {
  cuda_ok_or_log(cudaSetDevice(device_.index()), rank_, "cudaSetDevice");
  relax_capture_mode_of_this_thread(rank_);
  std::unique_lock<std::mutex> lock(mu_);
  std::chrono::steady_clock::time_point stop_by{};
  for (;;) {
    release_finished(lock);
    cv_.notify_all();  // wait_released() may be waiting for this
    if (stopping_ && !held_.empty()) {
      if (stop_by == std::chrono::steady_clock::time_point{}) {
        stop_by = std::chrono::steady_clock::now() + teardown_limit_;
      }
      if (failed_() || std::chrono::steady_clock::now() > stop_by) {
        FAIRRING_DEBUG_LOG(rank_, "CUDA engine teardown: %zu ops' tensors not released", held_.size());
        new std::deque<std::shared_ptr<PipelineOp>>(std::move(held_));  // deliberately leaked
        held_.clear();
        return;
      }
    }
    if (stopping_ && held_.empty()) return;
    if (held_.empty()) {
      cv_.wait(lock, [&] { return !held_.empty() || stopping_; });
    } else {
      cv_.wait_for(lock, kPoll);
    }
  }
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
