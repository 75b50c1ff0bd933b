// The all-reduce of CUDA tensors: the pipeline core (pipeline/pipeline.h) with
// device data movers; the same node protocol (NodeSlots) as the host engine.
//
//   reduce-scatter: each rank copies its slice into its staging input area
//     (device memory shared with the node's ranks through CUDA IPC); local rank
//     k's kernel reduces chunk k of every local rank's input, in local-rank
//     order, into its staging output area.
//   rail exchange (several nodes): the reduced chunk goes to pinned host memory
//     (D2H), the RailStage exchanges and reduces its shards over TCP on the
//     host, and the result comes back (H2D).
//   all-gather: each rank copies every chunk owner's output area into its tensor.
//
// The pipeline's loop thread enqueues this for every slice, in issue order,
// on one CUDA stream per pipeline slot, and never blocks on the device.  Ordering between
// processes uses interprocess CUDA events gated by the node's host counters
// (NodeControl): a rank enqueues cudaStreamWaitEvent on a peer's event only
// after the peer has published (NodeSlots) that it enqueued the record, and
// re-records an event only after every peer has enqueued its waits on the
// previous record.  Nothing spins on the device, so several ranks may share
// one GPU.  Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "allreduce/cuda_held_ops.h"
#include "allreduce/rail_stage.h"
#include "common/config.h"
#include "common/cuda_resources.h"
#include "pipeline/pipeline.h"
#include "topology/topology.h"
#include "transport/cuda_ipc.h"
#include "transport/nccl_rail.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

struct CudaAllreduceOp : PipelineOp {
  at::Tensor user;  // the caller's tensor if it is not `buffer`
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream at submit; the engine destroys it
  // Recorded after the op's last device work; shared with the Work.  The
  // engine holds the op (its tensors) until it has passed (HeldOps), so that
  // the caching allocator cannot hand the memory out while the engine's
  // streams still use it.
  std::shared_ptr<CudaEvent> done;
  bool enqueued = false;  // some of its device work was enqueued (loop thread)
  // Then from a completion worker, in order, with `stream` waiting on `done`:
  // completes the future (its callbacks may block).
  std::function<void(std::exception_ptr, const c10::cuda::CUDAStream& stream)> after_complete;
};

class CudaEngine : public Pipeline {
 public:
  // Collective over the group; runs on `device` (the rank's current device).
  CudaEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
             const std::string& job_uid, const Secret& secret, c10::Device device);
  ~CudaEngine() override;

  c10::Device device() const { return device_; }

 private:
  // A reduced chunk on its way to the rail: posted once its D2H copy is done.
  struct ToRail {
    cudaEvent_t copied;
    RailTask task;
  };
  // Where a slot's rail result goes back to (set before the task is posted).
  struct Return {
    char* device_chunk = nullptr;
    size_t bytes = 0;
    bool record_chunk_event = false;
  };

  // Pipeline hooks.
  void on_loop_start() override;
  bool reduce_scatter(Slice& s, const TimePoint* until) override;
  bool all_gather(Slice& s, const TimePoint* until) override;
  void op_done(PipelineOp& op) override;
  void settle(PipelineOp& op, std::exception_ptr& error) override;
  std::function<void()> completion_call(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error) override;
  void on_failed(const std::string& why) override;
  void wait_device_idle() override;
  bool quiesce_device(TimePoint until) override;

  void feeder_loop();
  void rail_done(uint64_t slice_seq);
  // FAIRRING_GPU_TRANSPORT=nccl: the rail exchange of the reduced chunk, on
  // the NCCL stream, ordered after and before `stream`.
  void nccl_exchange(const Slice& s, char* chunk, cudaStream_t stream, int64_t divisor);
  void check_own_gpus(const c10::intrusive_ptr<c10d::Store>& store);
  // Teardown of the node's CUDA IPC resources, after our streams are idle.
  void close_ipc();

  // Our staging areas of `slot` and a peer's as we see them.
  char* input_area(int x, int slot) const { return memory_->base(x) + static_cast<int64_t>(slot) * 2 * area_; }
  char* output_area(int x, int slot) const { return input_area(x, slot) + area_; }
  // Interprocess events of local rank x, per slot: one per step of NodeSlots
  // that a peer's stream waits on.
  enum SlotEvent { kInReady = 0, kChunkDone = 1, kConsumed = 2, kEventsPerSlot = 3 };
  cudaEvent_t slot_event(int x, int slot, SlotEvent e) const { return events_->at(x, slot * kEventsPerSlot + e); }

  c10::Device device_;
  int64_t area_ = 0;  // bytes of one staging area (the slice size)

  std::unique_ptr<SharedDeviceMemory> memory_;   // K > 1: per slot, input + output area
  std::unique_ptr<SharedEvents> events_;         // K > 1
  std::vector<std::unique_ptr<DedicatedStream>> streams_;  // one per slot
  std::unique_ptr<DedicatedStream> tail_;  // waits on every slice's end; ops' done events
  // Futures are completed on it; shared with the completion calls, which
  // may run after the engine is gone.
  std::shared_ptr<DedicatedStream> future_stream_;
  std::vector<cudaEvent_t> slice_end_;           // per slot, local
  std::vector<cudaEvent_t> d2h_done_;            // per slot, local (N > 1)
  char* pinned_ = nullptr;                       // N > 1: one slice per slot, host
  std::vector<Return> returns_;                  // per slot (N > 1)

  std::unique_ptr<TcpMesh> mesh_;      // tcp
  std::unique_ptr<RailStage> rail_;    // tcp
  std::unique_ptr<NcclRail> nccl_;     // nccl
  std::unique_ptr<DedicatedStream> nccl_stream_;  // every NCCL exchange, in slice order
  char* nccl_staging_ = nullptr;       // device: the peers' shards this rank serves
  int64_t nccl_shard_bytes_ = 0;       // room per peer in nccl_staging_
  cudaEvent_t nccl_ready_ = nullptr;   // local: slot stream -> NCCL stream
  cudaEvent_t nccl_done_ = nullptr;    // local: NCCL stream -> slot stream

  std::mutex feed_mu_;
  std::condition_variable feed_cv_;
  std::deque<ToRail> feed_;
  bool feed_stopping_ = false;
  std::thread feeder_;

  std::unique_ptr<HeldOps> held_;
};

}  // namespace fairring

#else  // !FAIRRING_WITH_CUDA

namespace fairring {
class CudaEngine {};  // so that owners compile in a CPU-only build
}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
