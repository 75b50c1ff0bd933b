#include "common/config.h"

#include <algorithm>
#include "common/error.h"

#include <stdexcept>

namespace fairring {

namespace {
void check_range(const char* var, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    throw Error(ErrorKind::kInvalidArgument, std::string(var) + " must be between " + std::to_string(lo) + " and " +
                                                 std::to_string(hi) + " bytes, got " + std::to_string(v));
  }
}
}  // namespace

int64_t auto_slice_size(int64_t configured, int ranks, int nodes) {
  if (nodes < 2) return configured;
  return std::max(configured, std::min(limits::kMaxAutoSliceSize, ranks * limits::kAutoSliceBytesPerRank));
}

void validate(const Config& c) {
  check_range("FAIRRING_SLICE_SIZE", c.slice_size, limits::kMinSliceSize, limits::kMaxSliceSize);
  check_range("FAIRRING_TOTAL_MEMORY", c.total_memory, 1, limits::kMaxTotalMemory);
  if (c.parallelism < 1 || c.parallelism > limits::kMaxParallelism) {
    throw Error(ErrorKind::kInvalidArgument, "FAIRRING_PARALLELISM must be between 1 and " +
                                                 std::to_string(limits::kMaxParallelism) + ", got " +
                                                 std::to_string(c.parallelism));
  }
  if (c.gpu_transport != "tcp" && c.gpu_transport != "nccl") {
    throw Error(ErrorKind::kInvalidArgument, "FAIRRING_GPU_TRANSPORT must be tcp or nccl, got " + c.gpu_transport);
  }
  if (c.wire_dtype != "none" && c.wire_dtype != "bf16" && c.wire_dtype != "fp16") {
    throw Error(ErrorKind::kInvalidArgument, "FAIRRING_WIRE_DTYPE must be none, bf16 or fp16, got " + c.wire_dtype);
  }
  if (c.huge_pages != "advise" && c.huge_pages != "off") {
    throw Error(ErrorKind::kInvalidArgument, "FAIRRING_HUGE_PAGES must be advise or off, got " + c.huge_pages);
  }
  if (c.reduction_servers < 0 || c.reduction_servers > limits::kMaxReductionServers) {
    throw Error(ErrorKind::kInvalidArgument, "FAIRRING_REDUCTION_SERVERS must be between 0 and " +
                                                 std::to_string(limits::kMaxReductionServers) + ", got " +
                                                 std::to_string(c.reduction_servers));
  }
  if (c.rail_radix != 0 && (c.rail_radix < 2 || c.rail_radix > limits::kMaxRailRadix)) {
    throw Error(ErrorKind::kInvalidArgument, "FAIRRING_RAIL_RADIX must be 0 (auto) or between 2 and " +
                                                 std::to_string(limits::kMaxRailRadix) + ", got " +
                                                 std::to_string(c.rail_radix));
  }
  if (c.timeout.count() <= 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "the process group's timeout must be positive, got " + std::to_string(c.timeout.count()) + " ms");
  }
}

}  // namespace fairring
