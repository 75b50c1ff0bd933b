// The one "this group failed" state of an engine: the first error wins and
// is kept; every later op and wait fails with it.
#pragma once

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

namespace fairring {

class GroupFailure {
 public:
  // True for the first call only (its `why` is the group's error).
  bool record(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    why_ = why;
    failed_.store(true, std::memory_order_release);
    return true;
  }
  // Lock-free: checked in every wait.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string why() const {
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }
  void throw_if_failed() const {
    if (failed()) throw std::runtime_error(why());
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  std::string why_;
};

}  // namespace fairring
