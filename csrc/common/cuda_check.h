// Checking CUDA runtime results the way c10 does (C10_CUDA_CHECK,
// CUDAEvent::query): an error this code reports or expects is also cleared
// from the thread's last-error state, or the next kernel launch on the
// thread (ATen's launch check reads cudaGetLastError) would fail with it.
// Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <cuda_runtime_api.h>

#include <string>

namespace fairring {

// Throws an Error("fairring: <what>: <cudaErrorName> (<description>)")
// unless err is cudaSuccess; clears the error first.
void cuda_check(cudaError_t err, const std::string& what);

// For the result of cudaEventQuery / cudaStreamQuery: true when done, false
// when not yet (cudaErrorNotReady, cleared), throws on any other error.
bool cuda_done(cudaError_t query_result, const std::string& what);

// First on each of Fairring's own threads that call the CUDA runtime (the
// engine's loop, the rail's and feeder's, HeldOps'): puts the thread in
// relaxed stream-capture mode, so that its event queries and copies do not
// invalidate a CUDA graph the user captures meanwhile on another thread
// (torch.cuda.graph captures in global mode, which forbids such calls on
// every thread not in relaxed mode; PyTorch's NCCL watchdog does the same).
void relax_capture_mode_of_this_thread(int rank);

// For teardown, where nothing may throw: clears the error and logs it
// (FAIRRING_DEBUG) with `rank`.  True if err was cudaSuccess.
bool cuda_ok_or_log(cudaError_t err, int rank, const char* what);

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
