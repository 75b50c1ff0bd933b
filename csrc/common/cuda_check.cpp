#ifdef FAIRRING_WITH_CUDA

#include "common/cuda_check.h"

#include <stdexcept>

#include "common/log.h"
#include "common/error.h"

namespace fairring {

void cuda_check(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // as C10_CUDA_CHECK: reported here, not to the next launch
  throw Error(ErrorKind::kBackend,
              "fairring: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

bool cuda_done(cudaError_t query_result, const std::string& what) {
  if (query_result == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  cuda_check(query_result, what);
  return true;
}

void relax_capture_mode_of_this_thread(int rank) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cuda_ok_or_log(cudaThreadExchangeStreamCaptureMode(&mode), rank, "cudaThreadExchangeStreamCaptureMode");
}

bool cuda_ok_or_log(cudaError_t err, int rank, const char* what) {
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();
  FAIRRING_DEBUG_LOG(rank, "%s: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
  return false;
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
