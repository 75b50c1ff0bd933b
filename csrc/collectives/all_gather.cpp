// The all-gather, blockwise (plan.h), for local rank `me` of K, N nodes:
//
//   front: acquire          wait until every peer released the slot; claim it
//          publish-block    our piece into its carrier's chunk of the output
//                           area (our own chunk, unless we are passive)
//          await-carried    uneven nodes: the pieces of the passive ranks our
//                           rail carries are in our chunk
//          exchange-blocks  N > 1: our chunk's pieces to every node, theirs
//                           into our chunk (share); passive ranks skip it
//   back:  gather-blocks    every chunk into the output
//          release          we are done with the slot
//
// On a node of one rank: exchange-blocks | await-own, straight between the
// tensors and the rails (on equal nodes; on uneven ones a rail carries
// several ranks' pieces, and the node steps stage them).
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

bool publish_block(SliceSchedule& p, Slice& s, const TimePoint*) {
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  p.mover().copy(slot, p.mover().output_area(slot, p.carrier(p.me())) + p.staged_at(s, p.topo().node, p.me()) * esize,
                 p.own_piece(s.op->buffer, s), s.plan.slice.count * esize, false);
  // No input area to share, but every other script waits for every peer's
  // input before check_match: a peer that issued another collective must
  // get there and see the mismatch, not wait for an input that never comes.
  p.input_published(s);
  return true;
}

bool await_carried(SliceSchedule& p, Slice& s, const TimePoint* until) { return p.carried_inputs_in(s, until); }

bool exchange_blocks(SliceSchedule& p, Slice& s, const TimePoint*) {
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const int node = p.topo().node;
  p.set_mirror(s, nullptr, nullptr, 0);  // nothing for the node's peers to read
  if (!p.owns_chunk(s)) return true;     // passive: our carrier takes our piece
  if (!p.staged(s)) {
    // Our own block of the output (unless the input is that block already).
    char* to = p.output_block(s, node, 0);
    const char* from = p.own_piece(op.buffer, s);
    if (to != from) p.mover().copy(slot, to, from, s.plan.slice.count * esize, false);
  }
  if (!p.multi_node()) {
    p.publish_chunk(s.seq);
    return true;
  }
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kShare;
  t.shards = s.plan.shards[p.me()];
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    char* piece;
    if (p.staged(s)) {  // shard j: node j's pieces of our rail, ours first
      piece = p.mover().output_area(slot, p.me()) + p.staged_at(s, j, p.me()) * esize;
    } else {
      piece = j == node ? p.own_piece(op.buffer, s) : p.output_block(s, j, 0);
    }
    t.pieces.push_back(piece);
  }
  p.post(std::move(t));
  return true;
}

bool gather_blocks(SliceSchedule& p, Slice& s, const TimePoint* until) {
  const int chunks = s.plan.num_chunks();
  if (!p.wait_chunks(s, chunks, until)) return false;
  p.node().check_match(s.id());
  const PipelineOp& op = *s.op;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const bool large = p.large(op.numel * p.topo().size * esize);
  for (int r = 0; r < chunks; ++r) {
    if (r != p.me()) p.mover().after(slot, r, PeerStep::kChunkDone);
  }
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int x = 0; x < p.node_size(j); ++x) {
      char* to = p.output_block(s, j, x);
      const char* from = p.mover().output_area(slot, p.carrier(x)) + p.staged_at(s, j, x) * esize;
      p.mover().copy(slot, to, from, s.plan.slice.count * esize, large);
    }
  }
  return true;
}

// The all-gather's scripts, which the sizes of an all-to-all share.
const Script& node_script() {
  static const Script script{{{"acquire", step_acquire},
                              {"publish-block", publish_block},
                              {"await-carried", await_carried},
                              {"exchange-blocks", exchange_blocks}},
                             {{"gather-blocks", gather_blocks}, {"release", step_release}}};
  return script;
}
const Script& alone_script() {
  static const Script script{{{"exchange-blocks", exchange_blocks}}, {{"await-own", step_await_own}}};
  return script;
}
}  // namespace

const CollectiveDef& all_gather_def() {
  static const ScriptedCollective def(
      Collective::kAllGather, [](const OpKey& k) { return elements_of(k) + " per rank"; }, Cut::kBlockwise,
      Shape::blocks_out(), node_script(), alone_script());
  return def;
}

// An all-to-all of unequal blocks first shares every rank's block sizes
// (backend: all_to_all_uneven): an all-gather under its own kind, so that a
// rank that issued something else instead is told what its peers ran.
const CollectiveDef& all_to_all_sizes_def() {
  static const ScriptedCollective def(
      Collective::kAllToAllSizes,
      [](const OpKey&) { return std::string("the block sizes of an all_to_all with splits"); }, Cut::kBlockwise,
      Shape::blocks_out(), node_script(), alone_script());
  return def;
}

}  // namespace fairring
