// The all-reduce schedule for CUDA tensors: the CPU engine's hierarchical
// schedule (allreduce/engine.h) with device data movers.
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
// One proxy thread enqueues this for every slice, in issue order, on one CUDA
// stream per pipeline slot, and never blocks on the device.  Ordering between
// processes uses interprocess CUDA events gated by the node's host counters
// (NodeControl): a rank enqueues cudaStreamWaitEvent on a peer's event only
// after the peer has published (counter) that it enqueued the record, and
// re-records an event only after every peer has enqueued its waits on the
// previous record.  Nothing spins on the device, so several ranks may share
// one GPU.  Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "allreduce/node_arena.h"
#include "allreduce/op.h"
#include "allreduce/plan.h"
#include "allreduce/rail_stage.h"
#include "common/config.h"
#include "common/cuda_resources.h"
#include "topology/topology.h"
#include "transport/cuda_ipc.h"
#include "transport/nccl_rail.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

struct CudaAllreduceOp {
  uint64_t seq = 0;       // issue order among this group's CUDA all-reduces
  at::Tensor buffer;      // contiguous, reduced in place
  at::Tensor user;        // the caller's tensor if it is not `buffer`
  c10::ScalarType dtype = c10::ScalarType::Float;
  RedOp op = RedOp::kSum;
  int64_t numel = 0;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream at submit; the engine destroys it
  // Recorded after the op's last device work; shared with the Work.  The
  // engine holds the op (its tensors) until it has completed, so that the
  // caching allocator cannot hand the memory out while the engine's streams
  // still use it (no recordStream on the engine's own streams, which are
  // destroyed with it while the allocator would still refer to them).
  std::shared_ptr<CudaEvent> done;
  bool enqueued = false;  // some of its device work was enqueued (proxy thread)
  // Host side completion, from the proxy thread: quick, never blocks.
  std::function<void(std::exception_ptr)> on_complete;
  // Then from the completion thread, in order, with `stream` waiting on
  // `done`: completes the future (its callbacks may block).
  std::function<void(std::exception_ptr, const c10::cuda::CUDAStream& stream)> after_complete;
};

class CudaEngine {
 public:
  // Collective over the group; runs on `device` (the rank's current device).
  CudaEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
             const std::string& job_uid, const Secret& secret, c10::Device device);
  ~CudaEngine();

  c10::Device device() const { return device_; }
  int rank() const { return topo_.rank; }
  void submit(std::shared_ptr<CudaAllreduceOp> op);
  std::thread::id completion_thread() const { return completer_.get_id(); }
  // Blocks until every submitted op is enqueued and its device work finished.
  void wait_idle();
  // Blocks (up to `limit`) until every op has completed, its device work is
  // over and no engine thread holds a tensor or Work any more (as
  // Engine::quiesce).  True if it got there.
  bool quiesce(std::chrono::milliseconds limit);

 private:
  struct Pending {
    std::shared_ptr<CudaAllreduceOp> op;
    int64_t index = 0;  // slice of the op
    uint64_t seq = 0;   // global slice number
    SlicePlan plan;
  };
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

  void proxy_loop();
  void feeder_loop();
  void completion_loop();
  void reduce_scatter(Pending& p);
  void all_gather(Pending& p);
  void rail_done(uint64_t slice_seq);
  // FAIRRING_GPU_TRANSPORT=nccl: the rail exchange of the reduced chunk, on
  // the NCCL stream, ordered after and before `stream`.
  void nccl_exchange(const Pending& p, char* chunk, cudaStream_t stream, int64_t divisor);
  void check_own_gpus(const c10::intrusive_ptr<c10d::Store>& store);
  // Teardown of the node's CUDA IPC resources, after our streams are idle.
  void close_ipc();
  // Drops the ops at the front of `retiring` whose device work is over.
  void retire(std::deque<std::shared_ptr<CudaAllreduceOp>>& retiring);
  void complete(const std::shared_ptr<CudaAllreduceOp>& op, std::exception_ptr error);
  void fail(const std::string& why);
  std::function<void()> wait_check(int local_peer, const char* what, uint64_t op_seq, bool via_network = false);

  // Our staging areas of `slot` and a peer's as we see them.
  char* input_area(int x, int slot) const { return memory_->base(x) + static_cast<int64_t>(slot) * 2 * area_; }
  char* output_area(int x, int slot) const { return input_area(x, slot) + area_; }
  // Interprocess events of local rank x: in-ready, chunk-done, consumed, per slot.
  cudaEvent_t in_ready_event(int x, int slot) const { return events_->at(x, slot * 3); }
  cudaEvent_t chunk_done_event(int x, int slot) const { return events_->at(x, slot * 3 + 1); }
  cudaEvent_t consumed_event(int x, int slot) const { return events_->at(x, slot * 3 + 2); }

  Topology topo_;
  Config config_;
  PlanParams params_;
  c10::Device device_;
  int slots_ = 1;
  int64_t area_ = 0;  // bytes of one staging area (the slice size)

  std::unique_ptr<NodeArena> arena_;             // host counters, headers, abort word
  std::unique_ptr<SharedDeviceMemory> memory_;   // K > 1: per slot, input + output area
  std::unique_ptr<SharedEvents> events_;         // K > 1
  std::vector<std::unique_ptr<DedicatedStream>> streams_;  // one per slot
  std::unique_ptr<DedicatedStream> tail_;  // waits on every slice's end; ops' done events
  std::unique_ptr<DedicatedStream> future_stream_;  // futures are completed on it
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

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<CudaAllreduceOp>> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;  // host side
  bool stopping_ = false;
  std::string error_;
  std::atomic<bool> failed_{false};
  uint64_t next_slice_seq_ = 0;  // proxy thread only
  std::thread proxy_;

  std::mutex feed_mu_;
  std::condition_variable feed_cv_;
  std::deque<ToRail> feed_;
  bool feed_stopping_ = false;
  std::thread feeder_;

  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::deque<std::shared_ptr<CudaAllreduceOp>> done_queue_;
  std::deque<std::exception_ptr> done_errors_;
  uint64_t futures_completed_ = 0;
  bool done_busy_ = false;   // the completion thread holds an op it took from done_queue_
  size_t retiring_ = 0;      // ops completed whose device work may still run (held for their tensors)
  bool done_stopping_ = false;
  std::thread completer_;
};

// CudaEngine::quiesce() on every live CUDA engine of the process (with
// Engine::quiesce_all, at interpreter exit).
void quiesce_all_cuda_engines();

}  // namespace fairring

#else  // !FAIRRING_WITH_CUDA

namespace fairring {
class CudaEngine {};  // so that owners compile in a CPU-only build
inline void quiesce_all_cuda_engines() {}
}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
