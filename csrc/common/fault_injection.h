// Test hooks: a failure injected at a named step of an engine's construction,
// to test that every step unwinds what the steps before it built.
// FAIRRING_TEST_FAIL_AT=<step> on a rank makes its construction throw when
// it reaches that step (the steps are listed where they are called:
// host_engine.cpp, cuda_engine.cpp).
#pragma once

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include "common/error.h"

namespace fairring {

inline void construction_step(const char* step) {
  const char* at = std::getenv("FAIRRING_TEST_FAIL_AT");
  if (at && std::string(at) == step) {
    throw Error(ErrorKind::kBackend,
                std::string("fairring: injected failure at construction step '") + step + "' (FAIRRING_TEST_FAIL_AT)");
  }
}

// Test hook: how long the environment variable `var` (milliseconds) says a
// step should be late; 0 when unset.
inline std::chrono::milliseconds test_delay(const char* var) {
  const char* v = std::getenv(var);
  return std::chrono::milliseconds(v ? std::atoll(v) : 0);
}

// Test hook: a byte count from the environment variable `var` (-1 when
// unset), read once per call site by the caller.
inline int64_t test_bytes(const char* var) {
  const char* v = std::getenv(var);
  return v ? std::atoll(v) : -1;
}

}  // namespace fairring
