#include "pipeline/held_ops.h"

#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/op_key.h"

namespace fairring {

namespace {
// How often held ops' device work is checked: often enough that memory goes
// back to the allocator about when the device is done with it.
constexpr auto kPoll = std::chrono::milliseconds(1);
// After a failure, only to release what finishes after all (an aborted NCCL
// communicator lets its kernels end).
constexpr auto kPollAfterFailure = std::chrono::milliseconds(10);
}  // namespace

bool PeerWatch::due(Clock::time_point now) {
  if (now < next_check_) return false;
  next_check_ = now + kCheckEvery;
  return true;
}

std::optional<Error> PeerWatch::saw(Clock::time_point now, std::optional<Error> trouble) {
  if (!trouble) return std::nullopt;
  if (trouble_since_ == Clock::time_point{}) {
    trouble_since_ = now;
    return std::nullopt;
  }
  if (now - trouble_since_ < kGrace) return std::nullopt;
  return trouble;
}

void fence_failed_op(int streams, const std::function<void(int)>& join, const std::function<void()>& record_done) {
  for (int s = 0; s < streams; ++s) join(s);
  record_done();
}

HeldOps::HeldOps(int rank, Hooks hooks, std::chrono::milliseconds timeout)
    : rank_(rank), hooks_(std::move(hooks)), timeout_(timeout) {
  thread_ = std::thread([this] { loop(); });
}

HeldOps::~HeldOps() { stop(); }

void HeldOps::stop() {
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
    held_.push_back(Held{std::move(op), Clock::now()});
  }
  cv_.notify_all();
}

void HeldOps::group_failed(const Error& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return;
    failed_ = true;
    failure_.emplace(why);
  }
  cv_.notify_all();
}

bool HeldOps::wait_released(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, until, [&] { return (held_.empty() && !dropping_) || failed_; });
}

std::string HeldOps::name(const PipelineOp& op) const {
  return std::string(collective_name(op.collective)) + " #" + std::to_string(op.number);
}

void HeldOps::drop(std::shared_ptr<PipelineOp> op, std::unique_lock<std::mutex>& lock) {
  dropping_ = true;
  lock.unlock();
  op.reset();
  lock.lock();
  dropping_ = false;
}

void HeldOps::release_finished(std::unique_lock<std::mutex>& lock) {
  while (!held_.empty() && !failed_) {
    const auto now = Clock::now();
    const std::string op_name = name(*held_.front().op);
    std::optional<Error> why;
    try {
      if (hooks_.finished(*held_.front().op)) {
        std::shared_ptr<PipelineOp> op = std::move(held_.front().op);
        held_.pop_front();
        // The next one's time starts now if it was waiting behind this one.
        if (!held_.empty()) held_.front().since = std::max(held_.front().since, now);
        peers_.reset();
        drop(std::move(op), lock);
        continue;
      }
      // Still running: watch it.
      if (now - held_.front().since > timeout_) {
        why.emplace(ErrorKind::kBackend, "Timed out after " + std::to_string(timeout_.count()) + " ms: " + op_name +
                                             "'s device work did not finish (this rank's CUDA work waits on its local "
                                             "peers' and its rail's: is one of them stalled?)");
      } else if (peers_.due(now)) {
        std::optional<Error> trouble;
        lock.unlock();
        try {
          hooks_.check_peers();
        } catch (const std::exception& e) {
          trouble.emplace(error_of(e));
        }
        lock.lock();
        if (auto gone = peers_.saw(now, std::move(trouble))) {
          why.emplace(reworded(*gone, op_name + "'s device work cannot finish: " + gone->what()));
        }
      }
    } catch (const std::exception& e) {
      // A device fault is sticky: every later op would fail on it too.
      why.emplace(ErrorKind::kBackend, "a device error in " + op_name + "'s device work: " + error_of(e).what());
    }
    if (!why) return;
    FAIRRING_LOG(rank_, "%s", why->what());
    lock.unlock();
    hooks_.fault(*why);  // reaches group_failed() (or an earlier failure did)
    lock.lock();
    return;
  }
}

void HeldOps::release_after_failure(std::unique_lock<std::mutex>& lock) {
  // Only appends happen while the lock is released, so indices stay valid.
  for (size_t i = 0; i < held_.size();) {
    std::string device_error;
    bool over = false;
    try {
      over = hooks_.finished(*held_[i].op);
    } catch (const std::exception& e) {
      device_error = e.what();
    }
    if (over) {
      std::shared_ptr<PipelineOp> op = std::move(held_[i].op);
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
      drop(std::move(op), lock);
      continue;
    }
    if (!held_[i].reported) {
      held_[i].reported = true;
      std::shared_ptr<PipelineOp> op = held_[i].op;
      const Error why = reworded(*failure_, name(*op) +
                                                " did not complete: the group failed while its device work was "
                                                "pending (" +
                                                (device_error.empty() ? "" : "a device error: " + device_error + "; ") +
                                                failure_->what() + "); its tensors are held until it ends");
      lock.unlock();
      hooks_.device_failed(*op, why);
      op.reset();
      lock.lock();
    }
    ++i;
  }
}

void HeldOps::loop() {
  if (hooks_.thread_start) hooks_.thread_start();
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point stop_by{};
  for (;;) {
    if (failed_) {
      release_after_failure(lock);
    } else {
      release_finished(lock);
    }
    cv_.notify_all();  // wait_released() may be waiting for this
    if (stopping_ && !held_.empty()) {
      if (stop_by == Clock::time_point{}) stop_by = Clock::now() + timeout_;
      if (failed_ || Clock::now() > stop_by) {
        FAIRRING_DEBUG_LOG(rank_, "CUDA engine teardown: %zu ops' tensors not released", held_.size());
        auto* leaked = new std::deque<Held>(std::move(held_));  // deliberately leaked
        (void)leaked;
        held_.clear();
        return;
      }
    }
    if (stopping_ && held_.empty()) return;
    if (held_.empty()) {
      cv_.wait(lock, [&] { return !held_.empty() || stopping_; });
    } else {
      cv_.wait_for(lock, failed_ ? kPollAfterFailure : kPoll);
    }
  }
}

}  // namespace fairring
