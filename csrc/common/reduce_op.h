// The reduction operations Fairring implements, independent of c10d's enum so
// that kernels and the schedule do not depend on the backend glue.
#pragma once

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

}  // namespace fairring
