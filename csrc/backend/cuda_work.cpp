#ifdef FAIRRING_WITH_CUDA

#include "backend/cuda_work.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "backend/torch_error.h"
#include "common/backoff.h"
#include "common/cuda_check.h"

namespace fairring {

namespace {
// Work.wait() waits for the future's completion, usually microseconds away.
constexpr auto kFutureNapFirst = std::chrono::microseconds(10);
constexpr auto kFutureNapCap = std::chrono::microseconds(1000);
}  // namespace

CudaFairringWork::CudaFairringWork(int rank, c10d::OpType type, std::string kind, std::vector<at::Tensor> outputs,
                                   c10::Device device)
    : c10d::Work(rank, type),
      kind_(std::move(kind)),
      outputs_(std::move(outputs)),
      device_(device),
      done_(std::make_shared<CudaEvent>(device)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), std::vector<c10::Device>{device})) {}

void CudaFairringWork::mark_done(std::exception_ptr error) { finish(to_torch(error)); }

void CudaFairringWork::complete_future(std::exception_ptr error, const c10::cuda::CUDAStream& stream) {
  if (error) {
    future_->setError(to_torch(error));
    return;
  }
  c10::cuda::CUDAStreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

void CudaFairringWork::fail_on_device(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_error_) device_error_ = to_torch(error);
}

std::exception_ptr CudaFairringWork::device_error() const {
  std::lock_guard<std::mutex> lock(device_mu_);
  return device_error_;
}

std::exception_ptr CudaFairringWork::exception() const {
  if (std::exception_ptr host = c10d::Work::exception()) return host;
  return device_error();
}

void CudaFairringWork::stream_wait() {
  c10::cuda::CUDAGuard guard(device_);
  cuda_check(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_.index()).stream(), done_->get(), 0),
             "cudaStreamWaitEvent on the " + kind_ + "'s completion");
}

bool CudaFairringWork::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Host: enqueued (throws on error or timeout); then synchronize(), which
  // makes the current stream wait for the op.
  const bool ok = c10d::Work::wait(timeout);
  // The future is completed right after, by a completion worker (the pool
  // starts another if this is a callback that blocks one); wait for it so
  // get_future().value() works after wait(), but not past the caller's
  // timeout.  The future has no timed wait: poll, backing off (it is
  // usually a few microseconds away).
  if (timeout != std::chrono::milliseconds::zero()) {  // zero: c10d's kNoTimeout
    Backoff nap(kFutureNapFirst, kFutureNapCap);
    while (!future_->completed()) {
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "fairring: Work.wait(timeout=", timeout.count(),
                  " ms): Timed out after ", timeout.count(), " ms: the ", kind_,
                  " is enqueued but its future was not completed "
                  "(a callback chained on an earlier op's future is still running?)");
      nap.sleep();
    }
  }
  future_->wait();
  // Only what the watchdog knows by now: wait() does not wait for the device.
  if (std::exception_ptr device = device_error()) std::rethrow_exception(device);
  return ok;
}

void CudaFairringWork::synchronize() {
  c10d::Work::synchronize();  // the base's bookkeeping, if any
  stream_wait();
}

bool CudaFairringWork::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  if (exception()) return true;  // failed on the host, or the watchdog gave up on the device
  c10::cuda::CUDAGuard guard(device_);
  return cuda_done(cudaEventQuery(done_->get()), "querying the " + kind_ + "'s completion");
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
