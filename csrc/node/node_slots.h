// The node protocol: how the ranks of a node share the `slots` pipeline
// slots of their NodeArena, one slice per slot at a time.  For slice s
// (global slice number, the same on every rank) in slot s % slots:
//
//   wait_free     every peer has released the slot's previous slice
//   claim         write our header (what we run) into the slot
//   publish_input our input is in the slot        -> wait_input on a peer
//   check_match   every rank's header says the same collective
//   publish_chunk our chunk is final (after the rails, between nodes)
//                                                 -> wait_chunk on its owner
//   release       we are done reading the slot    -> the owner's wait_free
//
// Each step is a counter per local rank that only grows ("slices done + 1");
// the arithmetic on it lives here and nowhere else.  A wait either blocks
// (checking for failures, dead or stalled peers and deadlines: wait_check.h)
// or, given `until`, spins until then at most and returns false.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "node/node_arena.h"
#include "common/op_key.h"
#include "topology/topology.h"

namespace fairring {

// A slice as the protocol and its error messages know it.
struct SliceId {
  uint64_t op_seq = 0;     // the engine's (OpKey::op_seq)
  uint64_t op_number = 0;  // the group's, for messages (OpKey::number)
  uint64_t slice_seq = 0;
  Collective collective = Collective::kAllReduce;  // for messages
};

class NodeSlots {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // The check a blocking wait calls every few milliseconds; it throws to
  // give up.  `local_peer` is -1 for a wait on the network as a whole.
  using MakeCheck =
      std::function<std::function<void()>(int local_peer, const char* what, const SliceId& s, bool via_network)>;

  // `spin`: how long a blocking wait spins before it sleeps (Config::wait_spin).
  NodeSlots(NodeArena& arena, const Topology& topo, int slots, MakeCheck make_check, const char* device,
            std::chrono::microseconds spin);

  int slot(uint64_t slice_seq) const { return static_cast<int>(slice_seq % slots_); }
  // The slice is its slot's first: no earlier slice to wait for there.
  bool first_use(uint64_t slice_seq) const { return slice_seq < static_cast<uint64_t>(slots_); }
  NodeArena& arena() { return arena_; }

  // Tells the node's peers we issued op `op_seq` (a peer that has not is
  // named as absent when a wait on it runs long).
  void announce(uint64_t op_seq);

  bool wait_free(const SliceId& s, int peer, const TimePoint* until = nullptr);
  void claim(const SliceId& s, const OpKey& key);
  void publish_input(const SliceId& s);
  bool wait_input(const SliceId& s, int peer, const TimePoint* until = nullptr);
  // Throws the mismatch error if any local rank claimed the slot for another
  // collective or slice.
  void check_match(const SliceId& s);
  void publish_chunk(uint64_t slice_seq);
  // Waits for chunk `owner`'s final value (ours too, between nodes: it comes
  // back from the rails).
  bool wait_chunk(const SliceId& s, int owner, const TimePoint* until = nullptr);
  void release(const SliceId& s);

 private:
  static uint32_t mark(uint64_t slice_seq) { return static_cast<uint32_t>(slice_seq + 1); }
  bool await(SharedCounter& c, uint32_t target, int peer, const char* what, const SliceId& s, bool via_network,
             const TimePoint* until);

  NodeArena& arena_;
  NodeControl& control_;
  Topology topo_;
  int slots_;
  MakeCheck make_check_;
  const char* device_;  // "" or "CUDA ", for messages
  std::chrono::microseconds spin_;
};

}  // namespace fairring
