// Fairring's ops in torch's flight recorder (c10d/FlightRecorder.hpp): the
// ring of a process's recent collectives that
// torch._C._distributed_c10d._dump_fr_trace() returns, that NCCL and gloo
// record into, and that torch's analyzer
// (python -m torch.distributed.flight_recorder.fr_trace) reads from every
// rank's dump to name the first collective the ranks disagree on.
//
// torch keeps that ring in a static of libtorch that it does not export, so
// the one place that knows where it is lives here: flight_recorder.cpp finds
// it in libtorch's symbol table (once per process) and writes entries the way
// ProcessGroupGloo does (no device events; retired when the op ends).  Where
// it cannot be found, or TORCH_FR_BUFFER_SIZE=0 turns it off, nothing is
// recorded and problem() says why; the recent ops (recent_ops.h) then keep
// the states and times they otherwise read from torch's entries.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
struct ProcessGroupStatus;
}

namespace fairring {

class FlightRecord {
 public:
  // One process group's side: its numbering of collectives and
  // point-to-point ops (what the analyzer matches between ranks) and its
  // status (last op issued and ended).
  FlightRecord(int rank, int size);
  ~FlightRecord();

  // The group's ranks in the default group (torch's pg_config); 0..size-1
  // until set.
  void set_global_ranks(std::vector<uint64_t> ranks);
  // As set, or empty when never set.
  std::vector<uint64_t> global_ranks();

  struct Id {
    std::optional<size_t> id;  // torch's entry, none when not recorded
    size_t epoch = 0;          // the recorder's reset epoch when it was recorded
    int64_t seq = 0;
    const char* name = "";
  };
  // An op issued under the group `uid` / `desc` (c10d's group name and
  // description, known only once torch has set them): `name` is its kind,
  // a literal ("all_reduce": recorded as "fairring:all_reduce"), `detail`
  // what follows it there (a send's "0->1", as NCCL writes it), `inputs` /
  // `outputs` what it reads and writes.  Callers skip building these when
  // on() is false: nothing is recorded then.
  Id issued(const std::string& uid, const std::string& desc, const char* name, const std::string& detail, bool p2p,
            const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
            std::chrono::milliseconds timeout);
  // The op ended: done (`ok`: completed, retired), or failed (retired but
  // not completed, as torch's recorders leave an op that timed out).
  void ended(const Id& id, bool ok);

  // What torch's entries of `ids` say now, in their order: found (not yet
  // overwritten by the ring going round, nor reset), retired (ended),
  // completed (ended well, at completed_ns), issued at created_ns (the
  // clock of c10::getTime).  The recent-ops view reads its states and times
  // here: torch's entry is the op's one record of them.
  struct Seen {
    bool found = false;
    bool retired = false;
    int64_t created_ns = 0;
    std::optional<int64_t> completed_ns;
  };
  static std::vector<Seen> look(const std::vector<Id>& ids);

  // Whether entries are recorded; otherwise problem() says why.
  static bool on();
  static std::string problem();
  // torch's dump (the pickle _dump_fr_trace returns) written where torch
  // writes its own: $TORCH_FR_DUMP_TEMP_FILE<rank> (default
  // ~/.cache/torch/comm_lib_trace_rank_<rank>).  Returns the file, or "".
  static std::string dump_to_file(int global_rank, bool stack_traces = true);
  // After the group's first failure, where TORCH_FR_DUMP_ON_TIMEOUT=1 (or
  // NCCL's TORCH_NCCL_DUMP_ON_TIMEOUT=1) asks for it: dump_to_file() under
  // this rank's number in the default group, so that every rank that sees
  // the failure, its cause or not, leaves its file in the same place.
  // Without stack traces: they need the GIL, and this runs on the engine's
  // thread.  Returns the file, or "".
  std::string dump_after_failure();
  // Whether dump_after_failure() dumps (read once per process).
  static bool dumps_after_failure();

 private:
  const int rank_;
  const int size_;
  const size_t pg_id_;  // this process's count of Fairring groups
  std::mutex mu_;
  std::vector<uint64_t> ranks_;
  bool ranks_set_ = false;
  std::optional<std::string> recorded_uid_;  // the name ranks_ were last recorded under
  uint64_t collective_seq_ = 0;
  uint64_t p2p_seq_ = 0;
  uint64_t op_id_ = 0;
  std::shared_ptr<c10d::ProcessGroupStatus> status_;
};

}  // namespace fairring
