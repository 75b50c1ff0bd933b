#include "common/error.h"

#include <c10/util/Exception.h>

namespace fairring {

Error error_of(const std::exception& e) {
  if (const auto* own = dynamic_cast<const Error*>(&e)) return *own;
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    return Error(ErrorKind::kBackend, c10->what_without_backtrace());
  }
  return Error(ErrorKind::kBackend, e.what());
}

Error error_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return error_of(x);
  } catch (...) {
    return Error(ErrorKind::kBackend, "fairring: a non-standard exception");
  }
}

}  // namespace fairring
