// The last ops of one process group, for post-mortems and the status view:
// what was issued, how large, whether and when it ended.  Dumped to stderr
// when an op fails, and on request (fairring_py.dump_recent(group)).
//
// One record per op.  Where torch's flight recorder is on (the default), an
// op recorded there (FlightRecord) has its state and times in torch's entry
// only, and this ring reads them from it (FlightRecord::look) when it is
// read.  The ring keeps what torch's entry cannot say: the op's number in the
// group's own numbering (the one errors and logs name; delegated ops count),
// its kind as Fairring names it ("all_reduce (CUDA)", "broadcast (gloo)"),
// its reduce op and shape, the bytes this rank moves, and, for one that
// failed, the error and when it came.  Ops torch's recorder does not hold
// (it is off, TORCH_FR_BUFFER_SIZE=0; ops delegated to gloo, which gloo
// records; the sparse all-reduce's outer op) keep their state and times here.
//
// Every op passes through here on its latency path, so a record costs no
// allocation once the ring has been round: the records are kept in place
// and overwritten, and a collective's description ("1000 elements of float32
// with SUM") is written from its OpKey only when the ring is read.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/flight_recorder.h"
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
    // "in flight", "done", "failed", "delegated", or "unknown" (torch's
    // recorder no longer holds the op's entry, its ring went round or was
    // reset, and the op did not fail: a failure is kept here).
    std::string state;
    std::string error;
    std::optional<int64_t> start_ns;  // c10::getTime()'s clock; none when unknown
    std::optional<int64_t> end_ns;    // when done or failed
    bool ended() const { return state == "done" || state == "failed"; }
  };
  // What an op's entry in torch's flight recorder holds besides what the
  // ring has (FlightRecord::issued).  Built by the caller only when
  // FlightRecord::on(): tensors lists cost on the small-op path.
  struct InTorch {
    std::string uid;  // c10d's group name and description
    std::string desc;
    const char* name = "";  // a literal: "all_reduce" is recorded as "fairring:all_reduce"
    std::string detail;     // after the name: a send's "0->1"
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> outputs;
    std::chrono::milliseconds timeout{0};
  };
  // Names an op's record; finish() through it.  Once the ring has gone
  // round past the record, finish() leaves the newer op's record alone.
  struct Handle {
    uint64_t stamp = 0;  // the how-manieth start (1-based): the record's place and age
    uint64_t seq = 0;    // the op's number, for logs
    bool p2p = false;
    FlightRecord::Id torch;  // its entry in torch's recorder, if any
  };
  // How many ops have ended, by class, for the status view (fairring_py.status;
  // how many were issued is the backend's numbering).  Delegated ops are
  // never followed to their end.
  struct Ended {
    uint64_t collectives = 0;
    uint64_t p2p = 0;
  };

  RecentOps(size_t capacity, std::shared_ptr<FlightRecord> torch);
  // Records an op, in torch's recorder too where `torch` is given (and the
  // recorder on); finish() it when it ends.  `kind` + `suffix` name it here.
  Handle start(uint64_t seq, std::string_view kind, std::string_view suffix, std::string what, int64_t bytes,
               const InTorch* torch, bool p2p = false);
  // The same for a collective of the pipeline: its description comes from
  // `key` when the ring is read.
  Handle start(uint64_t seq, std::string_view kind, std::string_view suffix, const OpKey& key, int64_t bytes,
               const InTorch* torch);
  // An op handed to gloo: recorded, never followed to its end (gloo's own
  // entry in torch's recorder does that).
  void delegated(uint64_t seq, std::string_view kind);
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
    FlightRecord::Id torch;  // with an id: state and times are torch's entry's
    // Only where torch's entry does not hold them: the state and times, and
    // for a failed op, when it failed (torch marks it retired, not completed).
    State state = State::kInFlight;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    std::string error;
  };
  Handle record(uint64_t seq, std::string_view kind, std::string_view suffix, int64_t bytes, const InTorch* torch,
                bool p2p, State state, const OpKey* key, std::string what);

  const std::shared_ptr<FlightRecord> torch_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  uint64_t started_ = 0;  // starts so far; entry i holds start number i+1, i+1+capacity, ...
  bool failure_dumped_ = false;
  Ended ended_;
};

}  // namespace fairring
