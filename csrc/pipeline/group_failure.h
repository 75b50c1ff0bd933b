// The one "this group failed" state of an engine: the first error wins and
// is kept; every later op and wait fails with it.
#pragma once

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"

namespace fairring {

class GroupFailure {
 public:
  // True for the first call only (its `why` is the group's error).
  bool record(const Error& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    why_.emplace(why);
    failed_.store(true, std::memory_order_release);
    return true;
  }
  // Lock-free: checked in every wait.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The first error; call only once failed().
  Error error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return *why_;
  }
  std::string why() const { return error().what(); }
  void throw_if_failed() const {
    if (failed()) throw error();
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  std::optional<Error> why_;
};

}  // namespace fairring
