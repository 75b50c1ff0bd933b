// The steps of a slice, written once for every device.  A collective is a
// list of named phases, split in two: the front half (the reduce-scatter: up
// to handing the node's chunk to the rails) and the back half (the
// all-gather: from waiting for the chunks to releasing the slot).  The
// pipeline runs the front half of a slice as it enters and the back half
// `parallelism - 1` slices later.  Each phase goes through NodeSlots (the
// node protocol), a Mover (how the device moves and reduces memory) and, with
// several nodes, a RailExchange.
//
// The all-reduce, for local rank `me` of K, with N nodes:
//
//   front: acquire        wait until every peer released the slot; claim it
//          publish-input  our slice (minus our own chunk) into our input area
//          reduce-chunk   wait for the peers' inputs; reduce our chunk in place
//          exchange       N > 1: the chunk to the rails; then (or right away)
//                         publish-chunk: copy it to our output area, publish
//   back:  gather         wait for every chunk; copy the others' into the tensor
//          release        we are done with the slot
//
// A node of one rank skips the node phases.  A small slice on one node is
// "replicated": every rank reduces all of it and nothing is gathered.
//
// The blockwise collectives (plan.h: slice i is piece i of every rank's block;
// in the slot areas chunk x holds the pieces of every node's local rank x):
//
// reduce-scatter: acquire, stage-blocks (our W pieces into our input area, by
//   chunk), reduce-blocks (chunk `me` of every input area: the node's sum of
//   our rail's pieces), exchange-blocks (each piece to the node it belongs
//   to, whose rank reduces them into its output; one node: it is the output
//   already) | await-own, release.
// all-gather: acquire, publish-block (our piece into our chunk of the output
//   area), exchange-blocks (our piece to every node, theirs into our chunk)
//   | gather-blocks (every chunk into the output), release.
// On a node of one rank both are exchange-blocks | await-own, straight
// between the tensors and the rails.
//
// broadcast: acquire, publish-root (the root copies the slice into its input
//   area; everyone says it is there), exchange-root (between nodes, local rank
//   x takes chunk x: from the root's input area to every other node on the
//   root's node, into its output area elsewhere) | gather-root (the root's
//   input area, or every chunk, into the tensor), release.  A node of one
//   rank: exchange-root | gather-root, between the tensor and the rails.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/op_key.h"
#include "pipeline/mover.h"
#include "pipeline/node_slots.h"
#include "pipeline/rail_exchange.h"
#include "pipeline/slice.h"
#include "topology/topology.h"

namespace fairring {

enum class Phase {
  kAcquire, kPublishInput, kReduceChunk, kExchange, kGather, kRelease,
  kStageBlocks, kReduceBlocks, kPublishBlock, kExchangeBlocks, kAwaitOwn, kGatherBlocks,
  kPublishRoot, kExchangeRoot, kGatherRoot,
};
const char* phase_name(Phase p);

struct PhaseList {
  std::vector<Phase> phases;
  size_t front = 0;  // phases[0, front) are the front half
};

// The phases of `collective` on a node of `ranks_per_node` ranks (pure).
PhaseList phases_of(Collective collective, int ranks_per_node);

class SliceSchedule {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // `rail` is null on a single node.  All three outlive the schedule.
  SliceSchedule(const Topology& topo, int slots, NodeSlots& node, Mover& mover, RailExchange* rail);

  // Run the slice's front or back half from where it stopped.  With `until`
  // null the waits block (or, on a device, the work is enqueued); otherwise
  // they spin until then at most and return false, and a later call resumes.
  bool front(Slice& s, const TimePoint* until);
  bool back(Slice& s, const TimePoint* until);
  bool front_done(const Slice& s) const;

  // The slice's chunk is final (from the rail's callback, or the exchange
  // phase on one node): copy it where the node's peers read it, publish it.
  void publish_chunk(uint64_t slice_seq);

 private:
  bool run(Slice& s, const TimePoint* until, bool front_half);
  bool acquire(Slice& s, const TimePoint* until);
  // Our input is in the slot (for the peers); every peer's is, and every
  // peer claimed the slot for the same collective (else the mismatch error).
  void input_published(Slice& s);
  bool inputs_in(Slice& s, const TimePoint* until);
  void publish_input(Slice& s);
  bool reduce_chunk(Slice& s, const TimePoint* until);
  void exchange(Slice& s);
  bool gather(Slice& s, const TimePoint* until);
  void release(Slice& s);
  // A rail task of the slice (its number, slot and key); the phase adds the data.
  RailTask rail_task(const Slice& s) const;
  void stage_blocks(Slice& s);
  bool reduce_blocks(Slice& s, const TimePoint* until);
  void publish_block(Slice& s);
  void exchange_blocks(Slice& s);
  bool await_own(Slice& s, const TimePoint* until);
  bool gather_blocks(Slice& s, const TimePoint* until);
  void publish_root(Slice& s);
  bool exchange_root(Slice& s, const TimePoint* until);
  bool gather_root(Slice& s, const TimePoint* until);

  // Blockwise: where piece (node j, local x) of the slice is, in a tensor of
  // one block per rank, in the rank's own block, and in the slot areas.
  char* block_at(const at::Tensor& t, const Slice& s, int j, int x) const;
  char* own_piece(const at::Tensor& t, const Slice& s) const;
  int64_t staged_at(const Slice& s, int j, int x) const;
  // Our chunk of the slice, if the plan gave us one.
  bool owns_chunk(const Slice& s) const { return me_ < s.plan.num_chunks(); }
  // Whether this rank carries its chunk of the slice to other nodes.
  bool carries_chunk(const Slice& s) const { return rail_ != nullptr && owns_chunk(s); }
  char* tensor_at(const Slice& s) const;
  int64_t divisor(const Slice& s) const;

  Topology topo_;
  const int k_;
  const int me_;
  NodeSlots& node_;
  Mover& mover_;
  RailExchange* rail_;
  const PhaseList& list_of(const Slice& s) const;
  PhaseList allreduce_;
  PhaseList reduce_scatter_;
  PhaseList all_gather_;
  PhaseList broadcast_;

  // Per slot: where our final chunk is copied for the node's peers once the
  // rails are done with it.  Written by the front half before the rail post,
  // read by publish_chunk (on the rail's thread), which the rail's queue
  // orders after it.
  struct Mirror {
    const char* from = nullptr;
    char* to = nullptr;
    int64_t bytes = 0;
  };
  std::vector<Mirror> mirrors_;
};

}  // namespace fairring
