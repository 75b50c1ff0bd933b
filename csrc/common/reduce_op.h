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

// Where an AVG divides: a node's reduction of its ranks' terms by `node`,
// the rails' reduction of the nodes' sums by `rail` (0: no division there).
// On one node, the node.  Between nodes, the rails divide the sum of all
// once, except for float16 on nodes of several ranks: a node stores its sum
// in the tensor's dtype for the rails, and in float16 that sum can pass the
// largest value (65504) where the average does not.  There each node
// divides its sum by its rank count (in float, rounded once: the node's
// average, as large as the inputs at most) and the rails by the node count;
// on uneven nodes the node divides by the world (NCCL's premultiplied AVG;
// a rank alone on its node that runs no node steps scales its input) and
// the rails only add.
struct AvgDivisors {
  int64_t node = 0;
  int64_t rail = 0;
};
inline AvgDivisors avg_divisors(RedOp op, c10::ScalarType dtype, int world, int num_nodes, int largest_node,
                                bool uneven) {
  if (op != RedOp::kAvg) return {};
  if (num_nodes == 1) return {world, 0};
  if (dtype != c10::kHalf || largest_node == 1) return {0, world};
  if (!uneven) return {largest_node, num_nodes};
  return {world, 0};
}

}  // namespace fairring
