// Sleeps that start short and double up to a cap: for polling a condition
// that is usually met within microseconds but may take long (a future, an
// NCCL call in progress, a peer's listening socket), without spinning a core.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace fairring {

class Backoff {
 public:
  Backoff(std::chrono::microseconds first, std::chrono::microseconds cap) : next_(first), cap_(cap) {}
  void sleep() {
    std::this_thread::sleep_for(next_);
    next_ = std::min(next_ * 2, cap_);
  }

 private:
  std::chrono::microseconds next_;
  std::chrono::microseconds cap_;
};

}  // namespace fairring
