// The all-reduce, for local rank `me` of K, with N nodes:
//
//   front: acquire        wait until every peer released the slot; claim it
//          publish-input  our slice (minus our own chunk) into our input area
//          reduce-chunk   wait for the peers' inputs; reduce our chunk in place
//          exchange       N > 1: the chunk to the rails (reduce and return);
//                         then, or at once on one node, publish-chunk copies
//                         it to our output area and publishes it
//   back:  gather         wait for every chunk; copy the others' into the tensor
//          release        we are done with the slot
//
// A node of one rank skips the node steps.  A small slice on one node is
// "replicated": every rank reduces all of it and nothing is gathered.  A
// barrier is an all-reduce of one byte: every rank's input must be in before
// anyone's result is out.
#include <stdexcept>

#include "collectives/collectives.h"
#include "collectives/shared_steps.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

bool step_publish_input(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint*) {
  // Peers read our input for their chunks only: our own chunk we reduce
  // straight from the tensor, so it is not copied.  A replicated slice is
  // reduced by everyone, so all of it is shared.
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const Range own = p.owns_chunk(s) && !s.plan.replicated ? s.plan.chunks[p.me()] : Range{s.plan.slice.count, 0};
  const char* tensor = p.tensor_at(s);
  char* in = p.mover().input_area(slot, p.me());
  const int64_t tail = own.offset + own.count;
  if (own.offset > 0) p.mover().copy(slot, in, tensor, own.offset * esize, false);
  if (s.plan.slice.count > tail) {
    p.mover().copy(slot, in + tail * esize, tensor + tail * esize, (s.plan.slice.count - tail) * esize, false);
  }
  p.input_published(s);
  return true;
}

bool step_gather(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until) {
  if (s.plan.replicated) return true;
  if (!p.wait_chunks(s, s.plan.num_chunks(), until)) return false;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const bool large = p.large(s.op->numel * esize);
  char* tensor = p.tensor_at(s);
  for (int x = 0; x < s.plan.num_chunks(); ++x) {
    const Range& r = s.plan.chunks[x];
    if (x == p.me() || r.count == 0) continue;  // ours is in the tensor already
    p.mover().after(slot, x, PeerStep::kChunkDone);
    p.mover().copy(slot, tensor + r.offset * esize, p.mover().output_area(slot, x) + r.offset * esize, r.count * esize,
                   large);
  }
  return true;
}

namespace {

using TimePoint = SliceSchedule::TimePoint;

bool reduce_chunk(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.inputs_in(s, until)) return false;
  // A replicated slice is reduced whole, straight into the tensor: the
  // result is complete, nothing to gather.  Otherwise our chunk, if the
  // plan gave us one (a small slice has fewer chunks than ranks).
  if (!s.plan.replicated && !p.owns_chunk(s)) return true;
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const Range r = s.plan.replicated ? Range{0, s.plan.slice.count} : s.plan.chunks[p.me()];
  char* chunk = p.tensor_at(s) + r.offset * esize;
  const void* inputs[kMaxLocalRanks];
  for (int x = 0; x < p.k(); ++x) {
    if (x != p.me()) p.mover().after(slot, x, PeerStep::kInputReady);
    inputs[x] = x == p.me() ? chunk : p.mover().input_area(slot, x) + r.offset * esize;
  }
  p.mover().reduce(slot, op.dtype, op.op, chunk, inputs, p.k(), r.count, p.node_divisor(s));
  return true;
}

bool exchange(SliceSchedule& p, Slice& s, const TimePoint*) {
  if (s.plan.replicated || !p.owns_chunk(s)) return true;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const Range own = s.plan.chunks[p.me()];
  char* chunk = p.tensor_at(s) + own.offset * esize;
  // Our chunk is reduced in place, in our tensor; the peers' gather reads a
  // copy of it in our output area, made once it is final, so that our own
  // gather copies the other chunks only.  A node of one has no peers.
  if (p.k() > 1) {
    p.set_mirror(s, chunk, p.mover().output_area(slot, p.me()) + own.offset * esize, own.count * esize);
  } else {
    p.set_mirror(s, nullptr, nullptr, 0);
  }
  if (!p.multi_node()) {
    p.publish_chunk(s.seq);
    return true;
  }
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kReduce;  // the sums back to every node
  t.chunk = chunk;
  t.shards = s.plan.shards[p.me()];
  p.post(std::move(t));
  return true;
}

Script node_script() {
  return Script{{{"acquire", step_acquire},
                 {"publish-input", step_publish_input},
                 {"reduce-chunk", reduce_chunk},
                 {"exchange", exchange}},
                {{"gather", step_gather}, {"release", step_release}}};
}

Script alone_script() { return Script{{{"exchange", exchange}}, {{"gather", step_gather}}}; }

}  // namespace

const CollectiveDef& all_reduce_def() {
  static const ScriptedCollective def(
      Collective::kAllReduce, [](const OpKey& k) { return elements_of(k) + with_op(k); }, Cut::kWhole, Shape::whole(),
      node_script(), alone_script());
  return def;
}

const CollectiveDef& barrier_def() {
  static const ScriptedCollective def(
      Collective::kBarrier, [](const OpKey&) { return std::string(); }, Cut::kWhole, Shape::whole(), node_script(),
      alone_script());
  return def;
}

}  // namespace fairring
