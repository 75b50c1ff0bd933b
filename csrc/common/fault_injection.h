// Test hook: a failure injected at a named step of an engine's construction,
// to test that every step unwinds what the steps before it built.
// FAIRRING_TEST_FAIL_AT=<step> on a rank makes its construction throw when
// it reaches that step (the steps are listed where they are called:
// host_engine.cpp, cuda_engine.cpp).
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace fairring {

inline void construction_step(const char* step) {
  const char* at = std::getenv("FAIRRING_TEST_FAIL_AT");
  if (at && std::string(at) == step) {
    throw std::runtime_error(std::string("fairring: injected failure at construction step '") + step +
                             "' (FAIRRING_TEST_FAIL_AT)");
  }
}

}  // namespace fairring
