// Owned CUDA events and streams, released on their own device.  Only
// compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>

namespace fairring {

// A new event of the current device, timing disabled (the owner destroys it).
cudaEvent_t new_event();

// An event (timing disabled), destroyed with its device current: the last
// owner may be a thread with no current device, which would otherwise get a
// context on cuda:0.  Shared by a CUDA Work and its op (the engine releases
// the op's tensors once the event has completed).
class CudaEvent {
 public:
  explicit CudaEvent(c10::Device device);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  c10::Device device_;
  cudaEvent_t event_ = nullptr;
};

// A non-blocking stream of the engine's own, not one of c10's pooled
// streams (which gloo, NCCL and future callbacks share: a stream waiting on a
// peer's IPC event would stall them too).  Wrapped for c10 so that guards and
// ATen ops can run on it.  Destroyed with the owner; the owner synchronizes
// it first.
class DedicatedStream {
 public:
  DedicatedStream(c10::Device device, bool high_priority);
  ~DedicatedStream();
  DedicatedStream(const DedicatedStream&) = delete;
  DedicatedStream& operator=(const DedicatedStream&) = delete;
  cudaStream_t stream() const { return stream_; }
  const c10::cuda::CUDAStream& c10() const { return wrapped_; }

 private:
  c10::Device device_;
  cudaStream_t stream_ = nullptr;
  c10::cuda::CUDAStream wrapped_;
};

// Waits for the work queued so far on `stream` (of `device`), at most until
// `until`; false if it is still running then.  Polled, never a blocking
// synchronize: device work may wait on a peer's event or an NCCL transfer
// forever.  `look`, if given, runs between polls and may throw to give up.
bool stream_caught_up(c10::Device device, cudaStream_t stream, std::chrono::steady_clock::time_point until,
                      const std::function<void()>& look = nullptr);

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
