// The broadcast: the root's slice to every rank, for local rank `me` of K,
// N nodes:
//
//   front: acquire        wait until every peer released the slot; claim it
//          publish-root   the root copies the slice into its input area;
//                         everyone says it is there
//          exchange-root  between nodes, local rank x takes chunk x: from the
//                         root's input area to every other node on the root's
//                         node, into its output area elsewhere (share)
//   back:  gather-root    the root's input area, or every chunk, into the tensor
//          release        we are done with the slot
//
// A node of one rank: exchange-root | gather-root, between the tensor and
// the rails.
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

bool publish_root(SliceSchedule& p, Slice& s, const TimePoint*) {
  // Everyone publishes (the others nothing): waiting for every peer's input
  // is what says every peer has claimed the slot, for check_match.
  const int slot = p.slot(s);
  if (p.topo().rank == s.op->root) {
    p.mover().copy(slot, p.mover().input_area(slot, p.me()), p.tensor_at(s), s.plan.slice.count * p.esize(s), false);
  }
  p.input_published(s);
  return true;
}

bool exchange_root(SliceSchedule& p, Slice& s, const TimePoint* until) {
  const int slot = p.slot(s);
  p.set_mirror(s, nullptr, nullptr, 0);
  // Between nodes, each local rank carries its chunk of the slice (if the
  // plan gives it one) on its rail, after its node agreed on the op.  A rank
  // with nothing to carry checks the op in gather_root: waiting for the
  // root's copy here, in the front half, would hold back the copies out of
  // the slices before it (the root and its peers would take turns).
  if (!p.carries_chunk(s)) return true;
  if (p.k() > 1 && !p.inputs_in(s, until)) return false;
  const PipelineOp& op = *s.op;
  const auto [root_node, root_local] = p.topo().place_of(op.root);
  const Range own = s.plan.chunks[p.me()];
  char* chunk;
  if (p.topo().node == root_node) {
    chunk = p.k() == 1 ? p.tensor_at(s) : p.mover().input_area(slot, root_local);
    if (root_local != p.me()) p.mover().after(slot, root_local, PeerStep::kInputReady);
  } else {
    chunk = p.k() == 1 ? p.tensor_at(s) : p.mover().output_area(slot, p.me());
  }
  chunk += own.offset * p.esize(s);
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kShare;
  // Shared by the root's node; the other nodes' shards are empty.
  t.shards.assign(p.topo().num_nodes, Range{0, 0});
  t.shards[root_node].count = own.count;
  t.pieces.assign(p.topo().num_nodes, chunk);
  p.post(std::move(t));
  return true;
}

bool gather_root(SliceSchedule& p, Slice& s, const TimePoint* until) {
  const PipelineOp& op = *s.op;
  const auto [root_node, root_local] = p.topo().place_of(op.root);
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const bool large = p.large(op.numel * esize);
  if (p.k() > 1 && !p.carries_chunk(s) && !p.inputs_in(s, until)) return false;
  // Between nodes, every chunk's exchange carried every node's key (sent
  // after its node's check_match), so once they are over no node ran another
  // collective; on the root's node they are also done reading the root's area.
  if (p.multi_node() && !p.wait_chunks(s, s.plan.num_chunks(), until)) return false;
  if (p.topo().node == root_node) {
    if (p.me() != root_local) {
      p.mover().after(slot, root_local, PeerStep::kInputReady);
      p.mover().copy(slot, p.tensor_at(s), p.mover().input_area(slot, root_local), s.plan.slice.count * esize, large);
    }
    return true;
  }
  if (p.k() == 1) return true;  // the rail wrote into the tensor
  for (int x = 0; x < s.plan.num_chunks(); ++x) {
    const Range& r = s.plan.chunks[x];
    if (x != p.me()) p.mover().after(slot, x, PeerStep::kChunkDone);
    p.mover().copy(slot, p.tensor_at(s) + r.offset * esize, p.mover().output_area(slot, x) + r.offset * esize,
                   r.count * esize, large);
  }
  return true;
}

}  // namespace

const CollectiveDef& broadcast_def() {
  static const ScriptedCollective def(
      Collective::kBroadcast,
      [](const OpKey& k) { return std::to_string(k.numel) + " bytes from rank " + std::to_string(k.root); },
      Cut::kWhole, Shape::whole().with_root(),
      Script{{{"acquire", step_acquire}, {"publish-root", publish_root}, {"exchange-root", exchange_root}},
             {{"gather-root", gather_root}, {"release", step_release}}},
      Script{{{"exchange-root", exchange_root}}, {{"gather-root", gather_root}}});
  return def;
}

}  // namespace fairring
