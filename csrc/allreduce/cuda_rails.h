// The rail exchanges of the CUDA path, both behind the schedule's
// RailExchange and both walking the same plan as the TCP stage (rail_plan.h):
//
//   CudaStagedRail  the TCP RailStage fed through pinned host memory: the
//                   chunk goes to the host on the slot's stream (D2H), a
//                   feeder thread posts it once that copy is done, and the
//                   result comes back on the slot's stream (H2D).
//   CudaNcclRail    FAIRRING_GPU_TRANSPORT=nccl: the reduction-server walk as
//                   NCCL sends and receives on one NCCL stream, ordered after
//                   and before the slot's stream; nothing waits on the host.
//
// Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>
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

#include "allreduce/plan.h"
#include "allreduce/rail_stage.h"
#include "common/config.h"
#include "common/cuda_resources.h"
#include "pipeline/rail_exchange.h"
#include "topology/topology.h"
#include "transport/nccl_rail.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

// The slot's stream, where the schedule's work on a slice is enqueued.
using SlotStream = std::function<cudaStream_t(int slot)>;

class CudaRail : public RailExchange {
 public:
  // After a failure the device work may never finish: the destructor leaves
  // the staging memory it uses to the process's exit instead of freeing it.
  // Otherwise the owner has synchronized the slot streams before destroying.
  void leak_on_destroy() { leak_ = true; }

 protected:
  bool leak_ = false;
};

class CudaStagedRail : public CudaRail {
 public:
  // Collective over the rail.  `area` bytes of pinned memory per slot.
  CudaStagedRail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                 const PlanParams& params, const Secret& secret, c10::Device device, int64_t area,
                 SlotStream slot_stream, SliceDone done, Failed failed);
  ~CudaStagedRail() override;

  void post(RailTask task) override;
  void abort(const std::string& why) override;

 private:
  // A reduced chunk on its way to the rail: posted once its D2H copy is done.
  struct ToRail {
    cudaEvent_t copied;
    RailTask task;
  };
  // A copy between a slot's pinned memory and the device.
  struct Copy {
    char* device = nullptr;
    const char* host = nullptr;
    size_t bytes = 0;
  };

  void feeder_loop();
  void back(uint64_t slice_seq);

  Topology topo_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  int slots_;
  int64_t area_;
  SlotStream slot_stream_;
  SliceDone done_;
  Failed failed_;

  char* pinned_ = nullptr;            // one slice per slot
  std::vector<cudaEvent_t> d2h_done_;  // per slot
  std::vector<std::vector<Copy>> returns_;  // per slot: what comes back (set before the post)
  std::unique_ptr<TcpMesh> mesh_;
  std::unique_ptr<RailStage> stage_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ToRail> feed_;
  bool stopping_ = false;
  std::thread feeder_;
};

class CudaNcclRail : public CudaRail {
 public:
  // Collective over the group (every rank must be on its own GPU) and then
  // over the rail.
  CudaNcclRail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
               const PlanParams& params, c10::Device device, SlotStream slot_stream, SliceDone done);
  ~CudaNcclRail() override;

  void post(RailTask task) override;
  // NCCL has no message to send: the communicator is aborted at destruction.
  void abort(const std::string& why) override;

 private:
  void check_own_gpus(const c10::intrusive_ptr<c10d::Store>& store);
  void post_reduction(const RailTask& task, const std::function<char*(int)>& staging, cudaStream_t ns);

  Topology topo_;
  c10::Device device_;
  SlotStream slot_stream_;
  SliceDone done_;
  std::unique_ptr<NcclRail> nccl_;
  std::unique_ptr<DedicatedStream> stream_;  // every exchange, in slice order
  char* staging_ = nullptr;                  // device: the peers' shards this rank serves
  int64_t shard_bytes_ = 0;                  // room per peer in staging_
  cudaEvent_t ready_ = nullptr;              // slot stream -> NCCL stream
  cudaEvent_t finished_ = nullptr;           // NCCL stream -> slot stream
};

// Bytes rounded up to `to` (device allocations keep their areas aligned).
inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
