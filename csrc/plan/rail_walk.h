// One rank's part in the rail exchange of a chunk, as lists of transfers:
// which shard it sends to which node, what it receives from whom, whether it
// reduces, and in which of two rounds.  Pure arithmetic over the task's rail
// pattern and shard list, written once: the TCP rail (RailStage) posts these
// transfers as messages, the NCCL rail as grouped sends and receives, and
// the staged CUDA rail copies the shards the walk reads and writes; so all
// of them pair up the same way, and a rail never sees which collective runs.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"

namespace fairring {

// What a rail does with a task's shards.  Each pattern serves several
// collectives.
enum class RailPattern : int32_t {
  // Our piece of shard j goes to node j, which reduces every node's piece
  // (node order, divided for AVG) and sends the sum back to the nodes
  // `back_to` names: every node (all-reduce, barrier: the chunk then holds
  // every reduced shard), none (reduce-scatter: node j keeps its sum), or
  // one (a reduce: the root's node; the others get an empty answer, so that
  // every rank hears that its server matched its op).
  kReduce = 1,
  // Our shard to every node; node j's lands in shard j.  Empty shards are
  // empty messages (all-gather; broadcast, where only the root's node has one).
  kShare = 2,
  // Personalized: every node sends each other node pieces meant for it alone
  // (all-to-all).  The task has P pieces per node: shards[m * P + p] is our
  // p-th piece for node m, received[m * P + p] the p-th piece node m sends
  // us (its count: what we expect).  Nothing is reduced; our own node's
  // pieces do not travel.
  kExchange = 3,
};

// kReduce: where the served sums go (a node index, or one of these).
constexpr int kBackToAll = -1;
constexpr int kBackToNone = -2;

// One message between this node and `node`, of shard `shard` of the chunk
// (its range is the task's shards[shard]).  `count` elements; 0 is an empty
// message, which carries only the op's key (a transport that matches keys
// sends it; one that does not, NCCL, skips it on both ends alike).
struct Transfer {
  int node = 0;
  int shard = 0;
  int64_t count = 0;
};

// Whether any of these transfers moves data (count > 0).
bool carries_data(const std::vector<Transfer>& transfers);

struct RailWalk {
  RailPattern pattern = RailPattern::kReduce;
  // Round one.  kReduce: our piece of shard j to its server j, and, if we
  // serve, every other node's piece of our shard (into a staging buffer per
  // node).  kShare: our shard to every node, and theirs into place.
  // kExchange: our pieces for every other node, and theirs for us (a
  // receive's shard indexes `received`, where it lands).
  std::vector<Transfer> sends;
  std::vector<Transfer> receives;
  // kReduce, when we serve shard `node` (a small chunk has fewer shards than
  // nodes: the nodes past them serve nothing): once round one's receives
  // are in, the pieces are reduced in node order, ours included.
  bool reduces = false;
  int served = -1;  // our shard, when reduces
  int64_t served_count = 0;
  // Round two, kReduce: the served sum back to the contributors (count 0:
  // the empty answer), and the sums of the other shards from their servers
  // into place (count 0: an empty answer, nothing lands).
  std::vector<Transfer> sum_sends;
  std::vector<Transfer> sum_receives;

  // Whether a sum with data leaves: compressed rails round it once, and the
  // server's own copy gets the same bits.
  bool sends_sum_data() const;
  // The chunk's shards the walk reads (sent, or reduced with the others)
  // and those it writes into place (received, or reduced), in shard order,
  // non-empty ones only.  (The staged CUDA rail moves exactly these.)
  std::vector<int> shards_read() const;
  std::vector<int> shards_written() const;
};

// The walk of a chunk with these shards (SlicePlan::shards[k], shard j
// served by node j; at most `num_nodes` of them; kShare: exactly one per
// node), seen from node `node` of `num_nodes`; kExchange: P pieces per
// node both ways, `shards` sent and `received` expected.  Throws an Error on
// arguments no plan produces.
RailWalk walk_rail(RailPattern pattern, int back_to, const std::vector<Range>& shards, int node, int num_nodes,
                   const std::vector<Range>& received = {});

}  // namespace fairring
