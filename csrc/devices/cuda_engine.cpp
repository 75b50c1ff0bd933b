#ifdef FAIRRING_WITH_CUDA

#include "devices/cuda_engine.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "node/wait_check.h"
#include "common/error.h"
#include "common/errors.h"
#include "common/fault_injection.h"
#include "common/same_settings.h"
#include "common/log.h"
#include "common/op_key.h"
#include "kernels/reduce_cuda.h"
#include "transport/socket.h"

namespace fairring {

// Staging memory of one rank on the CUDA path: per slot, an input and an
// output area in device memory (K > 1); between nodes, the rail's buffers
// (cuda_rails.h): per slot the chunk's pinned host copy and the RailStage's
// host buffers (wire buffers included), or with NCCL one set of device
// buffers (the served shards and, with compressed rails, the messages).
static int64_t cuda_required_memory(const Config& c, const PlanParams& p, int k, int n) {
  const int64_t device = (k > 1 ? 2 * round_up(c.slice_size, kDeviceAlignBytes) : 0) * c.parallelism;
  if (n < 2) return device;
  if (c.gpu_transport == "nccl") return device + nccl_rail_buffers(c, p, k, n).total();
  return device + staged_rail_bytes(c, p, k, n, round_up(c.slice_size, kDeviceAlignBytes));
}

// Device memory: every step is enqueued on the slot's stream; a step that
// reads a peer's data first waits on the peer's event for it.
class CudaEngine::CudaMover : public Mover {
 public:
  explicit CudaMover(CudaEngine& e) : e_(e), me_(e.topo().local_rank) {}

  char* input_area(int slot, int x) override { return e_.memory_->base(x) + static_cast<int64_t>(slot) * 2 * e_.area_; }
  char* output_area(int slot, int x) override { return input_area(slot, x) + e_.area_; }

  void begin(int slot, PipelineOp& base) override {
    // After the caller's work on the tensor (its stream at submit time).
    auto& op = static_cast<CudaOp&>(base);
    op.enqueued = true;
    cuda_check(cudaStreamWaitEvent(stream(slot), op.ready, 0), "cudaStreamWaitEvent (caller's stream)");
  }
  void done(int slot, PeerStep step) override {
    cuda_check(cudaEventRecord(event(me_, slot, step), stream(slot)), "cudaEventRecord");
  }
  void after(int slot, int x, PeerStep step) override {
    cuda_check(cudaStreamWaitEvent(stream(slot), event(x, slot, step), 0), "cudaStreamWaitEvent (peer)");
  }
  void copy(int slot, char* to, const char* from, int64_t bytes, bool) override {
    cuda_check(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream(slot)),
               "device-to-device copy");
  }
  void reduce(int slot, c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int n, int64_t count,
              int64_t divisor) override {
    reduce_cuda(dtype, op, out, inputs, n, count, divisor, stream(slot));
  }
  void end(int slot) override {
    // The op is done when every one of its slices is: the tail stream collects them.
    cuda_check(cudaEventRecord(e_.slice_end_[slot], stream(slot)), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(e_.tail_->stream(), e_.slice_end_[slot], 0), "cudaStreamWaitEvent (tail)");
  }

 private:
  cudaStream_t stream(int slot) const { return e_.streams_[slot]->stream(); }
  // Interprocess events of local rank x: one per slot and PeerStep.
  // None on a node of one rank, where the schedule asks for none (mover.h).
  cudaEvent_t event(int x, int slot, PeerStep step) const {
    if (!e_.events_) throw Error(ErrorKind::kBackend, "fairring: a CUDA peer event asked for on a node of one rank");
    return e_.events_->at(x, slot * kPeerSteps + static_cast<int>(step));
  }

  CudaEngine& e_;
  const int me_;
};

CudaEngine::CudaEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                       const std::string& job_uid, const Secret& secret, c10::Device device,
                       std::function<void()> peers_failed)
    : Pipeline(topo, config, "CUDA "), device_(device) {
  area_ = round_up(config.slice_size, kDeviceAlignBytes);
  const int k = topo.ranks_per_node;
  const int n = topo.num_nodes;
  require_memory(cuda_required_memory(config, params(), k, n));
  c10::cuda::CUDAGuard guard(device_);
  // Its own corner of the store: the CPU engine's node arena and TCP mesh use
  // the same keys.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("fairring-cuda/", store);
  // Settings every rank must share for its CUDA all-reduces to meet.
  check_same_settings(prefixed, "transport", topo.rank, topo.size, "FAIRRING_GPU_TRANSPORT=" + config.gpu_transport);
  // Host counters and slot headers only: no host data areas (the data is on
  // the device).  A shared-memory name of its own, too.
  set_arena(std::make_unique<NodeArena>(prefixed, topo, job_uid + "-cuda", num_slots(), 64, config.timeout));
  // Construction steps (FAIRRING_TEST_FAIL_AT): ipc, streams, rail, held, start.
  try {
    construction_step("ipc");
    if (k > 1) {
      const std::string key = "node" + std::to_string(topo.node);
      memory_ = std::make_unique<SharedDeviceMemory>(prefixed, key + "/mem", topo.local_ranks(), topo.local_rank,
                                                     static_cast<size_t>(2 * area_ * num_slots()), config.timeout);
      events_ = std::make_unique<SharedEvents>(prefixed, key + "/events", topo.local_ranks(), topo.local_rank,
                                               kPeerSteps * num_slots(), config.timeout);
    }
    construction_step("streams");
    for (int s = 0; s < num_slots(); ++s) {
      streams_.push_back(std::make_unique<DedicatedStream>(device_, /*high_priority=*/true));
      slice_end_.push_back(new_event());
    }
    tail_ = std::make_unique<DedicatedStream>(device_, true);
    future_stream_ = std::make_unique<DedicatedStream>(device_, false);

    construction_step("rail");
    if (n > 1) {
      SlotStream slot_stream = [this](int slot) { return streams_[slot]->stream(); };
      RailExchange::SliceDone done = [this](uint64_t seq) { chunk_back(seq); };
      if (config.gpu_transport == "nccl") {
        rail_ = std::make_unique<CudaNcclRail>(prefixed, topo, config, params(), device_, std::move(slot_stream),
                                               std::move(done), std::move(peers_failed));
      } else {
        rail_ = std::make_unique<CudaStagedRail>(prefixed, topo, config, params(), secret, device_, area_,
                                                 std::move(slot_stream), std::move(done),
                                                 [this](const Error& why) { fail(why); });
      }
    }
    construction_step("held");
    HeldOps::Hooks hooks;
    hooks.thread_start = [this] {
      cuda_ok_or_log(cudaSetDevice(device_.index()), this->topo().rank, "cudaSetDevice");
      relax_capture_mode_of_this_thread(this->topo().rank);
    };
    hooks.finished = [this](const PipelineOp& op) {
      const auto& c = static_cast<const CudaOp&>(op);
      if (!c.enqueued) return true;  // nothing of it reached the device
      if (c.end_unknown) return false;
      return cuda_done(cudaEventQuery(c.done->get()), "querying a collective's completion");
    };
    hooks.check_peers = [this] { check_peers(); };
    hooks.fault = [this](const Error& why) { fail(why); };
    hooks.device_failed = [](const PipelineOp& op, const Error& why) {
      const auto& c = static_cast<const CudaOp&>(op);
      if (c.device_failed) c.device_failed(why);
    };
    held_ = std::make_unique<HeldOps>(topo.rank, std::move(hooks), config.timeout);
    mover_ = std::make_unique<CudaMover>(*this);
    set_movers(*mover_, rail_.get());
    construction_step("start");
    if (rail_) rail_->start();  // its threads may fail the group, which reaches rail_
  } catch (...) {
    unwind_construction();
    throw;
  }
  start();
}

void CudaEngine::unwind_construction() noexcept {
  // In reverse order of construction; nothing was enqueued yet.
  held_.reset();
  mover_.reset();
  rail_.reset();
  c10::cuda::CUDAGuard guard(device_);
  for (cudaEvent_t ev : slice_end_) cuda_ok_or_log(cudaEventDestroy(ev), topo().rank, "cudaEventDestroy");
  slice_end_.clear();
  future_stream_.reset();
  tail_.reset();
  streams_.clear();
  // A peer may have mapped our memory and opened our events already, and is
  // failing on its own schedule: close what we opened of theirs, leave ours
  // to the process's exit rather than free it under a peer.
  if (events_) {
    events_->close_peers();
    events_->leak_own();
    events_.reset();
  }
  if (memory_) {
    memory_->close_peers();
    memory_->leak_own();
    memory_.reset();
  }
}

CudaEngine::~CudaEngine() {
  stop();
  // Waits for the held ops' device work (not after a failure).  held_ itself
  // lives on until the rail's threads, which may still fail the group, are gone.
  held_->stop();
  c10::cuda::CUDAGuard guard(device_);
  const int rank = topo().rank;
  // Within the timeout, and not at all after a failure (a dead peer's event
  // may never come): otherwise the leak path below.
  bool idle = !failed() && !arena().aborted();
  const auto until = Clock::now() + config().timeout;
  std::vector<cudaStream_t> ours;
  for (auto& s : streams_) ours.push_back(s->stream());
  ours.push_back(tail_->stream());
  ours.push_back(future_stream_->stream());
  for (cudaStream_t s : ours) {
    if (!idle) break;
    try {
      idle = caught_up(s, until);
      if (!idle) FAIRRING_LOG(rank, "CUDA engine teardown: the device work did not finish within the timeout");
    } catch (const std::exception& e) {
      FAIRRING_LOG(rank, "CUDA engine teardown: %s", e.what());
      idle = false;
    }
  }
  if (!idle) {
    // Our streams may wait on a dead peer's events forever, and freeing
    // memory they use would wait for them (or pull it from under them):
    // leave it to the process's exit.  Destroying the streams and local
    // events is fine (CUDA releases them once their work is done).
    FAIRRING_DEBUG_LOG(rank, "CUDA engine teardown after a failure: staging memory not freed");
    if (rail_) rail_->leak_on_destroy();
    rail_.reset();
    (void)memory_.release();  // deliberately leaked
    (void)events_.release();
  } else {
    // Phase 1: our device work is over, and with it every use of the peers'
    // memory and events, and of the rail's staging memory.
    rail_.reset();
    // Phases 2 and 3: close what we imported, then free what we exported
    // once every peer has closed it.
    close_ipc();
  }
  for (cudaEvent_t ev : slice_end_) cuda_ok_or_log(cudaEventDestroy(ev), rank, "cudaEventDestroy");
  // The streams go with the members, after this (synchronized above).
}

// The CUDA IPC rules: an exported allocation must not be freed, nor an
// exported event destroyed, while a peer still has it open.  So: close our
// imports, say so in the node's control block, and wait (bounded by the
// timeout) for every peer to say the same before releasing our exports.  A
// peer that has exited has closed everything; one that does not answer in
// time leaves our exports leaked (safe) rather than freed under it.
void CudaEngine::close_ipc() {
  if (!memory_ && !events_) return;
  NodeControl& c = arena().control();
  const int me = topo().local_rank;
  if (memory_) memory_->close_peers();
  if (events_) events_->close_peers();
  counter_publish(c.cuda_closed[me], 1);
  const auto give_up = Clock::now() + config().timeout;
  bool all_closed = true;
  for (int x = 0; x < topo().ranks_per_node; ++x) {
    if (x == me) continue;
    try {
      counter_wait(c.cuda_closed[x], 1, [&] {
        if (!process_alive(c.pids[x])) throw Error(ErrorKind::kBackend, "it exited");
        if (arena().aborted())
          throw reworded(arena().abort_error(), std::string("the node aborted: ") + arena().abort_error().what());
        if (Clock::now() > give_up) throw Error(ErrorKind::kBackend, "Timed out");
      });
    } catch (const std::exception& e) {
      if (!process_alive(c.pids[x])) continue;  // its mappings went with it
      all_closed = false;
      FAIRRING_LOG(topo().rank,
                   "CUDA engine teardown: rank %d did not close this rank's CUDA IPC memory and events (%s); "
                   "leaving them to the process's exit",
                   topo().local_ranks()[x], e.what());
    }
  }
  if (!all_closed) {
    if (memory_) memory_->leak_own();
    if (events_) events_->leak_own();
  }
  events_.reset();
  memory_.reset();
}

void CudaEngine::on_loop_start() {
  cuda_check(cudaSetDevice(device_.index()), "cudaSetDevice");
  relax_capture_mode_of_this_thread(topo().rank);
}

void CudaEngine::stage(PipelineOp& base, bool on_caller) {
  auto& op = static_cast<CudaOp&>(base);
  if (on_caller) {
    // On the caller's stream, after what `ready` marks: `ready` moves past it.
    if (op.stage) op.stage();
    cuda_check(cudaEventRecord(op.ready, c10::cuda::getCurrentCUDAStream(device_.index()).stream()),
               "cudaEventRecord on the caller's stream");
    return;
  }
  // The loop thread, for an op that had to follow an earlier one: the tail
  // stream has recorded that op's `done` (op_done), so what runs on it now
  // runs after that op's device work and after the caller's (`ready`); the
  // op's slices start after the new `ready`.
  c10::cuda::CUDAStreamGuard on_tail(tail_->c10());
  // The stage writes the op's memory on the tail: a failure from here on
  // must still record `done` after it (settle).
  op.enqueued = true;
  cuda_check(cudaStreamWaitEvent(tail_->stream(), op.ready, 0), "cudaStreamWaitEvent (caller's stream)");
  if (op.stage) op.stage();
  cuda_check(cudaEventRecord(op.ready, tail_->stream()), "cudaEventRecord (op staged)");
}

void CudaEngine::op_done(PipelineOp& base) {
  auto& op = static_cast<CudaOp&>(base);
  if (!op.users.empty()) {
    // Non-contiguous caller tensors get the result after the last slice.
    c10::cuda::CUDAStreamGuard on_tail(tail_->c10());
    op.copy_to_users(/*non_blocking=*/true);
  }
  cuda_check(cudaEventRecord(op.done->get(), tail_->stream()), "cudaEventRecord (op done)");
}

void CudaEngine::settle(PipelineOp& base, std::exception_ptr& error) {
  auto& op = static_cast<CudaOp&>(base);
  // A failed op (drained by the loop, or the inline path's): `done` was
  // never recorded, and a never-recorded event reads as complete.  The
  // rail's threads have let go by now (Pipeline::after_let_go), so what is
  // queued for it is all there is.
  if (error && op.enqueued) fence_failed(op);
  if (op.ready) {
    cudaEventDestroy(op.ready);  // its waits are enqueued (or never will be)
    op.ready = nullptr;
  }
}

std::function<void()> CudaEngine::completion_call(const std::shared_ptr<PipelineOp>& base, std::exception_ptr error) {
  auto& op = static_cast<CudaOp&>(*base);
  auto after = std::move(op.after_complete);
  op.after_complete = nullptr;
  const bool on_device = !error && op.enqueued;
  std::shared_ptr<CudaEvent> done = op.done;
  held_->hold(base);  // its tensors, until its device work is over
  if (!after) return nullptr;
  // Captures no engine member: a completion may run after the engine is gone.
  return
      [after = std::move(after), error, on_device, done = std::move(done), stream = future_stream_, device = device_] {
        c10::cuda::CUDAGuard guard(device);
        // The future's own event is recorded on the future stream, which waits
        // for exactly this op (completions start in issue order).
        if (on_device) cuda_check(cudaStreamWaitEvent(stream->stream(), done->get(), 0), "cudaStreamWaitEvent");
        after(error, stream->c10());
      };
}

void CudaEngine::fence_failed(CudaOp& op) noexcept {
  try {
    c10::cuda::CUDAGuard guard(device_);
    const int slots = num_slots();
    // The slot streams (CudaMover::end: the tail waits for each), then the
    // rail's own stream (NCCL), whose transfers into the op's memory a slot
    // stream may not have waited for yet.
    fence_failed_op(
        slots + 1,
        [&](int s) {
          if (s < slots) {
            mover_->end(s);
          } else if (rail_) {
            rail_->order_before(tail_->stream());
          }
        },
        [&] { cuda_check(cudaEventRecord(op.done->get(), tail_->stream()), "cudaEventRecord (a failed op's end)"); });
  } catch (const std::exception& e) {
    op.end_unknown = true;
    FAIRRING_LOG(topo().rank,
                 "%s #%llu failed and the end of its device work cannot be marked (%s): its tensors are kept until "
                 "the group is destroyed",
                 collective_name(op.collective), static_cast<unsigned long long>(op.number), e.what());
  }
}

void CudaEngine::on_set_timeout(std::chrono::milliseconds timeout) {
  if (rail_) rail_->set_timeout(timeout);
}

void CudaEngine::on_failed(const Error& why) {
  if (rail_) rail_->abort(why);  // the NCCL rail aborts its communicator: its kernels end
  if (held_) held_->group_failed(why);
}

bool CudaEngine::let_go(TimePoint until) {
  // The staged rail's thread enqueues copies into the op's memory until it
  // stops; what is enqueued already is held_'s (completion_call).
  return !rail_ || rail_->let_go(until);
}

bool CudaEngine::caught_up(cudaStream_t stream, TimePoint until) {
  PeerWatch peers;
  return stream_caught_up(device_, stream, until, [&] {
    const auto now = Clock::now();
    if (!peers.due(now)) return;
    std::optional<Error> trouble;
    try {
      check_peers();
    } catch (const std::exception& e) {
      trouble.emplace(error_of(e));
    }
    if (auto gone = peers.saw(now, std::move(trouble))) throw *gone;
  });
}

void CudaEngine::check_peers() {
  if (arena().aborted()) throw arena().abort_error();
  if (rail_) rail_->check();
  NodeControl& c = arena().control();
  for (int x = 0; x < topo().ranks_per_node; ++x) {
    if (x != topo().local_rank && !process_alive(c.pids[x])) {
      throw Error(ErrorKind::kBackend,
                  "rank " + std::to_string(topo().local_ranks()[x]) + " (pid " + std::to_string(c.pids[x]) +
                      ") exited while this rank's CUDA work waited for it: Connection closed by peer");
    }
  }
}

void CudaEngine::wait_device_idle() {
  // After a failure the device work may wait on a dead peer's events: the
  // host-side completion (every op failed) is all there is to wait for.
  if (failed()) return;
  const auto timeout = config().timeout;
  std::optional<Error> why;
  try {
    if (caught_up(tail_->stream(), Clock::now() + timeout)) return;
    why.emplace(ErrorKind::kBackend,
                "Timed out: the device work of this group's CUDA collectives did not finish within " +
                    std::to_string(timeout.count()) + " ms (is a local peer stalled?)");
  } catch (const std::exception& e) {
    why.emplace(error_of(e));
  }
  const Error failed = attributed(topo().rank, *why);
  fail(failed);
  throw reworded(failed, std::string("fairring: ") + failed.what());
}

bool CudaEngine::quiesce_device(TimePoint until) { return held_->wait_released(until); }

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
