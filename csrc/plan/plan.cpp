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
  const int world = ranks_per_node * num_nodes;
  const int64_t slices = num_slices(cut, numel, elem_size, world, params);
  if (index < 0 || index >= slices) {
    throw Error(ErrorKind::kBackend, "plan_slice: slice index out of range");
  }
  SlicePlan plan;
  plan.slice = nth_even_range(std::max<int64_t>(numel, 0), slices, align_elems(elem_size, params), index);
  const int64_t piece = plan.slice.count;
  for (int x = 0; x < ranks_per_node; ++x) {
    plan.chunks.push_back(Range{int64_t{x} * num_nodes * piece, num_nodes * piece});
    std::vector<Range> shards;
    for (int j = 0; j < num_nodes; ++j) shards.push_back(Range{j * piece, piece});
    plan.shards.push_back(std::move(shards));
  }
  return plan;
}

int64_t max_shard_bytes(const PlanParams& params, int ranks_per_node, int num_nodes) {
  // A chunk is a 1/K share of a full slice, or below min_chunk_bytes when the
  // slice was too small to use every rank; a shard likewise.  The slack covers
  // rounding to aligned boundaries and the unaligned tail of the last range.
  const int64_t slack = 4 * params.align_bytes;
  const int64_t chunk = std::max(params.slice_bytes / ranks_per_node, params.min_chunk_bytes) + slack;
  return std::max(chunk / num_nodes, params.min_shard_bytes) + slack;
}

}  // namespace fairring
