// The tensors Fairring makes for itself in place of a caller's (a list
// flattened into one buffer, a strided tensor's contiguous copy, a stand-in
// output copied back at the end): on CPU, their memory comes from a small
// cache of blocks that earlier ops released, so that an op on a large list
// does not fault in fresh pages every time (about 10 ms per 25 MiB here; on
// a VM that hands freed memory back to its host, sometimes ten times more:
// BENCHMARKS.md, "Uneven reduce_scatter list").  Device tensors: at::empty.
#pragma once

#include <ATen/ATen.h>

namespace fairring {

// A contiguous tensor of `numel` elements of `options`' dtype and device;
// its contents are undefined.
at::Tensor stand_in(int64_t numel, const at::TensorOptions& options);

// The cache's size limits: blocks of at least kMinCachedBytes are kept when
// released, up to kMaxCachedBytes in all (the oldest freed first beyond).
constexpr int64_t kMinCachedBytes = int64_t{1} << 20;
constexpr int64_t kMaxCachedBytes = int64_t{256} << 20;

// Bytes the cache holds now (tests).
int64_t stand_in_cached_bytes();

}  // namespace fairring
