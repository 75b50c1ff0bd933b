// Error text helpers shared by the engine's threads.
#pragma once

#include <cstdio>
#include <string>

namespace fairring {

// "rank 3: <what>", without a repeated "fairring: " from lower layers; the
// message is left alone if it already names its rank.
inline std::string attribute_to_rank(int rank, std::string what) {
  const std::string prefix = "fairring: ";
  if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  if (what.rfind("rank ", 0) == 0) return what;
  return "rank " + std::to_string(rank) + ": " + what;
}

inline std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

}  // namespace fairring
