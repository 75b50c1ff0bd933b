#include "plan/rail_levels.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace fairring {

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw Error(ErrorKind::kBackend, "fairring: bad rail levels: " + what);
}

// Nodes of the levels after `level`: a digit of `level` is worth this much.
int stride_of(const std::vector<int>& dims, int level) {
  int stride = 1;
  for (size_t l = level + 1; l < dims.size(); ++l) stride *= dims[l];
  return stride;
}

}  // namespace

std::vector<int> rail_levels(int num_nodes, int radix) {
  if (num_nodes < 2 || radix >= num_nodes || radix < 2) return {num_nodes};
  std::vector<int> primes;
  int n = num_nodes;
  for (int p = 2; p * p <= n; ++p) {
    while (n % p == 0) {
      primes.push_back(p);
      n /= p;
    }
  }
  if (n > 1) primes.push_back(n);
  // Largest first, each merged into the first level it fits in (first fit
  // decreasing): the fewest levels this radix allows, near even.
  std::sort(primes.rbegin(), primes.rend());
  std::vector<int> dims;
  for (int p : primes) {
    auto fits = std::find_if(dims.begin(), dims.end(), [&](int d) { return d * p <= radix; });
    if (fits != dims.end()) {
      *fits *= p;
    } else {
      dims.push_back(p);
    }
  }
  std::sort(dims.rbegin(), dims.rend());
  return dims;
}

int auto_rail_radix(int num_nodes) {
  // Measured on simulated nodes of one rank (docs/BENCHMARKS_HISTORY.md,
  // "Rails in levels"): 16 nodes in levels of 8 and 2 took 0.78x the direct
  // exchange's time at 256 KiB (16 KiB shards) and 1.05-1.08x from 1 MiB (64
  // KiB shards: chunk_in_levels keeps those direct); 32 nodes in levels of 8
  // and 4 0.49x at 256 KiB and 0.72x at 1 MiB (32 KiB shards), even at 4 MiB
  // (128 KiB shards, kept direct).  Fewer nodes were not measured in levels
  // and stay direct.
  return num_nodes < kLevelsFrom ? num_nodes : kAutoRadix;
}

std::vector<RailLevel> walk_levels(const std::vector<int>& dims, const std::vector<Range>& shards, int node,
                                   int num_nodes) {
  int product = 1;
  for (int d : dims) {
    if (d < 2 && dims.size() > 1) refuse("a level of " + std::to_string(d) + " nodes");
    product *= d;
  }
  if (product != num_nodes) refuse("levels for " + std::to_string(product) + " nodes on " + std::to_string(num_nodes));
  if (node < 0 || node >= num_nodes) refuse("no node " + std::to_string(node));
  const int num_shards = static_cast<int>(shards.size());
  if (num_shards < 1 || num_shards > num_nodes) refuse(std::to_string(num_shards) + " shards");
  if (!shards_contiguous(shards)) refuse("shards not contiguous");
  const int64_t end = shards.back().offset + shards.back().count;
  // Where shard i starts (missing shards are empty, at the end).
  const auto at = [&](int i) { return i < num_shards ? shards[i].offset : end; };
  std::vector<RailLevel> levels(dims.size());
  int first = 0;  // the shards the level splits: [first, first + span)
  int span = num_nodes;
  for (size_t l = 0; l < dims.size(); ++l) {
    RailLevel& lv = levels[l];
    const int stride = stride_of(dims, static_cast<int>(l));
    lv.me = (node / stride) % dims[l];
    const int each = span / dims[l];
    for (int v = 0; v < dims[l]; ++v) {
      lv.group.push_back(node + (v - lv.me) * stride);
      const int lo = first + v * each;
      lv.parts.push_back(Range{at(lo), at(lo + each) - at(lo)});
    }
    first += lv.me * each;
    span = each;
  }
  return levels;
}

bool chunk_in_levels(const std::vector<Range>& shards, int num_nodes, int64_t elem_size, bool by_node_count) {
  if (static_cast<int>(shards.size()) != num_nodes || !shards_contiguous(shards)) return false;
  if (!by_node_count) return true;
  return std::all_of(shards.begin(), shards.end(),
                     [&](const Range& r) { return r.count * elem_size <= num_nodes * kLevelsShardBytesPerNode; });
}

bool shards_contiguous(const std::vector<Range>& shards) {
  for (size_t i = 1; i < shards.size(); ++i) {
    if (shards[i].offset != shards[i - 1].offset + shards[i - 1].count) return false;
  }
  return true;
}

int shards_per_part(const std::vector<int>& dims, int level) {
  // A part of level l holds one shard per node of the levels after it.
  return stride_of(dims, level);
}

int level_of_peer(const std::vector<int>& dims, int node, int peer) {
  for (size_t l = 0; l < dims.size(); ++l) {
    const int stride = stride_of(dims, static_cast<int>(l));
    // Same digits above and below this one: a peer of this level.
    if (node / (stride * dims[l]) == peer / (stride * dims[l]) && node % stride == peer % stride) {
      return static_cast<int>(l);
    }
  }
  return -1;
}

}  // namespace fairring
