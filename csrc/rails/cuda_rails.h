// The rail exchanges of the CUDA path, both behind the schedule's
// RailExchange and both running the same walk as the TCP stage (rail_walk.h):
//
//   CudaStagedRail  the TCP RailStage fed through pinned host memory: the
//                   chunk goes to the host on the slot's stream (D2H), a
//                   RailFeeder posts it once that copy is done, and the
//                   result comes back on the slot's stream (H2D).
//   CudaNcclRail    FAIRRING_GPU_TRANSPORT=nccl: the rail walk as
//                   NCCL sends and receives on one NCCL stream, ordered after
//                   and before the slot's stream; nothing waits on the host.
//
// Compressed rails (wire_dtype, wire_codec.h) round the same values on both:
// the staged rail's RailStage encodes on the host, the NCCL rail with the
// CUDA codec (kernels/convert_cuda.h) on its stream.
//
// Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "rails/rail_stage.h"
#include "rails/wire_codec.h"
#include "common/config.h"
#include "common/cuda_resources.h"
#include "rails/rail_exchange.h"
#include "rails/rail_feeder.h"
#include "topology/topology.h"
#include "transport/nccl_rail.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

// The slot's stream, where the schedule's work on a slice is enqueued.
using SlotStream = std::function<cudaStream_t(int slot)>;

// Bytes rounded up to `to` (device allocations keep their areas aligned).
inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
// Device staging areas start on this boundary (the kernels' widest loads and
// the allocator's granularity are smaller).
constexpr int64_t kDeviceAlignBytes = 256;

// Staging memory of the rails, as the rails allocate it and the engine
// counts it (FAIRRING_TOTAL_MEMORY), for a group of `n` > 1 nodes of `k`.
// The staged rail, all slots: per slot a slice of pinned host memory
// (`area` bytes) and its RailStage's host buffers.
int64_t staged_rail_bytes(const Config& config, const PlanParams& params, int k, int n, int64_t area);
// The NCCL rail's device buffers, one set (its exchanges run one at a time):
// the full-precision shards it serves, one per peer; with compressed rails
// also a message per node that it sends (ours to each server, and at our own
// node the served result) and one per peer that it receives (contributions,
// then results).
struct NcclRailBuffers {
  int nodes = 0;
  int64_t shard = 0;    // per peer
  int64_t message = 0;  // per message buffer; 0 without compressed rails
  int64_t total() const { return (nodes - 1) * shard + (2 * nodes - 1) * message; }
};
NcclRailBuffers nccl_rail_buffers(const Config& config, const PlanParams& params, int k, int n);

class CudaRail : public RailExchange {
 public:
  // After a failure the device work may never finish: the destructor leaves
  // the staging memory it uses to the process's exit instead of freeing it.
  // Otherwise the owner has synchronized the slot streams before destroying.
  void leak_on_destroy() { leak_ = true; }
  // Starts the rail's own threads, if any, once its owner holds it (they
  // may fail the group, which reaches the owner's pointer to the rail).
  virtual void start() {}
  // From the watchdog, any thread: throws, naming it, if the rail's
  // transport has failed on its own (NCCL reports such errors only when asked).
  virtual void check() {}
  // Makes `stream` wait for what the rail has queued so far on a stream of
  // its own (a failed op's fence: its transfers may write the op's memory).
  // Nothing for a rail whose device work is all on the slot streams.
  virtual void order_before(cudaStream_t stream) { (void)stream; }
  // The group's new timeout (set_timeout), for the rail's waits from now
  // on; a rail whose waits all run under the engine's keeps nothing.
  virtual void set_timeout(std::chrono::milliseconds timeout) { (void)timeout; }

 protected:
  bool leak_ = false;
};

class CudaStagedRail : public CudaRail {
 public:
  // Collective over the rail.  Pinned memory per slot for a slice of `area`
  // bytes: its chunk, or the pieces of its exchange.
  CudaStagedRail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                 const PlanParams& params, const Secret& secret, c10::Device device, int64_t area,
                 SlotStream slot_stream, SliceDone done, Failed failed);
  ~CudaStagedRail() override;

  void start() override { stage_->start(); }
  void post(RailTask task) override;
  void abort(const Error& why) override;
  bool let_go(std::chrono::steady_clock::time_point until) override { return stage_->let_go(until); }
  void set_timeout(std::chrono::milliseconds timeout) override { stage_->set_timeout(timeout); }

 private:
  // A copy between a slot's pinned memory and the device.
  struct Copy {
    char* device = nullptr;
    const char* host = nullptr;
    size_t bytes = 0;
  };

  void back(uint64_t slice_seq);
  // post() for kExchange: the pieces through `host`, the slot's pinned memory.
  void post_exchange(RailTask task, const RailWalk& walk, char* host);

  Topology topo_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  int slots_;
  int64_t area_;  // pinned bytes per slot: a slice, or an exchange's pieces (exchange_staging_bytes)
  SlotStream slot_stream_;
  SliceDone done_;
  Failed failed_;

  char* pinned_ = nullptr;                  // one slice per slot
  std::vector<cudaEvent_t> d2h_done_;       // per slot
  std::vector<std::vector<Copy>> returns_;  // per slot: what comes back (set before the post)
  std::unique_ptr<TcpMesh> mesh_;
  std::unique_ptr<RailStage> stage_;
  std::unique_ptr<RailFeeder> feeder_;  // into stage_
};

class CudaNcclRail : public CudaRail {
 public:
  // Collective over the group (every rank must be on its own GPU) and then
  // over the rail.
  // `interrupted` throws a peer's published construction failure (NcclRail).
  CudaNcclRail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
               const PlanParams& params, c10::Device device, SlotStream slot_stream, SliceDone done,
               std::function<void()> interrupted);
  ~CudaNcclRail() override;

  void post(RailTask task) override;
  // Aborts the communicator at once: NCCL kernels waiting on a dead peer
  // end, and the device work queued behind them can finish.
  void abort(const Error& why) override;
  void check() override;
  void order_before(cudaStream_t stream) override;
  // No thread of its own: its work is on the slot streams, held by the engine.
  bool let_go(std::chrono::steady_clock::time_point) override { return true; }

 private:
  void check_own_gpus(const c10::intrusive_ptr<c10d::Store>& store);
  void walk(const RailTask& task, cudaStream_t ns);
  // Where peer j's full-precision shard is (the one we serve), and with
  // compressed rails where our message to node j is, and where node j's
  // message to us lands (see NcclRailBuffers).
  int peer_index(int j) const { return j < topo_.node ? j : j - 1; }
  char* staging(int j) const { return staging_ + peer_index(j) * buffers_.shard; }
  char* message_out(int j) const { return staging_ + (buffers_.nodes - 1) * buffers_.shard + j * buffers_.message; }
  char* message_in(int j) const { return message_out(buffers_.nodes) + peer_index(j) * buffers_.message; }

  Topology topo_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  SlotStream slot_stream_;
  SliceDone done_;
  std::unique_ptr<NcclRail> nccl_;
  std::unique_ptr<DedicatedStream> stream_;  // every exchange, in slice order
  WireCodec codec_;                          // which exchanges compress
  NcclRailBuffers buffers_;
  char* staging_ = nullptr;         // device: buffers_.total() bytes
  cudaEvent_t ready_ = nullptr;     // slot stream -> NCCL stream
  cudaEvent_t finished_ = nullptr;  // NCCL stream -> slot stream
  cudaEvent_t fenced_ = nullptr;    // NCCL stream -> a failed op's fence (order_before)
};

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
