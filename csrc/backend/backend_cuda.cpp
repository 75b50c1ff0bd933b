// The backend's device side: native collectives of CUDA tensors go to the
// CUDA engine (devices/cuda_engine.h); anything else, or any device tensor
// in a build without CUDA, is a clear error (all_reduce) or goes to gloo
// (the others: see device_native).

#include "devices/cuda_engine.h"
#include "plan/plan.h"
#include "backend/backend.h"
#include "collectives/collectives.h"
#include "backend/init_store.h"
#include "backend/reduce_input.h"
#include "kernels/reduce_cpu.h"

#ifdef FAIRRING_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "backend/cuda_work.h"
#include "common/cuda_check.h"
#include "common/cuda_resources.h"

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common/error.h"
#endif

namespace fairring {

bool FairringBackend::device_native(const at::Tensor& t) {
#ifdef FAIRRING_WITH_CUDA
  return t.is_cuda();
#else
  (void)t;
  return false;
#endif
}

std::shared_ptr<PipelineOp> FairringBackend::new_device_op() {
#ifdef FAIRRING_WITH_CUDA
  return std::make_shared<CudaOp>();
#else
  TORCH_CHECK(false, "fairring: no device collectives in this build");
#endif
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_device(std::shared_ptr<PipelineOp> base, c10d::OpType type,
                                                              std::vector<at::Tensor> outputs, const char* kind) {
#ifndef FAIRRING_WITH_CUDA
  (void)base;
  (void)type;
  (void)outputs;
  TORCH_CHECK(false, "fairring: ", kind, " of device tensors is not supported by this build");
#else
  auto aop = std::static_pointer_cast<CudaOp>(base);
  const c10::Device device = aop->buffer.device();
  const c10::DeviceIndex current = c10::cuda::current_device();
  TORCH_CHECK(device.index() == current, "fairring: ", kind, " got a tensor on ", device.str(),
              " but this rank's current CUDA device is cuda:", static_cast<int>(current),
              "; call torch.cuda.set_device() with the tensor's device first (each rank drives one device)");
  check_not_capturing(device, kind);
  order_after_delegated(aop->footprint);
  CudaEngine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    if (!cuda_engine_) {
      // Collective: every rank reaches its first CUDA collective in the same
      // place of the issue order.  Built like the group (init_store.h): a
      // rank that fails tells the others, whose waits end with its cause.
      auto init = c10::make_intrusive<InitStore>(c10::make_intrusive<c10d::PrefixStore>("fairring-cuda-init/", store_),
                                                 getRank(), getSize(), config_.timeout);
      build_collectively(*init, [&] {
        cuda_engine_ = std::make_unique<CudaEngine>(init, device_topology(), config_, job_uid_, secret_, device,
                                                    [init] { init->throw_if_failed(); });
      });
    }
    engine = cuda_engine_.get();
  }
  TORCH_CHECK(engine->device() == device, "fairring: this process group's CUDA collectives run on ",
              engine->device().str(), " (the device of its first CUDA collective), but got a tensor on ", device.str());

  c10::cuda::CUDAGuard guard(device);
  auto work = c10::make_intrusive<CudaFairringWork>(getRank(), type, kind, std::move(outputs), device);
  aop->done = work->done_event();
  // The engine starts after what the caller's stream has queued so far.
  cuda_check(cudaEventCreateWithFlags(&aop->ready, cudaEventDisableTiming), "cannot create a CUDA event");
  const cudaError_t rec = cudaEventRecord(aop->ready, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  if (rec != cudaSuccess) cudaEventDestroy(aop->ready);
  cuda_check(rec, "cudaEventRecord on the caller's stream");
  // No recordStream: the engine holds the op's tensors until its device work is over.
  aop->on_complete = track(kind, *aop, [work](std::exception_ptr error) { work->mark_done(error); }, " (CUDA)");
  aop->after_complete = [work](std::exception_ptr error, const c10::cuda::CUDAStream& stream) {
    work->complete_future(error, stream);
  };
  aop->device_failed = [work](const Error& why) {
    work->fail_on_device(std::make_exception_ptr(reworded(why, std::string("fairring: ") + why.what())));
  };
  engine->submit(std::move(aop));
  return work;
#endif
}

void FairringBackend::check_not_capturing(c10::Device device, const char* kind) {
#ifdef FAIRRING_WITH_CUDA
  // The engines' own streams and threads run the op, outside any graph: a
  // captured op would be recorded instead of run (and never matched).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &capturing),
             "cudaStreamIsCapturing");
  TORCH_CHECK(capturing == cudaStreamCaptureStatusNone, "fairring: ", kind,
              " of a CUDA tensor while the current "
              "stream is being captured into a CUDA graph (torch.cuda.graph / make_graphed_callables) is not "
              "supported: Fairring runs collectives on its own streams and threads, outside the graph. Issue the "
              "collective outside the captured region.");
#else
  (void)device;
  (void)kind;
#endif
}

at::Tensor FairringBackend::host_copy(const at::Tensor& t, const char* kind) {
#ifdef FAIRRING_WITH_CUDA
  check_not_capturing(t.device(), kind);
  c10::cuda::CUDAGuard guard(t.device());
  at::NoGradGuard no_grad;
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU));
  host.copy_(t);  // on the current stream, after its work so far; returns once the bytes are here
  return host;
#else
  TORCH_CHECK(false, "fairring: ", kind, " of ", t.device().str(), " tensors is not supported by this build");
#endif
}

#ifdef FAIRRING_WITH_CUDA
namespace {
// The stream received bytes go up to the GPU on: one per device and process,
// Fairring's own (not one of c10's pooled streams, which users capture
// graphs on), never destroyed (a copy may still use it at exit).
DedicatedStream* landing_stream(c10::Device device) {
  static std::mutex mu;
  static std::map<int, DedicatedStream*> streams;
  std::lock_guard<std::mutex> lock(mu);
  DedicatedStream*& s = streams[device.index()];
  if (!s) s = new DedicatedStream(device, false);
  return s;
}
}  // namespace
#endif

std::function<void(const at::Tensor&)> FairringBackend::device_landing(const at::Tensor& t, const char* kind) const {
#ifdef FAIRRING_WITH_CUDA
  check_not_capturing(t.device(), kind);
  c10::cuda::CUDAGuard guard(t.device());
  // What the caller's stream has queued so far may still use `t`.
  auto ready = std::make_shared<CudaEvent>(t.device());
  cuda_check(cudaEventRecord(ready->get(), c10::cuda::getCurrentCUDAStream(t.device().index()).stream()),
             "cudaEventRecord on the caller's stream");
  DedicatedStream* stream = landing_stream(t.device());
  const auto timeout = config_.timeout;
  return [t, ready, stream, timeout, kind = std::string(kind)](const at::Tensor& host) {
    // A completion worker: relaxed capture mode for the copy only, so that a
    // graph captured meanwhile on another thread stays valid.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cuda_check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    struct Restore {
      cudaStreamCaptureMode mode;
      ~Restore() { cudaThreadExchangeStreamCaptureMode(&mode); }
    } restore{mode};
    c10::cuda::CUDAGuard on_device(t.device());
    cuda_check(cudaStreamWaitEvent(stream->stream(), ready->get(), 0), "cudaStreamWaitEvent (caller's stream)");
    {
      c10::cuda::CUDAStreamGuard on_stream(stream->c10());
      at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
      t.copy_(host);
    }
    // Done before the Work is: whoever waits on it may read `t` on any stream.
    // Polled under the group's timeout: the copy waits for the caller's
    // stream, which may wait on anything.
    if (!stream_caught_up(t.device(), stream->stream(), std::chrono::steady_clock::now() + timeout)) {
      // The copy may still run: neither its source nor its target may go back.
      (void)new std::pair<at::Tensor, at::Tensor>(t, host);  // deliberately leaked
      throw Error(ErrorKind::kBackend, "fairring: Timed out after " + std::to_string(timeout.count()) + " ms: " + kind +
                                           "'s copy of the received bytes to " + t.device().str() +
                                           " did not finish (it runs after the work queued before the call on the "
                                           "caller's stream: is that stalled?)");
    }
  };
#else
  (void)t;
  TORCH_CHECK(false, "fairring: ", kind, " of device tensors is not supported by this build");
#endif
}

bool FairringBackend::with_device_pipeline(const std::function<bool(Pipeline&)>& f) const {
#ifdef FAIRRING_WITH_CUDA
  CudaEngine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    engine = cuda_engine_.get();
  }
  return engine == nullptr || f(*engine);
#else
  (void)f;
  return true;  // no device engine in this build
#endif
}

}  // namespace fairring
