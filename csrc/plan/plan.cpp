#include "plan/plan.h"
#include "common/error.h"

#include <algorithm>
#include <stdexcept>

namespace fairring {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t align_elems(int64_t elem_size, const PlanParams& p) { return std::max<int64_t>(1, p.align_bytes / elem_size); }

int64_t slice_elems(int64_t elem_size, const PlanParams& p) {
  const int64_t align = align_elems(elem_size, p);
  return std::max(align, (p.slice_bytes / elem_size) / align * align);
}
}  // namespace

// Range i of split_even, computed directly (a tensor can have many slices).
static Range nth_even_range(int64_t count, int64_t parts, int64_t align, int64_t i) {
  // Whole aligned blocks are dealt out evenly, the first `extra` ranges get one
  // more; the last range also takes the unaligned tail.
  const int64_t blocks = count / align;
  const int64_t base = blocks / parts;
  const int64_t extra = blocks % parts;
  const int64_t first_block = i * base + std::min(i, extra);
  const int64_t nblocks = base + (i < extra ? 1 : 0);
  const int64_t offset = first_block * align;
  const int64_t n = (i == parts - 1) ? count - offset : nblocks * align;
  return Range{offset, n};
}

std::vector<Range> split_even(int64_t count, int parts, int64_t align) {
  if (parts < 1 || align < 1 || count < 0) {
    throw Error(ErrorKind::kInvalidArgument, "split_even: bad arguments");
  }
  std::vector<Range> out(parts);
  for (int i = 0; i < parts; ++i) out[i] = nth_even_range(count, parts, align, i);
  return out;
}

int64_t num_slices(int64_t numel, int64_t elem_size, const PlanParams& params) {
  if (numel <= 0) return 1;
  return ceil_div(numel, slice_elems(elem_size, params));
}

SlicePlan plan_slice(int64_t numel, int64_t elem_size, int64_t index, int ranks_per_node, int num_nodes,
                     const PlanParams& params) {
  const int64_t align = align_elems(elem_size, params);
  const int64_t slices = num_slices(numel, elem_size, params);
  if (index < 0 || index >= slices) {
    throw Error(ErrorKind::kBackend, "plan_slice: slice index out of range");
  }
  SlicePlan plan;
  plan.slice = nth_even_range(std::max<int64_t>(numel, 0), slices, align, index);

  const int64_t bytes = plan.slice.count * elem_size;
  const int chunks = static_cast<int>(
      std::clamp<int64_t>(ceil_div(std::max<int64_t>(bytes, 1), params.min_chunk_bytes), 1, ranks_per_node));
  plan.chunks = split_even(plan.slice.count, chunks, align);
  plan.replicated = chunks == 1 && ranks_per_node > 1 && num_nodes == 1;

  const int64_t chunk_bytes = bytes / chunks;
  const int shards = static_cast<int>(
      std::clamp<int64_t>(ceil_div(std::max<int64_t>(chunk_bytes, 1), params.min_shard_bytes), 1, num_nodes));
  for (const Range& c : plan.chunks) {
    plan.shards.push_back(split_even(c.count, shards, align));
  }
  return plan;
}

namespace {
// The largest piece of a block in a blockwise slice: W pieces, each at most
// one aligned unit longer than this (nth_even_range's tail), fit in a slice.
int64_t piece_elems(int64_t elem_size, int world, const PlanParams& p) {
  const int64_t align = align_elems(elem_size, p);
  return std::max(align, (slice_elems(elem_size, p) / world) / align * align - align);
}
}  // namespace

bool blockwise_fits(int64_t elem_size, int world, const PlanParams& params) {
  return world * (piece_elems(elem_size, world, params) + align_elems(elem_size, params)) * elem_size <=
         params.slice_bytes;
}

int64_t exchange_staging_bytes(int64_t slice_area, int num_nodes) {
  if (num_nodes < 2) return slice_area;
  return std::max(slice_area, ceil_div(slice_area * 2 * (num_nodes - 1), num_nodes));
}

int64_t num_slices(Cut cut, int64_t numel, int64_t elem_size, int world, const PlanParams& params) {
  if (cut == Cut::kWhole) return num_slices(numel, elem_size, params);
  if (numel <= 0) return 1;
  return ceil_div(numel, piece_elems(elem_size, world, params));
}

SlicePlan plan_slice(Cut cut, int64_t numel, int64_t elem_size, int64_t index, int ranks_per_node, int num_nodes,
                     const PlanParams& params) {
  if (cut == Cut::kWhole) return plan_slice(numel, elem_size, index, ranks_per_node, num_nodes, params);
  return plan_slice(cut, numel, elem_size, index, std::vector<int>(static_cast<size_t>(num_nodes), ranks_per_node),
                    params);
}

int blockwise_slice_pieces(const std::vector<int>& node_sizes) {
  if (node_sizes.empty()) return 1;
  const int rails = *std::min_element(node_sizes.begin(), node_sizes.end());
  int world = 0;
  for (int k : node_sizes) world += k;
  int pieces = world;
  for (int k : node_sizes) pieces = std::max(pieces, (k - rails) * (world - k));
  return pieces;
}

SlicePlan plan_slice(Cut cut, int64_t numel, int64_t elem_size, int64_t index, const std::vector<int>& node_sizes,
                     const PlanParams& params) {
  const int rails = node_sizes.empty() ? 0 : *std::min_element(node_sizes.begin(), node_sizes.end());
  if (rails < 1) throw Error(ErrorKind::kBackend, "plan_slice: a node without ranks");
  const int num_nodes = static_cast<int>(node_sizes.size());
  if (cut == Cut::kWhole) return plan_slice(numel, elem_size, index, rails, num_nodes, params);
  const int64_t slices = num_slices(cut, numel, elem_size, blockwise_slice_pieces(node_sizes), params);
  if (index < 0 || index >= slices) {
    throw Error(ErrorKind::kBackend, "plan_slice: slice index out of range");
  }
  SlicePlan plan;
  plan.slice = nth_even_range(std::max<int64_t>(numel, 0), slices, align_elems(elem_size, params), index);
  const int64_t piece = plan.slice.count;
  // Chunk r: rail r's pieces, node by node; node j's are those of its local
  // ranks r, r + R, r + 2R...  (one on equal nodes).
  int64_t at = 0;
  for (int r = 0; r < rails; ++r) {
    const int64_t start = at;
    std::vector<Range> shards;
    for (int k : node_sizes) {
      const int64_t pieces = (k - r + rails - 1) / rails;
      shards.push_back(Range{at - start, pieces * piece});
      at += pieces * piece;
    }
    plan.chunks.push_back(Range{start, at - start});
    plan.shards.push_back(std::move(shards));
  }
  return plan;
}

int64_t blockwise_staged_at(const SlicePlan& plan, int j, int x) {
  const int rails = plan.num_chunks();
  const int r = x % rails;
  return plan.chunks[r].offset + plan.shards[r][j].offset + int64_t{x / rails} * plan.slice.count;
}

int64_t max_shard_bytes(const PlanParams& params, int ranks_per_node, int num_nodes, int largest_node) {
  // A chunk is a 1/K share of a full slice, or below min_chunk_bytes when the
  // slice was too small to use every rank; a shard likewise.  The slack covers
  // rounding to aligned boundaries and the unaligned tail of the last range.
  const int64_t slack = 4 * params.align_bytes;
  const int64_t chunk = std::max(params.slice_bytes / ranks_per_node, params.min_chunk_bytes) + slack;
  const int64_t bound = std::max(chunk / num_nodes, params.min_shard_bytes) + slack;
  if (largest_node <= ranks_per_node) return bound;
  // A blockwise shard of the largest node: ceil(largest / R) pieces of a
  // slice cut into W >= largest + (N - 1) R of them (piece_elems), each at
  // most one aligned unit, and a tail, longer than its share.
  const int64_t world = largest_node + int64_t{num_nodes - 1} * ranks_per_node;
  const int64_t pieces = (largest_node + ranks_per_node - 1) / ranks_per_node;
  const int64_t piece = std::max(params.align_bytes, params.slice_bytes / world) + 2 * params.align_bytes;
  return std::max(bound, pieces * piece + slack);
}

}  // namespace fairring
