// The collectives of CUDA tensors: the pipeline core (pipeline/pipeline.h)
// and its slice schedule with a device Mover, and a CUDA rail exchange
// (cuda_rails.h) between nodes.
//
// The staging areas are device memory shared with the node's ranks through
// CUDA IPC: per slot an input area (the slice, minus the rank's own chunk)
// and an output area (the rank's final chunk).  The pipeline's loop thread
// enqueues every step of a slice, in issue order, on one CUDA stream per
// pipeline slot, and never blocks on the device.  Ordering between processes
// uses interprocess CUDA events gated by the node's host counters: a rank
// enqueues cudaStreamWaitEvent on a peer's event only after the peer has
// published (NodeSlots) that it enqueued the record, and re-records an event
// only after every peer has enqueued its waits on the previous record.
// Nothing spins on the device, so several ranks may share one GPU.  Only
// compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rails/cuda_rails.h"
#include "common/config.h"
#include "common/cuda_resources.h"
#include "pipeline/held_ops.h"
#include "pipeline/pipeline.h"
#include "topology/topology.h"
#include "transport/cuda_ipc.h"

namespace c10d {
class Store;
}

namespace fairring {

struct CudaOp : PipelineOp {
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream at submit; the engine destroys it
  // Recorded after the op's last device work; shared with the Work.  The
  // engine holds the op (its tensors) until it has passed (HeldOps), so that
  // the caching allocator cannot hand the memory out while the engine's
  // streams still use it.
  std::shared_ptr<CudaEvent> done;
  // Some of its device work was enqueued (its first slice began, or its
  // stage ran on the tail): `done` must be recorded before it is let go.
  bool enqueued = false;
  // It failed and its `done` could not be recorded after its device work:
  // when that work ends is unknown, so it stays held (leaked at teardown).
  bool end_unknown = false;
  // Then from a completion worker, in order, with `stream` waiting on `done`:
  // completes the future (its callbacks may block).
  std::function<void(std::exception_ptr, const c10::cuda::CUDAStream& stream)> after_complete;
  // The watchdog (HeldOps) gave up on its device work, after the host side
  // succeeded: its Work reports `why` from then on.
  std::function<void(const Error& why)> device_failed;
};

class CudaEngine : public Pipeline {
 public:
  // Collective over the group; runs on `device` (the rank's current device).
  // `peers_failed` throws a peer's published construction failure (the
  // init store's, init_store.h), so that a wait outside the store (NCCL's
  // init) ends with it too.
  CudaEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
             const std::string& job_uid, const Secret& secret, c10::Device device, std::function<void()> peers_failed);
  ~CudaEngine() override;

  c10::Device device() const { return device_; }

 private:
  class CudaMover;

  // Pipeline hooks.
  void on_loop_start() override;
  void stage(PipelineOp& op, bool on_caller) override;
  void op_done(PipelineOp& op) override;
  void settle(PipelineOp& op, std::exception_ptr& error) override;
  std::function<void()> completion_call(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error) override;
  void on_failed(const Error& why) override;
  void on_set_timeout(std::chrono::milliseconds timeout) override;
  bool let_go(TimePoint until) override;
  void wait_device_idle() override;
  bool quiesce_device(TimePoint until) override;

  // Teardown of the node's CUDA IPC resources, after our streams are idle.
  void close_ipc();
  // A constructor that throws: frees what it built, in reverse order, and
  // leaves memory and events that peers may have opened to the process's exit.
  void unwind_construction() noexcept;
  // Waits for the work queued so far on `stream`, at most until `until`;
  // false if it is still running then.  Device work can wait on a local
  // peer's IPC event forever, so the wait is polled (never a blocking
  // synchronize) and throws, naming it, once a local peer has been gone (or
  // the node aborted) for the watchdog's grace (PeerWatch): a node-mate that
  // exits after doing its part is no failure.
  bool caught_up(cudaStream_t stream, TimePoint until);
  // A failed op with device work enqueued: its `done` is recorded on the
  // tail after everything queued on the slot streams and the rail's, so that
  // it stays held until that work has run (fence_failed_op, held_ops.h).
  void fence_failed(CudaOp& op) noexcept;
  // Throws, naming it, if a local peer has exited, the node has aborted or
  // the rail's transport has failed.
  void check_peers();

  c10::Device device_;
  int64_t area_ = 0;  // bytes of one staging area (the slice size)

  std::unique_ptr<SharedDeviceMemory> memory_;             // K > 1: per slot, input + output area
  std::unique_ptr<SharedEvents> events_;                   // K > 1: per slot, one per PeerStep
  std::vector<std::unique_ptr<DedicatedStream>> streams_;  // one per slot
  std::unique_ptr<DedicatedStream> tail_;                  // waits on every slice's end; ops' done events
  // Futures are completed on it; shared with the completion calls, which
  // may run after the engine is gone.
  std::shared_ptr<DedicatedStream> future_stream_;
  std::vector<cudaEvent_t> slice_end_;  // per slot, local
  std::unique_ptr<CudaRail> rail_;      // N > 1
  std::unique_ptr<CudaMover> mover_;
  std::unique_ptr<HeldOps> held_;
};

}  // namespace fairring

#else  // !FAIRRING_WITH_CUDA

namespace fairring {
class CudaEngine {};  // so that owners compile in a CPU-only build
}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
