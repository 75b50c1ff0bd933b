// Where an error leaves Fairring for its user, the engine's Error
// (common/error.h) becomes torch's own type, so code written against NCCL or
// gloo catches it alike: DistBackendError, DistNetworkError, DistStoreError
// (all RuntimeErrors in Python) or ValueError.  Used by the Works (an op's
// result and future), group creation, and the Python bindings.
#pragma once

#include <exception>

namespace fairring {

// The torch exception for `error` (null stays null; a torch or c10 error is
// kept as it is, any other exception becomes a DistBackendError).
std::exception_ptr to_torch(std::exception_ptr error);

// Runs `fn`; whatever it throws leaves as to_torch() of it.
template <typename Fn>
auto with_torch_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    std::rethrow_exception(to_torch(std::current_exception()));
  }
}

}  // namespace fairring
