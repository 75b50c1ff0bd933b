// How an all-reduce is cut: slices (pipelined one after another), chunks (one
// per local rank, the intra-node reduce-scatter) and shards (one per node, the
// rail's reduction servers).  Pure arithmetic, shared by the CPU and CUDA paths.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"

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
  int64_t min_chunk_bytes = 64 << 10; // a chunk smaller than this is not split among more ranks
  int64_t min_shard_bytes = 32 << 10; // a shard smaller than this is not split among more nodes
  int64_t align_bytes = 64;           // cache line: keeps kernels' loads aligned
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
SlicePlan plan_slice(
    int64_t numel,
    int64_t elem_size,
    int64_t index,
    int ranks_per_node,
    int num_nodes,
    const PlanParams& params);

// An upper bound on the bytes of any shard of any slice plan_slice makes with
// these parameters, for sizing the reduction servers' staging buffers.
int64_t max_shard_bytes(const PlanParams& params, int ranks_per_node, int num_nodes);

}  // namespace fairring
