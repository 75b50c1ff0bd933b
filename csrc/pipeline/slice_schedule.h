// The slice primitives, and the runner of a collective's script over them.
// Written once for every device and every collective: each collective's
// script is one file under collectives/ (collective_def.h), a short list of
// named steps over these primitives; each primitive goes through NodeSlots
// (the node protocol), a Mover (how the device moves and reduces memory)
// and, with several nodes, a RailExchange (which runs rail patterns, never
// collectives).
//
// The primitives, for local rank `me` of K on a node, N nodes:
//   acquire          wait until every peer released the slot; claim it
//   input_published  our part of the slice is in our input area: say so
//   inputs_in        wait for every peer's input; check they run the same op
//   post             hand a rail task (a pattern over the chunk's shards) to
//                    the rails; the rail's callback runs publish_chunk
//   publish_chunk    our chunk is final: mirror it where the peers read it
//                    (set_mirror), publish it
//   wait_chunks      wait until chunks [0, n) of the slice are published
//   release          we are done with the slot
// plus the mover's copy/reduce/after/done and the slice's geometry
// (tensor_at, block_at, staged_at, node_divisor...).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/op_key.h"
#include "node/node_slots.h"
#include "pipeline/collective_def.h"
#include "pipeline/mover.h"
#include "pipeline/slice.h"
#include "rails/rail_exchange.h"
#include "topology/topology.h"

namespace fairring {

class SliceSchedule {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // `rail` is null on a single node and on a passive rank (topology.h).  All
  // three outlive the schedule.
  SliceSchedule(const Topology& topo, int slots, NodeSlots& node, Mover& mover, RailExchange* rail);

  // Run the slice's front or back half from where it stopped.  With `until`
  // null the waits block (or, on a device, the work is enqueued); otherwise
  // they spin until then at most and return false, and a later call resumes.
  bool front(Slice& s, const TimePoint* until);
  bool back(Slice& s, const TimePoint* until);
  bool front_done(const Slice& s) const;

  // ---- The primitives the collectives' scripts are written in ----

  const Topology& topo() const { return topo_; }
  int k() const { return k_; }    // ranks on this node
  int me() const { return me_; }  // our local rank
  // Several nodes (a passive rank among them has no rail of its own).
  bool multi_node() const { return topo_.num_nodes > 1; }
  Mover& mover() { return mover_; }
  NodeSlots& node() { return node_; }
  int slot(const Slice& s) const { return node_.slot(s.seq); }
  static int64_t esize(const Slice& s) { return c10::elementSize(s.op->dtype); }

  bool acquire(Slice& s, const TimePoint* until);
  // Records the slot's input-ready event and publishes our input.
  void input_published(Slice& s);
  bool inputs_in(Slice& s, const TimePoint* until);
  // Chunks [0, n) of the slice are published (by whoever owns them).
  bool wait_chunks(Slice& s, int n, const TimePoint* until);
  void release(Slice& s);

  // A rail task of the slice (its number, slot and key, and what the rails
  // divide an AVG by); the step adds the
  // pattern and the data, then posts it (between nodes only: on one node
  // the step's chunk is final at once, and it calls publish_chunk itself).
  RailTask rail_task(const Slice& s) const;
  void post(RailTask task);
  // Where our chunk is copied for the node's peers once it is final (none:
  // nothing to copy); read by publish_chunk.
  void set_mirror(const Slice& s, const char* from, char* to, int64_t bytes);
  // The slice's chunk is final (from the rail's callback, or post() on one
  // node): copy it where the node's peers read it, publish it.
  void publish_chunk(uint64_t slice_seq);

  // Geometry.  The slice in the op's buffer.
  char* tensor_at(const Slice& s) const;
  // AVG's divisor (0: none) where the node's ranks are reduced
  // (reduce_op.h); the rails' is in rail_task().
  int64_t node_divisor(const Slice& s) const { return avg_divisors(s).node; }
  // Our chunk of the slice, if the plan gave us one.
  bool owns_chunk(const Slice& s) const { return me_ < s.plan.num_chunks(); }
  // Whether this rank carries its chunk of the slice to other nodes.
  bool carries_chunk(const Slice& s) const { return rail_ != nullptr && owns_chunk(s); }
  // Whether the slice goes through the node's slot areas (the script with
  // the node steps: plan.h, runs_node_steps).
  bool staged(const Slice& s) const;
  // Blockwise: the ranks of node j, and the local rank whose rail carries
  // local rank x's pieces (plan.h: x % R).  A rank that owns no chunk of a
  // blockwise slice is passive: its carrier moves its pieces.
  int node_size(int j) const { return static_cast<int>(topo_.node_ranks[j].size()); }
  int carrier(int x) const { return x % topo_.rails; }
  // f(x) for each local rank x of node j whose pieces rail r carries:
  // r, r + R, r + 2R...
  template <typename F>
  void for_rail(int r, int j, F f) const {
    for (int x = r; x < node_size(j); x += topo_.rails) f(x);
  }
  // A carrier: the passive ranks whose pieces we carry have published
  // their input (the device ordered after it).
  bool carried_inputs_in(Slice& s, const TimePoint* until);
  // A passive rank: our carrier's chunk of the slice is published (what it
  // brought us is there; the device ordered after it).
  bool carrier_done(Slice& s, const TimePoint* until);
  // The most pieces of one node that rail `r` carries (1 on equal nodes):
  // the exchanges' pieces per node on that rail, the same on every node.
  int rail_span(int r) const { return (topo_.largest_node - r + topo_.rails - 1) / topo_.rails; }
  // Blockwise: where piece (node j, local x) of the slice is in the op's
  // input and output of one block per rank, in a tensor of a single block,
  // and in the slot areas.
  char* input_block(const Slice& s, int j, int x) const;
  char* output_block(const Slice& s, int j, int x) const;
  char* own_piece(const at::Tensor& t, const Slice& s) const;
  int64_t staged_at(const Slice& s, int j, int x) const;
  // The elements of the slice's piece of the block rank `from` sends rank
  // `to`: slice.count, or fewer (down to none) where an all-to-all's block
  // is shorter than the largest (PipelineOp::block_counts).
  int64_t piece_count(const Slice& s, int from, int to) const;
  // Global rank of local rank x on node j.
  int rank_of(int j, int x) const { return topo_.node_ranks[j][x]; }
  // A result of this many bytes per rank outgrows the cache the node's ranks
  // share once each holds its own and a staged copy (about 2 x K x bytes):
  // it is written with non-temporal stores (caching it would only evict).
  // Below that, the next reader (the caller, the next op) finds it cached.
  bool large(int64_t bytes) const;

 private:
  bool run(Slice& s, const TimePoint* until, bool front_half);
  char* block_at(const at::Tensor& t, const std::vector<at::Tensor>& blocks, const Slice& s, int j, int x) const;
  const Script& script_of(const Slice& s) const;

  AvgDivisors avg_divisors(const Slice& s) const {
    return fairring::avg_divisors(s.op->op, s.op->dtype, topo_.size, topo_.num_nodes, topo_.largest_node, topo_.uneven);
  }

  Topology topo_;
  const int k_;
  const int me_;
  NodeSlots& node_;
  Mover& mover_;
  RailExchange* rail_;

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

// Steps many scripts share: acquire the slot, wait until the rails are done
// with our chunk (await-own), release the slot.
bool step_acquire(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until);
bool step_await_own(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until);
// await-own between nodes only (on one node the step posted no rail task).
bool step_await_rails(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until);
bool step_release(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until);

}  // namespace fairring
