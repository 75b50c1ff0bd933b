// Multi-input element-wise reduction on the CPU.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "common/reduce_op.h"

namespace fairring {

// out[i] = in[0][i] (op) in[1][i] (op) ... (op) in[n-1][i], combined strictly in
// the order 0..n-1 so that the result is the same bits on every rank and run.
// Half types (float16, bfloat16) accumulate in float32 and are rounded once.
// `out` may be exactly one of the inputs (same pointer), never partially overlap.
// If `divisor` > 0 the combined value is divided by it before it is stored
// (AVG's final step; floating types only).
void reduce_cpu(c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int num_inputs, int64_t count,
                int64_t divisor);

// Empty string if (dtype, op) is supported, else a sentence saying why not.
std::string reduce_unsupported_reason(c10::ScalarType dtype, RedOp op);

}  // namespace fairring
