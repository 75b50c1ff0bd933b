// The scatter: block r of the root's input to rank r, blockwise (plan.h):
// the root's input holds one block per rank, every output one.  For local
// rank `me` of K, N nodes, the root local rank R of node RN:
//
//   front: acquire         wait until every peer released the slot; claim it
//          publish-blocks  R: the pieces for every other local rank into its
//                          input area, the piece for (node j, local x) at
//                          staged_at(j, x)
//          exchange        N > 1: on the root's node, rank x carries the
//                          pieces of every other node's rank x on its rail
//                          (kExchange, one piece per node); elsewhere the
//                          rail brings ours into our output
//   back:  from-root       on the root's node, our piece from R's input area
//                          (R: from its input) into our output; on uneven
//                          nodes a passive rank's from its carrier
//          await-own       N > 1: the rail is done with our task
//          release         we are done with the slot
//
// On uneven nodes rail x also carries the pieces of the passive ranks x + R,
// x + 2R... (plan.h): rail_span(x) pieces per node, the missing ones empty;
// a passive rank's lands in the output area at staged_at, where it takes it.
// Each piece crosses the network once.  A node of one rank: exchange |
// from-root | await-own.
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

std::pair<int, int> root_place(SliceSchedule& p, const Slice& s) { return p.topo().place_of(s.op->root); }

// Root R's piece for (node j, local x), where this rank reads it.
char* root_piece(SliceSchedule& p, const Slice& s, int j, int x) {
  if (p.topo().rank == s.op->root) return p.input_block(s, j, x);
  const int root_local = root_place(p, s).second;
  return p.mover().input_area(p.slot(s), root_local) + p.staged_at(s, j, x) * p.esize(s);
}

bool publish_blocks(SliceSchedule& p, Slice& s, const TimePoint*) {
  if (p.topo().rank == s.op->root) {
    const int slot = p.slot(s);
    char* area = p.mover().input_area(slot, p.me());
    for (int j = 0; j < p.topo().num_nodes; ++j) {
      for (int x = 0; x < p.node_size(j); ++x) {
        if (j == p.topo().node && x == p.me()) continue;
        p.mover().copy(slot, area + p.staged_at(s, j, x) * p.esize(s), p.input_block(s, j, x),
                       s.plan.slice.count * p.esize(s), false);
      }
    }
  }
  p.input_published(s);
  return true;
}

bool exchange(SliceSchedule& p, Slice& s, const TimePoint* until) {
  p.set_mirror(s, nullptr, nullptr, 0);
  if (!p.multi_node() || !p.owns_chunk(s)) return true;  // a passive rank's carrier brings its piece
  const auto [root_node, root_local] = root_place(p, s);
  const int node = p.topo().node;
  const bool root_node_here = node == root_node;
  // On the root's node the pieces we carry are in R's input area.
  if (root_node_here && p.me() != root_local) {
    if (!p.inputs_in(s, until)) return false;
    p.mover().after(p.slot(s), root_local, PeerStep::kInputReady);
  }
  const int64_t count = s.plan.slice.count;
  const int64_t esize = p.esize(s);
  char* ours = p.own_piece(s.op->output, s);
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kExchange;
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int i = 0; i < p.rail_span(p.me()); ++i) {
      const int x = p.me() + i * p.topo().rails;  // the piece of local rank x
      const bool carried = root_node_here && j != node && x < p.node_size(j);
      const bool brought = !root_node_here && j == root_node && x < p.k();
      t.shards.push_back(Range{0, carried ? count : 0});
      t.pieces.push_back(carried ? root_piece(p, s, j, x) : ours);
      t.received.push_back(Range{0, brought ? count : 0});
      t.landings.push_back(
          !brought || x == p.me() ? ours : p.mover().output_area(p.slot(s), p.me()) + p.staged_at(s, node, x) * esize);
    }
  }
  p.post(std::move(t));
  return true;
}

bool from_root(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.inputs_in(s, until)) return false;
  const auto [root_node, root_local] = root_place(p, s);
  const int slot = p.slot(s);
  if (p.topo().node != root_node) {
    if (p.owns_chunk(s)) return true;  // the rail brings ours
    // Passive: our carrier's rail brought ours into the output area.
    if (!p.carrier_done(s, until)) return false;
    const int64_t esize = p.esize(s);
    p.mover().copy(slot, p.own_piece(s.op->output, s),
                   p.mover().output_area(slot, p.carrier(p.me())) + p.staged_at(s, p.topo().node, p.me()) * esize,
                   s.plan.slice.count * esize, false);
    return true;
  }
  if (p.me() != root_local) p.mover().after(slot, root_local, PeerStep::kInputReady);
  const int64_t bytes = s.plan.slice.count * p.esize(s);
  p.mover().copy(slot, p.own_piece(s.op->output, s), root_piece(p, s, root_node, p.me()), bytes,
                 p.large(s.op->numel * p.esize(s)));
  return true;
}

}  // namespace

const CollectiveDef& scatter_def() {
  static const ScriptedCollective def(
      Collective::kScatter,
      [](const OpKey& k) { return elements_of(k) + " per rank from rank " + std::to_string(k.root); }, Cut::kBlockwise,
      Shape::blocks_in().with_root(),
      Script{{{"acquire", step_acquire}, {"publish-blocks", publish_blocks}, {"exchange", exchange}},
             {{"from-root", from_root}, {"await-own", step_await_rails}, {"release", step_release}}},
      Script{{{"exchange", exchange}}, {{"from-root", from_root}, {"await-own", step_await_rails}}});
  return def;
}

}  // namespace fairring
