// The reduce-scatter, blockwise (plan.h: slice i is piece i of every rank's
// block; in the slot areas chunk r holds the pieces rail r carries), for
// local rank `me` of K, with N nodes:
//
//   front: acquire          wait until every peer released the slot; claim it
//          stage-blocks     our W pieces into our input area, by chunk (but
//                           those of our own chunk: read from the tensor)
//          reduce-blocks    chunk `me` of every input area: the node's sum of
//                           our rail's pieces (one node: our own piece)
//          exchange-blocks  N > 1: each piece to the node it belongs to, whose
//                           rank reduces them into its output (reduce at server)
//   back:  take-piece       the rails are done with the slice; on uneven
//                           nodes our piece from our carrier's chunk
//          release          we are done with the slot
//
// A passive rank (uneven nodes) only stages its pieces and takes its own.
// On a node of one rank: exchange-blocks | await-own, straight between the
// tensors and the rails (on equal nodes).
//
// Blocks of unequal sizes (a reduce_scatter list of them) are cut as blocks
// of the largest, each piece only as long as its block (piece_count): a
// short block's later pieces are empty, and are neither staged, reduced nor
// sent, so one large block costs what it moves, not W times it.
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

// Our result lands in our output directly, unless our carrier's shard of
// our node holds several pieces (uneven nodes): then the served sum stays
// in the carrier's input area (where it staged nothing: its own chunk is
// read from the tensor), and each rank takes its piece from there.
bool result_staged(const SliceSchedule& p) { return p.multi_node() && p.k() > p.topo().rails; }

// The elements of the slice's piece of block (node j, local x): the same
// from every rank (each rank's list has the same sizes).
int64_t count_of(const SliceSchedule& p, const Slice& s, int j, int x) {
  return p.piece_count(s, p.topo().rank, p.rank_of(j, x));
}

// Shard j of our chunk (the pieces of node j's ranks on our rail, a slice
// apart) up to the end of its last piece that holds data; a shorter piece
// before it leaves a gap that travels but is never read.  Every node
// computes the same length for every shard, so the rails agree on it.
// Equal blocks: the plan's shard, every piece whole.
Range shard_of(const SliceSchedule& p, const Slice& s, int j) {
  Range r = s.plan.shards[p.me()][j];
  int64_t end = 0;
  int64_t at = 0;
  p.for_rail(p.me(), j, [&](int x) {
    const int64_t c = count_of(p, s, j, x);
    if (c > 0) end = at + c;
    at += s.plan.slice.count;
  });
  r.count = end;
  return r;
}

bool stage_blocks(SliceSchedule& p, Slice& s, const TimePoint*) {
  // The peers' chunks only: ours is reduced straight from the tensor.
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  char* in = p.mover().input_area(slot, p.me());
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int x = 0; x < p.node_size(j); ++x) {
      const int64_t count = count_of(p, s, j, x);
      if (p.carrier(x) == p.me() || count == 0) continue;  // (never ours for a passive rank)
      p.mover().copy(slot, in + p.staged_at(s, j, x) * esize, p.input_block(s, j, x), count * esize, false);
    }
  }
  p.input_published(s);
  return true;
}

bool reduce_blocks(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.inputs_in(s, until)) return false;
  if (!p.owns_chunk(s)) return true;  // passive: our carrier reduces our pieces
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  for (int x = 0; x < p.k(); ++x) {
    if (x != p.me()) p.mover().after(slot, x, PeerStep::kInputReady);
  }
  // Our chunk holds the slice of each node's blocks of our rail: reduced one
  // piece at a time, our term read from the tensor, the peers' from their
  // input areas, in local-rank order.  One node: the result is our own
  // piece.  Otherwise it goes to the rails from our output area, and the
  // servers divide (or we do: node_divisor).
  const bool one_node = !p.multi_node();
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    p.for_rail(p.me(), j, [&](int x) {
      const int64_t count = count_of(p, s, j, x);
      if (count == 0) return;
      const int64_t at = p.staged_at(s, j, x) * esize;
      const void* inputs[kMaxLocalRanks];
      for (int y = 0; y < p.k(); ++y) {
        inputs[y] = y == p.me() ? p.input_block(s, j, x) : p.mover().input_area(slot, y) + at;
      }
      char* out = one_node ? p.own_piece(op.output, s) : p.mover().output_area(slot, p.me()) + at;
      p.mover().reduce(slot, op.dtype, op.op, out, inputs, p.k(), count, p.node_divisor(s));
    });
  }
  return true;
}

bool exchange_blocks(SliceSchedule& p, Slice& s, const TimePoint*) {
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  p.set_mirror(s, nullptr, nullptr, 0);  // nothing for the node's peers to read
  if (!p.owns_chunk(s)) return true;     // passive
  if (!p.multi_node()) {
    // A reduce-scatter of one rank is a copy (none if in place).
    if (p.k() == 1) {
      char* to = p.own_piece(op.output, s);
      const char* from = p.input_block(s, p.topo().node, 0);
      const int64_t count = count_of(p, s, p.topo().node, 0);
      if (to != from && count > 0) p.mover().copy(slot, to, from, count * esize, false);
    }
    p.publish_chunk(s.seq);
    return true;
  }
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kReduce;
  t.back_to = kBackToNone;  // each sum stays with its server, in its result
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    t.shards.push_back(shard_of(p, s, j));
    t.pieces.push_back(p.staged(s) ? p.mover().output_area(slot, p.me()) + p.staged_at(s, j, p.me()) * esize
                                   : p.input_block(s, j, 0));  // only read
  }
  t.result = result_staged(p) ? p.mover().input_area(slot, p.me()) + p.staged_at(s, p.topo().node, p.me()) * esize
                              : p.own_piece(op.output, s);
  p.post(std::move(t));
  return true;
}

bool take_piece(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!result_staged(p)) return step_await_own(p, s, until);
  if (!p.carrier_done(s, until)) return false;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const int64_t count = count_of(p, s, p.topo().node, p.me());
  if (count == 0) return true;
  p.mover().copy(slot, p.own_piece(s.op->output, s),
                 p.mover().input_area(slot, p.carrier(p.me())) + p.staged_at(s, p.topo().node, p.me()) * esize,
                 count * esize, false);
  return true;
}

}  // namespace

const CollectiveDef& reduce_scatter_def() {
  static const ScriptedCollective def(
      Collective::kReduceScatter, [](const OpKey& k) { return elements_of(k) + per_rank(k) + with_op(k); },
      Cut::kBlockwise, Shape::blocks_in(),
      Script{{{"acquire", step_acquire},
              {"stage-blocks", stage_blocks},
              {"reduce-blocks", reduce_blocks},
              {"exchange-blocks", exchange_blocks}},
             {{"take-piece", take_piece}, {"release", step_release}}},
      Script{{{"exchange-blocks", exchange_blocks}}, {{"await-own", step_await_own}}});
  return def;
}

}  // namespace fairring
