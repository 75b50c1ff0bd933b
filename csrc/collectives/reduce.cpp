// The reduce: every rank's tensor summed (or MAX, ...) into the root's;
// the other ranks' tensors are only read.  The all-reduce's cut and its
// first steps, then the sums go to the root only: for local rank `me` of K,
// with N nodes,
//
//   front: acquire        wait until every peer released the slot; claim it
//          publish-input  our slice (minus our own chunk) into our input area
//          reduce-chunk   wait for the peers' inputs; reduce our chunk: the
//                         root in place, the others into their output area
//          exchange       N > 1: each shard to its server node, whose sum goes
//                         to the root's node only (kReduce, back to one node)
//   back:  to-root        the root copies every other chunk of its node into
//                         its tensor; the others wait until the rails are done
//                         with their chunk
//          release        we are done with the slot
//
// A node of one rank: exchange | to-root, the non-root's served sums in a
// scratch tensor (the op's `output`), never in its own.  A small slice on
// one node is "replicated": the root reduces all of it, nothing is gathered.
#include "collectives/collectives.h"
#include "collectives/shared_steps.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

bool is_root(SliceSchedule& p, const Slice& s) { return p.topo().rank == s.op->root; }

// Where our chunk's reduction goes: the root's tensor, else our output area
// (for the root to read); on a node of one rank the tensor, only read.
char* chunk_at(SliceSchedule& p, const Slice& s) {
  const int64_t offset = s.plan.chunks[p.me()].offset * p.esize(s);
  if (is_root(p, s) || p.k() == 1) return p.tensor_at(s) + offset;
  return p.mover().output_area(p.slot(s), p.me()) + offset;
}

bool reduce_chunk(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.inputs_in(s, until)) return false;
  const bool replicated = s.plan.replicated;
  if (replicated ? !is_root(p, s) : !p.owns_chunk(s)) return true;
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const Range r = replicated ? Range{0, s.plan.slice.count} : s.plan.chunks[p.me()];
  const void* inputs[kMaxLocalRanks];
  for (int x = 0; x < p.k(); ++x) {
    if (x != p.me()) p.mover().after(slot, x, PeerStep::kInputReady);
    inputs[x] = (x == p.me() ? p.tensor_at(s) : p.mover().input_area(slot, x)) + r.offset * esize;
  }
  char* out = replicated ? p.tensor_at(s) : chunk_at(p, s);
  p.mover().reduce(slot, op.dtype, op.op, out, inputs, p.k(), r.count, p.node_divisor(s));
  return true;
}

bool exchange(SliceSchedule& p, Slice& s, const TimePoint*) {
  if (s.plan.replicated || !p.owns_chunk(s)) return true;
  p.set_mirror(s, nullptr, nullptr, 0);  // the root reads our output area itself
  if (!p.multi_node()) {
    p.publish_chunk(s.seq);
    return true;
  }
  const int node = p.topo().node;
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kReduce;
  t.back_to = p.topo().place_of(s.op->root).first;
  t.chunk = chunk_at(p, s);
  t.shards = s.plan.shards[p.me()];
  if (p.k() == 1 && !is_root(p, s) && node < static_cast<int>(t.shards.size())) {
    // Our chunk is our tensor: the sum we serve goes to the scratch.
    const int64_t at = s.plan.chunks[p.me()].offset + t.shards[node].offset;
    t.result = p.own_piece(s.op->output, s) + at * p.esize(s);
  }
  p.post(std::move(t));
  return true;
}

bool to_root(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (s.plan.replicated) return true;
  // The others wait until the rails are done with their chunk's memory.
  if (!is_root(p, s)) return !p.owns_chunk(s) || p.node().wait_chunk(s.id(), p.me(), until);
  return step_gather(p, s, until);
}

}  // namespace

const CollectiveDef& reduce_def() {
  static const ScriptedCollective def(
      Collective::kReduce,
      [](const OpKey& k) { return elements_of(k) + with_op(k) + " to rank " + std::to_string(k.root); }, Cut::kWhole,
      Shape::whole().with_root(),
      Script{{{"acquire", step_acquire},
              {"publish-input", step_publish_input},
              {"reduce-chunk", reduce_chunk},
              {"exchange", exchange}},
             {{"to-root", to_root}, {"release", step_release}}},
      Script{{{"exchange", exchange}}, {{"to-root", to_root}}});
  return def;
}

}  // namespace fairring
