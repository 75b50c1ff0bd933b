// The all-to-all: block d of every rank's input goes to rank d, into block
// s (the sender) of its output.  Blockwise (plan.h): the input and the
// output both hold one block per rank; blocks of unequal sizes are cut as
// blocks of the largest, each piece only as long as its block
// (piece_count: a short block's later pieces are empty, and move nothing).
// Hierarchical, for local rank `me` of K, N nodes:
//
//   front: acquire          wait until every peer released the slot; claim it
//          publish-blocks   our pieces for the other local ranks' rails into
//                           our input area, grouped by the local rank they
//                           go to: the piece for (node j, local x) at
//                           staged_at(j, x); ours we read from the tensor
//          exchange-blocks  N > 1: wait for the node's inputs; every other
//                           node's pieces for local rank `me`, read from each
//                           peer's input area, go on our rail (kExchange),
//                           and that node's pieces for us land in our output
//   back:  local-blocks     the pieces of our node's ranks for us, from
//                           their input areas into our output
//          await-own        N > 1: the rail is done with our task
//          release          we are done with the slot
//
// So every byte crosses the node's memory once on each side and each rail
// carries only what its rank receives: the "2D" all-to-all.  A node of one
// rank: exchange-blocks | await-own, straight between the tensors and the
// rails.
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

bool publish_blocks(SliceSchedule& p, Slice& s, const TimePoint*) {
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  char* area = p.mover().input_area(slot, p.me());
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int x = 0; x < p.k(); ++x) {
      if (x == p.me()) continue;
      const int64_t count = p.piece_count(s, p.topo().rank, p.rank_of(j, x));
      if (count > 0)
        p.mover().copy(slot, area + p.staged_at(s, j, x) * esize, p.input_block(s, j, x), count * esize, false);
    }
  }
  p.input_published(s);
  return true;
}

bool exchange_blocks(SliceSchedule& p, Slice& s, const TimePoint* until) {
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const int node = p.topo().node;
  const int rank = p.topo().rank;
  p.set_mirror(s, nullptr, nullptr, 0);  // nothing for the node's peers to read
  const int64_t own = p.piece_count(s, rank, rank);
  if (p.k() == 1 && own > 0) {
    // Our own block stays with us.
    p.mover().copy(slot, p.output_block(s, node, 0), p.input_block(s, node, 0), own * esize, false);
  }
  if (!p.multi_node()) return true;
  // The pieces we carry are read from every peer's input area.
  if (p.k() > 1 && !p.inputs_in(s, until)) return false;
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kExchange;
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int x = 0; x < p.k(); ++x) {
      // Piece x for node j: from local rank x (to node j's rank `me`);
      // node j's piece x: from its local rank x, to us.
      char* from;
      if (x == p.me()) {
        from = p.input_block(s, j, x);
      } else {
        if (x != p.me() && j != node) p.mover().after(slot, x, PeerStep::kInputReady);
        from = p.mover().input_area(slot, x) + p.staged_at(s, j, p.me()) * esize;
      }
      t.shards.push_back(Range{0, j == node ? 0 : p.piece_count(s, p.rank_of(node, x), p.rank_of(j, p.me()))});
      t.pieces.push_back(from);
      t.received.push_back(Range{0, j == node ? 0 : p.piece_count(s, p.rank_of(j, x), rank)});
      t.landings.push_back(p.output_block(s, j, x));
    }
  }
  p.post(std::move(t));
  return true;
}

bool local_blocks(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.inputs_in(s, until)) return false;
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const int node = p.topo().node;
  const bool large = p.large(op.numel * p.topo().size * esize);
  for (int x = 0; x < p.k(); ++x) {
    const char* from;
    if (x == p.me()) {
      from = p.input_block(s, node, x);
    } else {
      p.mover().after(slot, x, PeerStep::kInputReady);
      from = p.mover().input_area(slot, x) + p.staged_at(s, node, p.me()) * esize;
    }
    const int64_t count = p.piece_count(s, p.rank_of(node, x), p.topo().rank);
    if (count > 0) p.mover().copy(slot, p.output_block(s, node, x), from, count * esize, large);
  }
  return true;
}

}  // namespace

const CollectiveDef& all_to_all_def() {
  static const ScriptedCollective def(
      Collective::kAllToAll,
      {"all_to_all", [](const OpKey& k) { return (k.layout != 0 ? "up to " : "") + elements_of(k) + " per block"; }},
      Cut::kBlockwise,
      Script{{{"acquire", step_acquire},
              {"publish-blocks", publish_blocks},
              {"exchange-blocks", exchange_blocks},
              {"local-blocks", local_blocks},
              {"await-own", step_await_rails},
              {"release", step_release}},
             3},
      Script{{{"exchange-blocks", exchange_blocks}, {"await-own", step_await_rails}}, 1},
      /*on_uneven_nodes=*/false);  // each piece goes to one rank: flat there (plan.h)
  return def;
}

}  // namespace fairring
