#include "backend/torch_error.h"

#include <c10/util/Exception.h>

#include "common/error.h"

namespace fairring {

std::exception_ptr to_torch(std::exception_ptr error) {
  if (!error) return error;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;  // torch's own already (TORCH_CHECK, or mapped before)
  } catch (const std::exception& e) {
    const Error own = error_of(e);
    const c10::SourceLocation here{__func__, __FILE__, static_cast<uint32_t>(__LINE__)};
    switch (own.kind()) {
      case ErrorKind::kBackend:
        return std::make_exception_ptr(c10::DistBackendError(here, own.what()));
      case ErrorKind::kNetwork:
        return std::make_exception_ptr(c10::DistNetworkError(here, own.what()));
      case ErrorKind::kStore:
        return std::make_exception_ptr(c10::DistStoreError(here, own.what()));
      case ErrorKind::kInvalidArgument:
        return std::make_exception_ptr(c10::ValueError(here, own.what()));
    }
    return std::make_exception_ptr(c10::DistBackendError(here, own.what()));
  } catch (...) {
    return error;
  }
}

}  // namespace fairring
