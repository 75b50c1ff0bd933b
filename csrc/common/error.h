// The one exception type of Fairring's engine: a message and the kind of
// failure it reports.  The kind travels with the message wherever a failure
// goes (the group's first error, the node's abort record, a rail's abort
// message), so every rank reports the same failure as the same type.  Only
// the backend glue turns it into torch's types (backend/torch_error.h):
// kBackend -> DistBackendError, kNetwork -> DistNetworkError,
// kStore -> DistStoreError, kInvalidArgument -> ValueError.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

#include "common/errors.h"

namespace fairring {

enum class ErrorKind : uint32_t {
  kBackend = 0,          // a collective failed: timeout, mismatch, abort, a device fault
  kNetwork = 1,          // a peer was lost: its process exited or its connection closed
  kStore = 2,            // the store did not answer in time (group creation)
  kInvalidArgument = 3,  // a setting or argument the user must change
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// The Error an exception caught on an engine's thread stands for: itself,
// or, for any other exception, a kBackend error with its message (a c10
// error's without its C++ backtrace).
Error error_of(const std::exception& e);
Error error_of(std::exception_ptr e);

// The same failure with a new message (kind kept).
inline Error reworded(const Error& e, const std::string& what) { return Error(e.kind(), what); }

// What an engine thread of rank `rank` caught, as the group's failure:
// "rank 3: <what>" (errors.h), kind kept.
inline Error attributed(int rank, const std::exception& e) {
  const Error own = error_of(e);
  return reworded(own, attribute_to_rank(rank, own.what()));
}

// An Error of kind kind as an exception_ptr (what an op completes with).
inline std::exception_ptr error_ptr(ErrorKind kind, const std::string& what) {
  return std::make_exception_ptr(Error(kind, what));
}

}  // namespace fairring
