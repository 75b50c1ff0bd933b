// Options of one Fairring process group.  The defaults and limits here are
// the only copy: fairring_py/options.py reads them from the extension, parses
// and validates what the user gave, and validate() checks again here, so a
// Config built by hand cannot overflow a size computation either.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace fairring {

namespace limits {
constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

// Defaults: 1 MiB slices keep the pipeline full from a few MiB on while a
// slice still fits in L2; 4 in flight hide the network's latency; 64 MiB of
// staging per rank covers them for up to 8 ranks per node and 16 nodes.
constexpr int64_t kDefaultSliceSize = 1 * kMiB;
constexpr int64_t kDefaultTotalMemory = 64 * kMiB;
constexpr int kDefaultParallelism = 4;

// A slice below 4 KiB costs more in synchronisation than it moves.
constexpr int64_t kMinSliceSize = 4 * kKiB;
// Above 1 GiB a slice no longer pipelines anything; the bound also keeps
// every size computation (slices x ranks x slots) far from int64 overflow.
constexpr int64_t kMaxSliceSize = 1 * kGiB;
constexpr int64_t kMaxTotalMemory = 1024 * kGiB;
// Each slot holds a slice's staging memory and a set of counters.
constexpr int kMaxParallelism = 64;
// Dedicated reduction servers a group may use (0: none, the workers serve).
constexpr int kMaxReductionServers = 256;
// FAIRRING_RAIL_RADIX: 0 (auto) or 2 and up; any radix from the node count
// up is the direct exchange.
constexpr int kMaxRailRadix = 1 << 20;

// A slice between nodes is cut into a piece per rank, and each piece into a
// message per node: with many ranks, 1 MiB slices make messages of tens of
// KiB, and each costs a round of every rail thread (and a TCP flow's start)
// whatever its size.  So unless the user sets it, a group of several nodes
// uses slices of at least this much per rank, up to kMaxAutoSliceSize:
// 16 nodes of one rank 4 MiB, 8 of one 2 MiB, 2 x 2 and 4 x 1 the 1 MiB
// default (BENCHMARKS: "Many nodes").
constexpr int64_t kAutoSliceBytesPerRank = 256 * kKiB;
constexpr int64_t kMaxAutoSliceSize = 4 * kMiB;
}  // namespace limits

// The slice size of a group of `ranks` ranks on `nodes` nodes when the user
// gave none (`configured`: the default then).
int64_t auto_slice_size(int64_t configured, int ranks, int nodes);

struct Config {
  int64_t slice_size = limits::kDefaultSliceSize;      // bytes per pipelined slice
  bool slice_size_auto = false;                        // not set by the user: auto_slice_size applies
  int64_t total_memory = limits::kDefaultTotalMemory;  // staging bytes per rank (upper bound)
  int parallelism = limits::kDefaultParallelism;       // slices in flight (pipeline depth)
  std::string socket_ifname;                           // "" = address of the hostname
  std::string gpu_transport = "tcp";                   // CUDA all-reduce between nodes: "tcp" or "nccl"
  std::string wire_dtype = "none";  // rails between nodes carry: "none" (input dtype), "bf16", "fp16"
  // Fresh CPU outputs of 2 MiB and more: "advise" huge pages for them
  // (kernels/first_touch.h), or "off".
  std::string huge_pages = "advise";
  // All-reduces between nodes reduced by this many dedicated reduction
  // servers (python -m fairring_py.server) instead of the workers; 0: none.
  int reduction_servers = 0;
  // Nodes per group of the all-reduce's rail levels (plan/rail_levels.h):
  // 0 picks by node count, 2 is halving-doubling, at least the node count
  // the direct exchange.
  int rail_radix = 0;
  std::chrono::milliseconds timeout{30 * 60 * 1000};
  // Not an option: set by the backend from the machine (wait_spin_for).  How
  // long a blocking wait on a node peer spins before it sleeps.
  std::chrono::microseconds wait_spin{0};
};

// Throws an Error of kind kInvalidArgument naming the variable of the first value out of
// its bounds.
void validate(const Config& c);

}  // namespace fairring
