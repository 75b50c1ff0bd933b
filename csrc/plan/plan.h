// How a collective is cut: slices (pipelined one after another), chunks (one
// per local rank, the intra-node reduce-scatter) and shards (one per node, the
// rail's reduction servers).  Pure arithmetic, shared by the CPU and CUDA paths.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/op_key.h"

namespace fairring {

struct Range {
  int64_t offset = 0;  // in elements
  int64_t count = 0;
  bool operator==(const Range& o) const { return offset == o.offset && count == o.count; }
};

// `count` elements cut into `parts` contiguous ranges, as even as possible with
// every boundary on a multiple of `align` elements.  Ranges can be empty when
// there is less data than parts * align.
std::vector<Range> split_even(int64_t count, int parts, int64_t align);

struct PlanParams {
  int64_t slice_bytes = limits::kDefaultSliceSize;  // largest slice
  int64_t min_chunk_bytes = 64 << 10;               // a chunk smaller than this is not split among more ranks
  int64_t min_shard_bytes = 8 << 10;                // a shard smaller than this is not split among more nodes
  int64_t align_bytes = 64;                         // cache line: keeps kernels' loads aligned
};

struct SlicePlan {
  Range slice;                             // in the tensor
  std::vector<Range> chunks;               // in the slice; chunk k is reduced by local rank k
  std::vector<std::vector<Range>> shards;  // shards[k][j] in chunk k; served by node j
  // Too small to split among the ranks of a single node: every local rank
  // reduces the whole slice from the others' inputs, which saves the
  // all-gather's synchronisation.  (With several nodes one rank reduces it
  // and takes it to the rail.)
  bool replicated = false;
  int num_chunks() const { return static_cast<int>(chunks.size()); }
  int num_shards() const { return shards.empty() ? 0 : static_cast<int>(shards[0].size()); }
};

// Number of slices an all-reduce of `numel` elements uses (at least one, so
// that even an empty tensor is matched between ranks).
int64_t num_slices(int64_t numel, int64_t elem_size, const PlanParams& params);

// The plan of slice `index` of that all-reduce on K ranks per node, N nodes.
// Small slices use fewer chunks and shards (the small-message path): fewer,
// larger pieces cost fewer synchronisations and messages; see `replicated`.
SlicePlan plan_slice(int64_t numel, int64_t elem_size, int64_t index, int ranks_per_node, int num_nodes,
                     const PlanParams& params);

// How a collective cuts its tensor.  kWhole: the all-reduce's cut above.
// kBlockwise (reduce-scatter, all-gather): the big tensor holds one block
// of `numel` elements per rank (W in all, in rank order) and the small one a
// single block.  Slice i is the same piece of every block, and the slot
// areas hold the slice's W pieces grouped by the rail that carries them:
// local rank x's piece is carried by local rank x % R (R rails: the smallest
// node's rank count), chunk r holds the pieces rail r carries, shard j of it
// node j's, in local-rank order.  On equal nodes (R = K) that is piece
// (node j, local x) at (x * N + j) * c, c = slice.count: chunk x is local
// rank x's pieces of every node, shard j of it node j's piece.  On unequal
// nodes a larger node's shard holds several pieces (its passive ranks' too).
enum class Cut { kWhole, kBlockwise };

// Whether a rank runs its collective's node steps, through the node's slot
// areas: several ranks on its node, or a blockwise op on uneven nodes (its
// pieces travel with the node's).  Otherwise it runs the script for a rank
// alone, straight from and into its tensors.
inline bool runs_node_steps(Cut cut, int ranks_on_node, bool uneven_nodes) {
  return ranks_on_node > 1 || (uneven_nodes && cut == Cut::kBlockwise);
}

// Whether the slot areas (slice_bytes each) hold a blockwise slice of W
// pieces of this element size (the pieces are at least one aligned unit).
bool blockwise_fits(int64_t elem_size, int world, const PlanParams& params);

// The slices and the plan of slice `index` of an op cut by `cut` on
// `ranks_per_node` x `num_nodes` ranks.
int64_t num_slices(Cut cut, int64_t numel, int64_t elem_size, int world, const PlanParams& params);
SlicePlan plan_slice(Cut cut, int64_t numel, int64_t elem_size, int64_t index, int ranks_per_node, int num_nodes,
                     const PlanParams& params);
// The pieces a blockwise slice is cut for on nodes of these rank counts: one
// per rank, or, where a passive rank of an all-to-all receives more pieces
// than that (its carrier lands them in the output area: K - R passive ranks
// of a node of K, W - K pieces each from the other nodes), as many as those.
int blockwise_slice_pieces(const std::vector<int>& node_sizes);
// The same on nodes of these rank counts, equal or not (kWhole: cut for the
// rails, the smallest node's count; kBlockwise: into
// blockwise_slice_pieces(node_sizes) pieces).
SlicePlan plan_slice(Cut cut, int64_t numel, int64_t elem_size, int64_t index, const std::vector<int>& node_sizes,
                     const PlanParams& params);
// Where piece (node j, local x) of a blockwise slice planned as above is in
// the slot areas, in elements.
int64_t blockwise_staged_at(const SlicePlan& plan, int j, int x);

// Bytes that hold a rank's whole part of an exchange (RailPattern::kExchange:
// all-to-all, gather, scatter) of one blockwise slice, its sent and its
// received pieces side by side, when a slice of W pieces fills at most
// `slice_area` bytes: a rank sends at most (N-1) K pieces of the slice and
// receives as many, against the N K pieces in the slice.  (The staged CUDA
// rail's pinned memory per slot, cuda_rails.h.)
int64_t exchange_staging_bytes(int64_t slice_area, int num_nodes);

// An upper bound on the bytes of any shard of any slice plan_slice makes with
// these parameters, for sizing the reduction servers' staging buffers.
// `largest_node` above `ranks_per_node` (the rails of unequal nodes): also
// the blockwise shards of a larger node, several pieces each.
int64_t max_shard_bytes(const PlanParams& params, int ranks_per_node, int num_nodes, int largest_node = 0);

}  // namespace fairring
