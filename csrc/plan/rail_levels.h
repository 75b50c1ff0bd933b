// The all-reduce's rail in levels: the nodes as the digits of a mixed radix
// (dims d_0 ... d_{L-1}, their product the node count, d_0 the most
// significant), and the direct shard exchange run once per digit among the
// nodes that differ only in it.  Level l splits what is left of the chunk
// into d_l parts, each node of the level's group reduces one, and the next
// level splits that part; after the last, node j holds shard j summed over
// every node, as the direct exchange leaves it.  The sums then go back level
// by level, last first, each part to its group.  One level (dims = {N}) is
// the direct exchange; all dims 2 is recursive halving and doubling.  A rank
// sends sum(d_l - 1) pieces each way instead of N - 1 (15 at 16 nodes, 6 in
// two levels of 4, 4 in four of 2), the same bytes, in 2L rounds instead of
// two (docs/ARCHITECTURE.md, "Rails in levels").
//
// Pure arithmetic, no I/O: the TCP rail (RailStage) runs it.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"

namespace fairring {

// The levels of `num_nodes` nodes with at most `radix` nodes per group
// (its prime factors, largest first, merged while the product stays within
// `radix`; a prime factor above `radix` is a level of its own).  `radix` of
// at least `num_nodes`, or a prime node count: one level, the direct exchange.
std::vector<int> rail_levels(int num_nodes, int radix);

// The radix a group of `num_nodes` nodes uses when the user set none
// (FAIRRING_RAIL_RADIX=0): the direct exchange below kLevelsFrom nodes,
// levels of at most kAutoRadix from there (rail_levels.cpp says what was
// measured).
constexpr int kLevelsFrom = 16;
constexpr int kAutoRadix = 8;
int auto_rail_radix(int num_nodes);

// Whether a chunk cut into these shards (of `elem_size` bytes an element)
// goes in levels: when it has a shard for every node and, with the radix
// picked by node count (`by_node_count`; a radix the user set applies to
// every such chunk), none of them above kLevelsShardBytesPerNode x the node
// count.  A smaller chunk has a few
// reducers already (one below 2 x 8 KiB), which the direct exchange reaches
// in two rounds; levels would add rounds of mostly empty messages.  Larger
// shards are messages that cost little beside their bytes: there the extra
// rounds and reduce passes of levels cost more than the messages they save,
// and the more nodes, the more messages levels save (16 nodes: up to 16 KiB
// shards, 32: 32 KiB).
constexpr int64_t kLevelsShardBytesPerNode = 1 << 10;
bool chunk_in_levels(const std::vector<Range>& shards, int num_nodes, int64_t elem_size, bool by_node_count);

struct RailLevel {
  std::vector<int> group;    // its nodes, by digit: group[v] has digit v here
  int me = 0;                // our digit: group[me] is our node
  std::vector<Range> parts;  // in the chunk (elements): part v is reduced by group[v]
};

// Node `node`'s levels over a chunk cut into these shards (contiguous, in
// order, at most one per node; missing ones empty at the end), for levels
// `dims`.  levels[l].parts[me] is what level l + 1 splits; the last one's is
// our shard.  Throws an Error on shards that are not contiguous or dims
// whose product is not `num_nodes`.
std::vector<RailLevel> walk_levels(const std::vector<int>& dims, const std::vector<Range>& shards, int node,
                                   int num_nodes);

// Whether the shards follow one another in the chunk (walk_levels needs it).
bool shards_contiguous(const std::vector<Range>& shards);

// How many shards a part of level `level` holds at most: what a staging
// buffer for a peer of that level needs, in shards of the plan's bound.
int shards_per_part(const std::vector<int>& dims, int level);

// The level (index into dims) at which node `peer` is in `node`'s group
// (it differs from `node` in that digit alone), or -1: in none, the two
// never exchange a message.
int level_of_peer(const std::vector<int>& dims, int node, int peer);

}  // namespace fairring
