// The tensors Fairring makes for itself in place of a caller's (a list
// flattened into one buffer, a strided tensor's contiguous copy, a stand-in
// output copied back at the end): on CPU, from the process's cache of host
// blocks (common/host_blocks.h), so that an op on a large list does not
// fault in fresh pages every time (docs/BENCHMARKS_HISTORY.md, "Uneven reduce_scatter
// list").  Small ones and device tensors: at::empty.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/host_blocks.h"

namespace fairring {

// A contiguous tensor of `numel` elements of `options`' dtype and device;
// its contents are undefined.
at::Tensor stand_in(int64_t numel, const at::TensorOptions& options);

}  // namespace fairring
