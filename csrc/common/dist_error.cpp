#include "common/dist_error.h"

#include <c10/util/Exception.h>

namespace fairring {

namespace {
bool is_peer_lost(const std::string& why) {
  return why.find(kPeerExitedMark) != std::string::npos || why.find(kConnectionLostMark) != std::string::npos;
}
}  // namespace

std::exception_ptr dist_error(const std::string& what) {
  const c10::SourceLocation here{__func__, __FILE__, static_cast<uint32_t>(__LINE__)};
  if (is_peer_lost(what)) return std::make_exception_ptr(c10::DistNetworkError(here, what));
  return std::make_exception_ptr(c10::DistBackendError(here, what));
}

}  // namespace fairring
