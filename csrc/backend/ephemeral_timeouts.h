// torch >= 2.14's addEphemeralTimeout: more time for the ops issued after
// the call, until the first of them ends.  Pure bookkeeping; the group gives
// its engines its timeout plus extra() when it issues an op (the engines'
// timeouts govern the waits started after they are set).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace fairring {

class EphemeralTimeouts {
 public:
  // `extra` for the ops numbered `next_op` and later, until one of them ends.
  void add(std::chrono::milliseconds extra, uint64_t next_op);
  // Op `number` ended: the extensions it was issued under expire.  Cheap
  // when there is none (every op's completion calls it).
  void op_ended(uint64_t number);
  // The live extensions' sum.
  std::chrono::milliseconds extra() const;
  // True once after each change of extra() (the group then re-applies it).
  bool changed() { return changed_.load(std::memory_order_relaxed) && changed_.exchange(false); }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::chrono::milliseconds, uint64_t>> live_;  // (extra, first op)
  std::atomic<size_t> count_{0};
  std::atomic<bool> changed_{false};
};

}  // namespace fairring
