// Arguments of the kernels' Python test hooks, parsed once for the CPU
// (kernel_bindings.cpp, which defines these) and the CUDA hooks
// (cuda_kernel_bindings.cpp).  Unknown names raise ValueError.
#pragma once

#include <string>

#include "common/reduce_op.h"
#include "kernels/wire_format.h"

namespace fairring {

// "sum", "AVG", ...: any case.
RedOp parse_redop(const std::string& name);
// "bf16" or "fp16".
HalfFormat parse_half_format(const std::string& name);

}  // namespace fairring
