// The memory the ranks of one node share: a control block (counters, abort
// word, per-slot op descriptors) and, per pipeline slot, one input area per
// local rank plus one output area.  POSIX shared memory when the node has
// several ranks; private memory (control block only) for a node of one.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/error.h"
#include "common/op_key.h"
#include "topology/topology.h"
#include "transport/shm.h"
#include "transport/sync.h"

namespace c10d {
class Store;
}

namespace fairring {

constexpr int kMaxLocalRanks = 256;

// What a rank says it runs in a slot; compared between ranks (NodeSlots).
struct SlotHeader {
  OpKey key;
  uint64_t slice_seq;
};

struct NodeControl {
  std::atomic<uint32_t> abort_state;  // 0 running, 1 being written, 2 aborted
  int32_t abort_rank;
  uint32_t abort_kind;  // ErrorKind of the failure
  // The first op the aborting rank failed: ops before it succeeded there, so
  // they may still succeed here; this op and later ones must fail here too.
  uint64_t abort_op;
  char abort_msg[4096];
  int32_t pids[kMaxLocalRanks];
  // All-reduces each local rank has issued: tells a stalled peer (one that has
  // not called the collective) from a busy one when a wait runs long.
  std::atomic<uint64_t> issued[kMaxLocalRanks];
  // Counters hold "slices done + 1" of each local rank's steps.
  SharedCounter in_ready[kMaxLocalRanks];    // input copied into its slot area
  SharedCounter chunk_done[kMaxLocalRanks];  // its chunk fully reduced (after the network)
  SharedCounter consumed[kMaxLocalRanks];    // finished reading the slot (all-gather done)
  // A local rank that left the group (shut it down, destroyed or dropped
  // it) while its process may live on: the ops it had issued, + 1 (0: still
  // here; written after `left_why`), and what it said of its leaving.
  std::atomic<uint64_t> left[kMaxLocalRanks];
  char left_why[kMaxLocalRanks][256];
  // CUDA engine teardown: 1 once local rank x has closed its mappings of the
  // others' IPC memory and events, so they may free theirs.
  SharedCounter cuda_closed[kMaxLocalRanks];
};

// Removes this user's segments of Fairring jobs whose creating process has
// exited (and that are over a minute old): what a crash before every local
// rank had mapped a segment left in /dev/shm.  Returns how many.  Run by local
// rank 0 before it creates a segment, at `import fairring_py`, and by
// `python -m fairring_py.cleanup`.
int sweep_stale_segments();

class NodeArena {
 public:
  // Collective over the node's ranks (rendezvous through the store).
  NodeArena(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& job_uid, int slots,
            int64_t slot_area_bytes, std::chrono::milliseconds timeout, int counters_per_slot = 0);

  NodeControl& control() { return *control_; }
  SlotHeader& header(int slot, int local) { return headers_[slot * ranks_ + local]; }
  // Area of local rank `local` in `slot` (the inputs of the reduce-scatter).
  char* input_area(int slot, int local) { return data_ + (slot * (ranks_ + 1) + local) * area_; }
  // The slot's output area (reduced chunks, gathered by everyone).
  char* output_area(int slot) { return data_ + (slot * (ranks_ + 1) + ranks_) * area_; }
  int64_t area_bytes() const { return area_; }
  // Extra shared counters, `counters_per_slot` per slot and local rank (the
  // deferred mover's events).
  SharedCounter& counter(int slot, int local, int index) {
    return counters_[(static_cast<int64_t>(slot) * ranks_ + local) * counters_per_slot_ + index];
  }

  // Records an abort for every rank of the node and wakes all waiters.
  // Only the first caller's message is kept.  `first_failed_op`: the oldest
  // op the caller fails (0 when it cannot tell: every op not yet done fails).
  void abort(int rank, const Error& why, uint64_t first_failed_op = 0);
  // Whether op `op_seq` must fail because the node aborted: an op that ended
  // well on one rank must not fail on another, and the other way round.
  bool aborts_op(uint64_t op_seq) const {
    return control_->abort_state.load(std::memory_order_acquire) == 2 && control_->abort_op <= op_seq;
  }
  // Local rank `local` leaves after issuing `issued` ops, saying `why` (its
  // node-mates' waits on it for a later op fail at once); wakes every wait.
  void leave(int local, uint64_t issued, const std::string& why);
  // Why local rank `local` left before issuing op `op_seq` ("" if it did
  // not: it is here, or it issued that op, and so did its part of it).
  std::string left_before(int local, uint64_t op_seq) const;
  // Why the node aborted (call once aborted()).
  Error abort_error() const;
  bool aborted() const { return control_->abort_state.load(std::memory_order_acquire) != 0; }

 private:
  ShmSegment shm_;
  std::unique_ptr<char[]> private_;  // for a node of one rank
  NodeControl* control_ = nullptr;
  SlotHeader* headers_ = nullptr;
  SharedCounter* counters_ = nullptr;
  int counters_per_slot_ = 0;
  char* data_ = nullptr;
  int ranks_ = 1;
  int64_t area_ = 0;
};

}  // namespace fairring
