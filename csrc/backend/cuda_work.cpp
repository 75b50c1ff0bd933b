#ifdef FAIRRING_WITH_CUDA

#include "backend/cuda_work.h"

#include <c10/cuda/CUDAGuard.h>

#include "transport/cuda_ipc.h"

namespace fairring {

CudaFairringWork::CudaFairringWork(int rank, std::vector<at::Tensor> outputs, c10::Device device,
                                   std::thread::id completer)
    : c10d::Work(rank, c10d::OpType::ALLREDUCE),
      outputs_(std::move(outputs)),
      device_(device),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                        std::vector<c10::Device>{device})),
      completer_(completer) {
  c10::cuda::CUDAGuard guard(device_);
  cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cannot create a CUDA event");
}

CudaFairringWork::~CudaFairringWork() {
  // Destroying an event whose record is still pending is allowed; CUDA
  // releases it once the record completes.
  if (done_) cudaEventDestroy(done_);
}

void CudaFairringWork::mark_done(std::exception_ptr error) { finish(error); }

void CudaFairringWork::complete_future(std::exception_ptr error, const c10::cuda::CUDAStream& stream) {
  if (error) {
    future_->setError(error);
    return;
  }
  c10::cuda::CUDAStreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

void CudaFairringWork::stream_wait() {
  c10::cuda::CUDAGuard guard(device_);
  cuda_check(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_.index()).stream(), done_, 0),
             "cudaStreamWaitEvent on the all_reduce's completion");
}

bool CudaFairringWork::wait(std::chrono::milliseconds timeout) {
  // Host: enqueued (throws on error or timeout); then synchronize(), which
  // makes the current stream wait for the op.
  const bool ok = c10d::Work::wait(timeout);
  // The future is completed right after, on the completion thread; wait for
  // it (except from that thread) so get_future().value() works after wait().
  if (std::this_thread::get_id() != completer_) future_->wait();
  return ok;
}

void CudaFairringWork::synchronize() {
  c10d::Work::synchronize();  // the base's bookkeeping, if any
  stream_wait();
}

bool CudaFairringWork::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  if (exception()) return true;
  return cudaEventQuery(done_) == cudaSuccess;
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
