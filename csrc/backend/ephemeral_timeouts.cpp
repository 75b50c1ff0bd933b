#include "backend/ephemeral_timeouts.h"

namespace fairring {

void EphemeralTimeouts::add(std::chrono::milliseconds extra, uint64_t next_op) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace_back(extra, next_op);
  count_.store(live_.size());
  changed_.store(true);
}

void EphemeralTimeouts::op_ended(uint64_t number) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t before = live_.size();
  std::erase_if(live_, [&](const auto& e) { return number >= e.second; });
  if (live_.size() != before) {
    count_.store(live_.size());
    changed_.store(true);
  }
}

std::chrono::milliseconds EphemeralTimeouts::extra() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::chrono::milliseconds sum{0};
  for (const auto& e : live_) sum += e.first;
  return sum;
}

}  // namespace fairring
