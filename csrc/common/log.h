// Minimal logging to stderr with the rank as a prefix.  Warnings meant for the
// user are raised by the Python side (fairring_py/__init__.py), where they
// become UserWarnings.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FAIRRING_LOG(rank, fmt, ...) \
  std::fprintf(stderr, "[fairring rank %d] " fmt "\n", (rank), ##__VA_ARGS__)

namespace fairring {
// FAIRRING_DEBUG=1 turns on chatty logs (connections, plans).
inline bool debug_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FAIRRING_DEBUG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}
}  // namespace fairring

#define FAIRRING_DEBUG_LOG(rank, fmt, ...)                 \
  do {                                                    \
    if (::fairring::debug_enabled())                      \
      FAIRRING_LOG((rank), fmt, ##__VA_ARGS__);           \
  } while (0)
