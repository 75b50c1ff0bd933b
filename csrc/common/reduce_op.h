// The reduction operations Fairring implements, independent of c10d's enum so
// that kernels and the schedule do not depend on the backend glue.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace fairring {

enum class RedOp : int32_t {
  kSum = 0,
  kAvg = 1,  // summed like kSum; the final value is divided by the world size
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
};

inline const char* redop_name(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return "SUM";
    case RedOp::kAvg:
      return "AVG";
    case RedOp::kProduct:
      return "PRODUCT";
    case RedOp::kMin:
      return "MIN";
    case RedOp::kMax:
      return "MAX";
    case RedOp::kBand:
      return "BAND";
    case RedOp::kBor:
      return "BOR";
    case RedOp::kBxor:
      return "BXOR";
  }
  return "?";
}

// Whether an AVG between nodes divides before the rails instead of after
// them.  A node of several ranks stores its sum in the tensor's dtype for
// the rails, and in float16 that sum can pass the largest value (65504)
// where the average does not.  Such a group divides every node's sum by the
// group size as the node reduces it (in float, rounded once; NCCL
// premultiplies the same way), a node of one rank its input, and the rails
// only add.  Other dtypes hold any sum the average can: divided once, last.
inline bool avg_divides_per_node(RedOp op, c10::ScalarType dtype, int num_nodes, int largest_node) {
  return op == RedOp::kAvg && dtype == c10::kHalf && num_nodes > 1 && largest_node > 1;
}

}  // namespace fairring
