// Logging to stderr, one line per event, prefixed with the rank.  Warnings
// meant for the user are raised by the Python side (fairring_py/__init__.py),
// where they become UserWarnings.
//
// FAIRRING_DEBUG sets how much is logged beyond what always is (the first
// rejected connection, a dump of recent collectives at a group's first
// failure, ...):
//   1  failures and their causes, CUDA errors, rejected connections, leftovers
//   2  and group setup: options, topology, rails, shared memory
//   3  and every collective: issued, ended
// Any other non-empty value not starting with 0 counts as 1.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FAIRRING_LOG(rank, fmt, ...) std::fprintf(stderr, "[fairring rank %d] " fmt "\n", (rank), ##__VA_ARGS__)

namespace fairring {

enum LogLevel { kLogFailures = 1, kLogSetup = 2, kLogOps = 3 };

inline int debug_level() {
  static const int level = [] {
    const char* v = std::getenv("FAIRRING_DEBUG");
    if (v == nullptr || v[0] == '\0' || v[0] == '0') return 0;
    const int n = std::atoi(v);
    return n >= 1 ? n : 1;
  }();
  return level;
}

inline bool debug_enabled() { return debug_level() >= kLogFailures; }

}  // namespace fairring

// Logged when FAIRRING_DEBUG is at least `level`.
#define FAIRRING_LOG_AT(level, rank, fmt, ...)                                          \
  do {                                                                                  \
    if (::fairring::debug_level() >= (level)) FAIRRING_LOG((rank), fmt, ##__VA_ARGS__); \
  } while (0)

#define FAIRRING_DEBUG_LOG(rank, fmt, ...) FAIRRING_LOG_AT(::fairring::kLogFailures, (rank), fmt, ##__VA_ARGS__)
