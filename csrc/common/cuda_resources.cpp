#ifdef FAIRRING_WITH_CUDA

#include "common/cuda_resources.h"

#include <c10/cuda/CUDAGuard.h>

#include "common/backoff.h"
#include "common/cuda_check.h"

namespace fairring {

cudaEvent_t new_event() {
  cudaEvent_t ev = nullptr;
  cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cannot create a CUDA event");
  return ev;
}

CudaEvent::CudaEvent(c10::Device device) : device_(device) {
  c10::cuda::CUDAGuard guard(device_);
  event_ = new_event();
}

CudaEvent::~CudaEvent() {
  try {
    c10::cuda::CUDAGuard guard(device_);
    // Allowed while a record is pending: CUDA releases it once that completes.
    cuda_ok_or_log(cudaEventDestroy(event_), -1, "cudaEventDestroy");
  } catch (const std::exception&) {
    // Only the guard throws (the device is gone): nothing to release then.
  }
}

namespace {
cudaStream_t create_stream(c10::Device device, bool high_priority) {
  c10::cuda::CUDAGuard guard(device);
  int least = 0, greatest = 0;
  cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least),
             "cannot create a CUDA stream");
  return s;
}
}  // namespace

DedicatedStream::DedicatedStream(c10::Device device, bool high_priority)
    : device_(device),
      stream_(create_stream(device, high_priority)),
      wrapped_(c10::cuda::getStreamFromExternal(stream_, device.index())) {}

DedicatedStream::~DedicatedStream() {
  try {
    c10::cuda::CUDAGuard guard(device_);
    // Returns at once; CUDA frees the stream when its queued work is done.
    cuda_ok_or_log(cudaStreamDestroy(stream_), -1, "cudaStreamDestroy");
  } catch (const std::exception&) {
  }
}

bool stream_caught_up(c10::Device device, cudaStream_t stream, std::chrono::steady_clock::time_point until,
                      const std::function<void()>& look) {
  c10::cuda::CUDAGuard guard(device);
  CudaEvent reached(device);
  cuda_check(cudaEventRecord(reached.get(), stream), "cudaEventRecord (waiting for the device)");
  Backoff pause(std::chrono::microseconds(20), std::chrono::milliseconds(1));
  for (;;) {
    if (cuda_done(cudaEventQuery(reached.get()), "waiting for queued device work")) return true;
    if (look) look();
    if (std::chrono::steady_clock::now() > until) return false;
    pause.sleep();
  }
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
