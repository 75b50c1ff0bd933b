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
//                           staged_at(j, x); those we carry we read from
//                           the tensor
//          exchange-blocks  N > 1: wait for the node's inputs; every other
//                           node's pieces for local rank `me`, read from each
//                           peer's input area, go on our rail (kExchange),
//                           and that node's pieces for us land in our output
//   back:  local-blocks     the pieces of our node's ranks for us, from
//                           their input areas into our output
//          take-landed      uneven nodes, a passive rank: the other nodes'
//                           pieces for us, from where our carrier landed them
//          await-own        N > 1: the rail is done with our task
//          release          we are done with the slot
//
// So every byte crosses the node's memory once on each side and each rail
// carries only what its rank receives: the "2D" all-to-all.  On uneven nodes
// rail x also carries what the passive ranks x + R, x + 2R... send and
// receive (plan.h); their pieces land in the output area (landed_at).  A
// node of one rank: exchange-blocks | await-own, straight between the
// tensors and the rails (on equal nodes).
#include "collectives/collectives.h"
#include "pipeline/slice_schedule.h"

namespace fairring {

namespace {

using TimePoint = SliceSchedule::TimePoint;

// Whether we read our piece for (node j, local x) from the tensor (we carry
// it: our rail's, to another node) rather than stage it for its carrier.
// (A passive rank carries nothing: carrier(x) < R <= me.)
bool carried_from_tensor(const SliceSchedule& p, int j, int x) { return j != p.topo().node && p.carrier(x) == p.me(); }

// Where our rail lands the piece that the `sender`-th rank of the other
// nodes (node by node, local ranks in order) sends our passive node-mate x:
// in the output area, each passive rank's W - K such pieces in that order
// (plan.h's blockwise_slice_pieces leaves room for them).
int64_t landed_at(const SliceSchedule& p, const Slice& s, int x, int64_t sender) {
  return (int64_t{x - p.topo().rails} * (p.topo().size - p.k()) + sender) * s.plan.slice.count;
}

bool publish_blocks(SliceSchedule& p, Slice& s, const TimePoint*) {
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  char* area = p.mover().input_area(slot, p.me());
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int x = 0; x < p.node_size(j); ++x) {
      if ((j == p.topo().node && x == p.me()) || carried_from_tensor(p, j, x)) continue;
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
  if (!p.staged(s) && own > 0) {
    // Our own block stays with us.
    p.mover().copy(slot, p.output_block(s, node, 0), p.input_block(s, node, 0), own * esize, false);
  }
  if (!p.multi_node() || !p.owns_chunk(s)) return true;  // a passive rank's carrier moves its pieces
  // The pieces we carry are read from every peer's input area.
  if (p.k() > 1 && !p.inputs_in(s, until)) return false;
  for (int y = 0; y < p.k(); ++y) {
    if (y != p.me()) p.mover().after(slot, y, PeerStep::kInputReady);
  }
  RailTask t = p.rail_task(s);
  t.pattern = RailPattern::kExchange;
  // Per node, the pieces of the pairs (x, y): from local rank y of the
  // sending node to local rank x = me + i R of the receiving one, at
  // i * largest + y, the same on both ends; the missing pairs are empty.
  const int largest = p.topo().largest_node;
  const int span = p.rail_span(p.me());
  int64_t senders_before = 0;  // ranks of the other nodes before node j
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int i = 0; i < span; ++i) {
      const int x = p.me() + i * p.topo().rails;
      for (int y = 0; y < largest; ++y) {
        const bool sent = j != node && x < p.node_size(j) && y < p.k();
        const bool brought = j != node && x < p.k() && y < p.node_size(j);
        // Piece y for node j: from our local rank y to node j's rank x.
        char* from = p.input_block(s, node, p.me());  // (nothing is sent)
        if (sent) {
          from = y == p.me() ? p.input_block(s, j, x) : p.mover().input_area(slot, y) + p.staged_at(s, j, x) * esize;
        }
        t.shards.push_back(Range{0, sent ? p.piece_count(s, p.rank_of(node, y), p.rank_of(j, x)) : 0});
        t.pieces.push_back(from);
        // Node j's piece y: from its local rank y to our local rank x.
        t.received.push_back(Range{0, brought ? p.piece_count(s, p.rank_of(j, y), p.rank_of(node, x)) : 0});
        char* landing = p.output_block(s, node, p.me());  // (nothing lands)
        if (brought) {
          landing = x == p.me() ? p.output_block(s, j, y)
                                : p.mover().output_area(slot, p.me()) + landed_at(p, s, x, senders_before + y) * esize;
        }
        t.landings.push_back(landing);
      }
    }
    if (j != node) senders_before += p.node_size(j);
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

bool take_landed(SliceSchedule& p, Slice& s, const TimePoint* until) {
  if (!p.multi_node() || p.owns_chunk(s)) return true;
  if (!p.carrier_done(s, until)) return false;
  const int slot = p.slot(s);
  const int64_t esize = p.esize(s);
  const int node = p.topo().node;
  const bool large = p.large(s.op->numel * p.topo().size * esize);
  const char* landed = p.mover().output_area(slot, p.carrier(p.me()));
  int64_t sender = 0;  // the ranks of the other nodes, in landed_at's order
  for (int j = 0; j < p.topo().num_nodes; ++j) {
    for (int y = 0; j != node && y < p.node_size(j); ++y, ++sender) {
      const int64_t count = p.piece_count(s, p.rank_of(j, y), p.topo().rank);
      if (count > 0) {
        p.mover().copy(slot, p.output_block(s, j, y), landed + landed_at(p, s, p.me(), sender) * esize, count * esize,
                       large);
      }
    }
  }
  return true;
}

const Script& node_script() {
  static const Script script{
      {{"acquire", step_acquire}, {"publish-blocks", publish_blocks}, {"exchange-blocks", exchange_blocks}},
      {{"local-blocks", local_blocks},
       {"take-landed", take_landed},
       {"await-own", step_await_rails},
       {"release", step_release}}};
  return script;
}
const Script& alone_script() {
  static const Script script{{{"exchange-blocks", exchange_blocks}}, {{"await-own", step_await_rails}}};
  return script;
}

}  // namespace

const CollectiveDef& all_to_all_def() {
  static const ScriptedCollective def(
      Collective::kAllToAll,
      [](const OpKey& k) {
        return (k.layout != 0 ? "up to " : "") + elements_of(k) + " per block" + unequal_blocks(k);
      },
      Cut::kBlockwise, Shape::blocks_both(), node_script(), alone_script());
  return def;
}

// The all-gather of blocks of unequal sizes (an all_gather list whose
// tensors differ in size): every rank sends its one block to every rank,
// an all-to-all of unequal blocks (PipelineOp::block_counts) under its own
// kind, so that a mismatch names what the caller issued.
const CollectiveDef& all_gatherv_def() {
  static const ScriptedCollective def(
      Collective::kAllGatherV,
      [](const OpKey& k) { return "up to " + elements_of(k) + " per rank" + unequal_blocks(k); }, Cut::kBlockwise,
      Shape::blocks_out(), node_script(), alone_script());
  return def;
}

}  // namespace fairring
