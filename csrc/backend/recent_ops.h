// The last collectives of one process group, for post-mortems: what was
// issued, how large, whether and when it ended.  torch's flight recorder
// (_dump_fr_trace) only hears from backends built into torch, so Fairring
// keeps its own: dumped to stderr when an op fails, and on request
// (fairring_py.dump_recent(group)).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fairring {

class RecentOps {
 public:
  struct Record {
    uint64_t seq = 0;  // the group's collective number (sequence number)
    std::string kind;  // "all_reduce", "broadcast (gloo)", ...
    std::string what;  // "1000 elements of float32 with SUM", or "" for delegated ones
    int64_t bytes = 0;
    std::string state;  // "in flight", "done", "failed", "delegated"
    std::string error;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point end;  // when done or failed
    bool ended() const { return state == "done" || state == "failed"; }
  };
  using Handle = std::shared_ptr<Record>;

  explicit RecentOps(size_t capacity);
  // Records an op; finish() it when it ends (ops delegated to gloo are not followed).
  Handle start(uint64_t seq, std::string kind, std::string what, int64_t bytes, bool delegated = false);
  void finish(const Handle& h, const std::string& error);
  // Oldest first; durations and ages in ms.
  std::vector<Record> snapshot() const;
  // One line per op, for logs.
  std::string format() const;
  // True the first time it is called: the caller dumps on the group's first failure only.
  bool first_failure();

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Handle> ops_;
  bool failure_dumped_ = false;
};

}  // namespace fairring
