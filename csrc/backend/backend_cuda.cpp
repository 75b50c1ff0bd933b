// FairringBackend::allreduce for tensors that are not on the CPU: CUDA tensors
// go to the CUDA engine (allreduce/cuda_engine.h); anything else, or any
// device tensor in a build without CUDA, is a clear error.

#include "allreduce/cuda_engine.h"
#include "backend/backend.h"
#include "backend/reduce_input.h"
#include "kernels/reduce_cpu.h"

#ifdef FAIRRING_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "backend/cuda_work.h"
#endif

namespace fairring {

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_device(at::Tensor& t, std::vector<at::Tensor>& tensors,
                                                                 RedOp op) {
#ifndef FAIRRING_WITH_CUDA
  (void)tensors;
  (void)op;
  TORCH_CHECK(false, "fairring: all_reduce of ", t.device().str(),
              " tensors is not supported by this build; only CPU tensors are (this fairring_py._C was built "
              "without CUDA: rebuild with FAIRRING_BUILD_CUDA=1 against a CUDA build of torch)");
#else
  TORCH_CHECK(t.is_cuda(), "fairring: all_reduce supports CPU and CUDA tensors, got a ", t.device().str(),
              " tensor");
  const c10::DeviceIndex current = c10::cuda::current_device();
  TORCH_CHECK(t.device().index() == current, "fairring: all_reduce got a tensor on ", t.device().str(),
              " but this rank's current CUDA device is cuda:", static_cast<int>(current),
              "; call torch.cuda.set_device() with the tensor's device first (each rank drives one device)");

  ReduceInput in = prepare_reduce_input(tensors, op);

  CudaEngine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    if (!cuda_engine_) {
      // Collective: every rank reaches its first CUDA all-reduce in the same
      // place of the issue order.
      cuda_engine_ = std::make_unique<CudaEngine>(store_, topo_, config_, job_uid_, secret_, t.device());
    }
    engine = cuda_engine_.get();
  }
  TORCH_CHECK(engine->device() == t.device(), "fairring: this process group's CUDA all-reduces run on ",
              engine->device().str(), " (the device of its first CUDA all_reduce), but got a tensor on ",
              t.device().str());

  c10::cuda::CUDAGuard guard(t.device());
  auto work = c10::make_intrusive<CudaFairringWork>(getRank(), tensors, t.device());
  auto aop = std::make_shared<CudaAllreduceOp>();
  aop->buffer = in.buffer;
  if (!in.users.empty()) aop->user = t;  // one tensor per call on CUDA
  aop->dtype = in.dtype;
  aop->op = op;
  aop->numel = in.numel;
  aop->done = work->done_event();
  // The engine starts after what the caller's stream has queued so far.
  cuda_check(cudaEventCreateWithFlags(&aop->ready, cudaEventDisableTiming), "cannot create a CUDA event");
  const cudaError_t rec = cudaEventRecord(aop->ready, c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
  if (rec != cudaSuccess) cudaEventDestroy(aop->ready);
  cuda_check(rec, "cudaEventRecord on the caller's stream");
  // No recordStream: the engine holds the op's tensors until its device work is over.
  aop->on_complete = track("all_reduce (CUDA)", describe_args(aop->key()),
                           in.buffer.nbytes(), [work](std::exception_ptr error) { work->mark_done(error); });
  aop->after_complete = [work](std::exception_ptr error, const c10::cuda::CUDAStream& stream) {
    work->complete_future(error, stream);
  };
  engine->submit(std::move(aop));
  return work;
#endif
}

void FairringBackend::wait_idle_device() {
#ifdef FAIRRING_WITH_CUDA
  CudaEngine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    engine = cuda_engine_.get();
  }
  if (engine) engine->wait_idle();
#endif
}

}  // namespace fairring
