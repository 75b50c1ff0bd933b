// The last collectives of one process group, for post-mortems: what was
// issued, how large, whether and when it ended.  torch's flight recorder
// (_dump_fr_trace) only hears from backends built into torch, so Fairring
// keeps its own: dumped to stderr when an op fails, and on request
// (fairring_py.dump_recent(group)).
//
// Every op passes through here on its latency path, so a record costs no
// allocation once the ring has been round: the records are kept in place
// and overwritten, and a collective's description ("1000 elements of float32
// with SUM") is written from its OpKey only when the ring is read.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/op_key.h"

namespace fairring {

class RecentOps {
 public:
  struct Record {
    uint64_t seq = 0;  // the op's number: collectives and point-to-point ops each count from 0
    bool p2p = false;  // a send or receive, not a collective
    std::string kind;  // "all_reduce", "broadcast (gloo)", ...
    std::string what;  // "1000 elements of float32 with SUM", or "" for delegated ones
    int64_t bytes = 0;
    std::string state;  // "in flight", "done", "failed", "delegated"
    std::string error;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point end;  // when done or failed
    bool ended() const { return state == "done" || state == "failed"; }
  };
  // Names an op's record; finish() through it.  Once the ring has gone
  // round past the record, finish() leaves the newer op's record alone.
  struct Handle {
    uint64_t stamp = 0;  // the how-manieth start (1-based): the record's place and age
    uint64_t seq = 0;    // the op's number, for logs
    bool p2p = false;
  };
  // How many ops have ended, by class, for the status view (fairring_py.status;
  // how many were issued is the backend's numbering).  Delegated ops are
  // never followed to their end.
  struct Ended {
    uint64_t collectives = 0;
    uint64_t p2p = 0;
  };

  explicit RecentOps(size_t capacity);
  // Records an op; finish() it when it ends (ops delegated to gloo are not
  // followed).  `kind` may be a literal or a composed name.
  Handle start(uint64_t seq, const std::string& kind, std::string what, int64_t bytes, bool delegated = false,
               bool p2p = false);
  // The same for a collective of the pipeline, named `kind` + `suffix`: its
  // description comes from `key` when the ring is read.
  Handle start(uint64_t seq, const char* kind, const char* suffix, const OpKey& key, int64_t bytes);
  void finish(const Handle& h, const std::string& error);
  // Oldest first.
  std::vector<Record> snapshot() const;
  Ended ended() const;
  // One line per op, for logs.
  std::string format() const;
  // True the first time it is called: the caller dumps on the group's first failure only.
  bool first_failure();

 private:
  enum class State { kInFlight, kDone, kFailed, kDelegated };
  struct Entry {
    uint64_t stamp = 0;  // 0: never used
    uint64_t seq = 0;
    bool p2p = false;
    std::string kind;
    bool has_key = false;  // `what` comes from `key`
    OpKey key;
    std::string what;
    int64_t bytes = 0;
    State state = State::kInFlight;
    std::string error;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point end;
  };
  // The next entry, under mu_.
  Entry& claim(uint64_t seq, int64_t bytes, State state, bool p2p);

  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  uint64_t started_ = 0;  // starts so far; entry i holds start number i+1, i+1+capacity, ...
  bool failure_dumped_ = false;
  Ended ended_;
};

}  // namespace fairring
