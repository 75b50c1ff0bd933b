// The gather: every rank's tensor into block r (the sender) of the root's
// output, blockwise (plan.h): the root's output holds one block per rank,
// every input one.  For local rank `me` of K, N nodes, the root local rank
// R of node RN:
//
//   front: acquire        wait until every peer released the slot; claim it
//          publish-piece  on the root's node (elsewhere a passive rank, for
//                         its carrier), our piece into our input area
//          exchange       N > 1: our piece on our rail to the root's node
//                         (kExchange, one piece per node, empty but for the
//                         root's node); there, rail x's pieces land in the
//                         node's output area (R's: in its output)
//   back:  to-root        R copies every piece of its node's peers, and every
//                         piece their rails brought, into its output
//          await-own      N > 1: the rail is done with our task
//          release        we are done with the slot
//
// On uneven nodes rail x also carries the pieces of the passive ranks x + R,
// x + 2R... (plan.h): rail_span(x) pieces per node, the missing ones empty.
// Each piece crosses the network once and the root's node's memory once.
// A node of one rank: exchange | to-root | await-own.
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

std::pair<int, int> root_place(SliceSchedule& p, const Slice& s) { return p.topo().place_of(s.op->root); }

bool publish_piece(SliceSchedule& p, Slice& s, const TimePoint*) {
  const auto [root_node, root_local] = root_place(p, s);
  const bool root_node_here = p.topo().node == root_node;
  if ((root_node_here && p.me() != root_local) || (!root_node_here && !p.owns_chunk(s))) {
    const int slot = p.slot(s);
    p.mover().copy(slot, p.mover().input_area(slot, p.me()), p.own_piece(s.op->buffer, s),
                   s.plan.slice.count * p.esize(s), false);
  }
  p.input_published(s);
  return true;
}

bool exchange(SliceSchedule& p, Slice& s, const TimePoint* until) {
  p.set_mirror(s, nullptr, nullptr, 0);                  // the root reads what our rail brought itself
  if (!p.multi_node() || !p.owns_chunk(s)) return true;  // a passive rank's carrier takes its piece
  const auto [root_node, root_local] = root_place(p, s);
  const int node = p.topo().node;
  const int slot = p.slot(s);
  const int rails = p.topo().rails;
  // Away from the root's node we also carry our passive peers' pieces.
  if (node != root_node && !p.carried_inputs_in(s, until)) return false;
  const int64_t count = s.plan.slice.count;
  char* ours = p.own_piece(s.op->buffer, s);
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kExchange;
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int i = 0; i < p.rail_span(p.me()); ++i) {
      const int x = p.me() + i * rails;  // the piece of local rank x
      const bool sent = j == root_node && node != root_node && x < p.k();
      const bool brought = node == root_node && j != node && x < p.node_size(j);
      t.shards.push_back(Range{0, sent ? count : 0});
      t.pieces.push_back(!sent || x == p.me() ? ours : p.mover().input_area(slot, x));
      t.received.push_back(Range{0, brought ? count : 0});
      char* landing = ours;  // (nothing lands)
      if (brought) {
        landing = p.me() == root_local ? p.output_block(s, j, x)
                                       : p.mover().output_area(slot, p.me()) + p.staged_at(s, j, x) * p.esize(s);
      }
      t.landings.push_back(landing);
    }
  }
  p.post(std::move(t));
  return true;
}

bool to_root(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.inputs_in(s, until)) return false;
  if (p.topo().rank != s.op->root) return true;
  // Every peer's rail brought its pieces (ours landed in place).
  const int rails = p.multi_node() ? s.plan.num_chunks() : 0;
  for (int r = 0; r < rails; ++r) {
    if (r != p.me() && !p.node().wait_chunk(s.id(), r, until)) return false;
  }
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const int64_t bytes = s.plan.slice.count * esize;
  const int node = p.topo().node;
  const bool large = p.large(op.numel * p.topo().size * esize);
  for (int x = 0; x < p.k(); ++x) {
    if (x == p.me()) {
      p.mover().copy(slot, p.output_block(s, node, x), p.own_piece(op.buffer, s), bytes, large);
      continue;
    }
    p.mover().after(slot, x, PeerStep::kInputReady);
    p.mover().copy(slot, p.output_block(s, node, x), p.mover().input_area(slot, x), bytes, large);
  }
  for (int r = 0; r < rails; ++r) {
    if (r == p.me()) continue;  // our rail's pieces landed in our output
    p.mover().after(slot, r, PeerStep::kChunkDone);
    for (int j = 0; j < p.topo().num_nodes; ++j) {
      if (j == node) continue;
      p.for_rail(r, j, [&](int x) {
        p.mover().copy(slot, p.output_block(s, j, x), p.mover().output_area(slot, r) + p.staged_at(s, j, x) * esize,
                       bytes, large);
      });
    }
  }
  return true;
}

}  // namespace

const CollectiveDef& gather_def() {
  static const ScriptedCollective def(
      Collective::kGather,
      [](const OpKey& k) { return elements_of(k) + " per rank to rank " + std::to_string(k.root); }, Cut::kBlockwise,
      Shape::blocks_out().with_root(),
      Script{{{"acquire", step_acquire}, {"publish-piece", publish_piece}, {"exchange", exchange}},
             {{"to-root", to_root}, {"await-own", step_await_rails}, {"release", step_release}}},
      Script{{{"exchange", exchange}}, {{"to-root", to_root}, {"await-own", step_await_rails}}});
  return def;
}

}  // namespace fairring
