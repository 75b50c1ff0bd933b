#ifdef FAIRRING_WITH_CUDA

#include "allreduce/cuda_engine.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>
#include <set>
#include <stdexcept>

#include "allreduce/rail_plan.h"
#include "allreduce/wait_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cuda.h"
#include "transport/socket.h"

namespace fairring {

namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Live engines, for quiesce_all_cuda_engines().
std::mutex g_cuda_engines_mu;
std::set<CudaEngine*> g_cuda_engines;

// How often the completion thread checks whether held ops' device work is over.
constexpr auto kRetirePoll = std::chrono::milliseconds(1);

cudaEvent_t new_event() {
  cudaEvent_t ev = nullptr;
  cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cannot create a CUDA event");
  return ev;
}

}  // namespace

// Staging memory of one rank on the CUDA path: per slot, an input and an
// output area in device memory (K > 1), the chunk's pinned host copy and the
// reduction server's receive buffers (N > 1).
// With NCCL between nodes the host part is replaced by one device buffer
// for the shards this rank serves (the exchanges run one at a time).
static int64_t cuda_required_memory(const Config& c, const PlanParams& p, int k, int n) {
  const int64_t device = k > 1 ? 2 * round_up(c.slice_size, 256) : 0;
  if (c.gpu_transport == "nccl") {
    return device * c.parallelism + (n > 1 ? (n - 1) * round_up(max_shard_bytes(p, k, n), 256) : 0);
  }
  const int64_t host = n > 1 ? c.slice_size + (n - 1) * max_shard_bytes(p, k, n) : 0;
  return (device + host) * c.parallelism;
}

CudaEngine::CudaEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                       const std::string& job_uid, const Secret& secret, c10::Device device)
    : topo_(topo), config_(config), device_(device) {
  params_.slice_bytes = config_.slice_size;
  slots_ = config_.parallelism;
  area_ = round_up(config_.slice_size, 256);
  const int k = topo_.ranks_per_node;
  const int n = topo_.num_nodes;
  const int64_t need = cuda_required_memory(config_, params_, k, n);
  if (need > config_.total_memory) {
    throw std::invalid_argument(
        "FAIRRING_TOTAL_MEMORY=" + std::to_string(config_.total_memory) + " bytes is too small for the CUDA "
        "all-reduce with FAIRRING_PARALLELISM=" + std::to_string(slots_) + " slices of FAIRRING_SLICE_SIZE=" +
        std::to_string(config_.slice_size) + " bytes, " + std::to_string(k) + " ranks per node and " +
        std::to_string(n) + " nodes: it needs " + std::to_string(need) +
        " bytes. Raise FAIRRING_TOTAL_MEMORY or lower FAIRRING_SLICE_SIZE / FAIRRING_PARALLELISM.");
  }
  c10::cuda::CUDAGuard guard(device_);
  // Its own corner of the store: the CPU engine's node arena and TCP mesh use
  // the same keys.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("fairring-cuda/", store);
  // Settings every rank must share for its CUDA all-reduces to meet.
  {
    const std::string mine = "FAIRRING_GPU_TRANSPORT=" + config_.gpu_transport;
    prefixed->set("transport/" + std::to_string(topo_.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < topo_.size; ++r) {
      const std::vector<uint8_t> raw = prefixed->get("transport/" + std::to_string(r));
      const std::string theirs(raw.begin(), raw.end());
      if (theirs != mine) {
        throw std::invalid_argument("fairring: ranks of one process group must use the same options, but rank " +
                                    std::to_string(topo_.rank) + " has " + mine + " and rank " + std::to_string(r) +
                                    " has " + theirs);
      }
    }
  }
  // Host counters and slot headers only: no host data areas (the data is on
  // the device).  A shared-memory name of its own, too.
  arena_ = std::make_unique<NodeArena>(prefixed, topo_, job_uid + "-cuda", slots_, 64, config_.timeout);
  if (k > 1) {
    const std::string key = "node" + std::to_string(topo_.node);
    memory_ = std::make_unique<SharedDeviceMemory>(prefixed, key + "/mem", topo_.local_ranks(), topo_.local_rank,
                                                   static_cast<size_t>(2 * area_ * slots_), config_.timeout);
    events_ = std::make_unique<SharedEvents>(prefixed, key + "/events", topo_.local_ranks(), topo_.local_rank,
                                             3 * slots_, config_.timeout);
  }
  for (int s = 0; s < slots_; ++s) {
    streams_.push_back(std::make_unique<DedicatedStream>(device_, /*high_priority=*/true));
    slice_end_.push_back(new_event());
  }
  tail_ = std::make_unique<DedicatedStream>(device_, true);
  future_stream_ = std::make_unique<DedicatedStream>(device_, false);

  if (n > 1 && config_.gpu_transport == "nccl") {
    check_own_gpus(prefixed);
    nccl_ = std::make_unique<NcclRail>(prefixed, "nccl/rail" + std::to_string(topo_.local_rank), n, topo_.node,
                                       config_.timeout, topo_.rank);
    nccl_stream_ = std::make_unique<DedicatedStream>(device_, true);
    nccl_shard_bytes_ = round_up(max_shard_bytes(params_, k, n), 256);
    void* staging = nullptr;
    cuda_check(cudaMalloc(&staging, static_cast<size_t>(nccl_shard_bytes_ * (n - 1))),
               "cannot allocate the NCCL receive buffers");
    nccl_staging_ = static_cast<char*>(staging);
    nccl_ready_ = new_event();
    nccl_done_ = new_event();
  } else if (n > 1) {
    void* host = nullptr;
    cuda_check(cudaHostAlloc(&host, static_cast<size_t>(area_ * slots_), cudaHostAllocPortable),
               "cannot allocate pinned host staging memory");
    pinned_ = static_cast<char*>(host);
    returns_.resize(slots_);
    for (int s = 0; s < slots_; ++s) d2h_done_.push_back(new_event());
    std::vector<int> peers;
    for (int r : topo_.rail()) {
      if (r != topo_.rank) peers.push_back(r);
    }
    mesh_ = std::make_unique<TcpMesh>(prefixed, topo_.rank, peers, secret, config_.socket_ifname, config_.timeout);
    mesh_->connect();
    RailStage::Callbacks cb;
    cb.slice_done = [this](uint64_t seq) { rail_done(seq); };
    cb.failed = [this](const std::string& why) { fail(why); };
    rail_ = std::make_unique<RailStage>(topo_, *mesh_, reduce_cpu, std::move(cb), config_.timeout, slots_,
                                        max_shard_bytes(params_, k, n));
    feeder_ = std::thread([this] { feeder_loop(); });
  }
  completer_ = std::thread([this] { completion_loop(); });
  proxy_ = std::thread([this] { proxy_loop(); });
  std::lock_guard<std::mutex> lock(g_cuda_engines_mu);
  g_cuda_engines.insert(this);
}

CudaEngine::~CudaEngine() {
  {
    std::lock_guard<std::mutex> lock(g_cuda_engines_mu);
    g_cuda_engines.erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (proxy_.joinable()) proxy_.join();
  {
    std::lock_guard<std::mutex> lock(feed_mu_);
    feed_stopping_ = true;
  }
  feed_cv_.notify_all();
  if (feeder_.joinable()) feeder_.join();
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_stopping_ = true;
  }
  done_cv_.notify_all();
  if (completer_.joinable()) {
    if (std::this_thread::get_id() == completer_.get_id()) {
      completer_.detach();
    } else {
      completer_.join();
    }
  }
  rail_.reset();
  mesh_.reset();
  c10::cuda::CUDAGuard guard(device_);
  const int rank = topo_.rank;
  if (nccl_ && (failed_.load() || arena_->aborted())) nccl_->abort_on_destroy();
  nccl_.reset();
  if (failed_.load() || arena_->aborted()) {
    // Our streams may wait on a dead peer's events forever, and freeing
    // memory they use would wait for them (or pull it from under them):
    // leave it to the process's exit.  Destroying the streams and local
    // events is fine (CUDA releases them once their work is done).
    FAIRRING_DEBUG_LOG(rank, "CUDA engine teardown after a failure: staging memory not freed");
    (void)memory_.release();  // deliberately leaked
    (void)events_.release();
    pinned_ = nullptr;
    nccl_staging_ = nullptr;
  } else {
    // Phase 1: our device work is over, and with it every use of the peers'
    // memory and events.
    for (auto& s : streams_) cuda_ok_or_log(cudaStreamSynchronize(s->stream()), rank, "cudaStreamSynchronize (slot)");
    for (auto* s : {tail_.get(), future_stream_.get(), nccl_stream_.get()}) {
      if (s) cuda_ok_or_log(cudaStreamSynchronize(s->stream()), rank, "cudaStreamSynchronize");
    }
    // Phases 2 and 3: close what we imported, then free what we exported
    // once every peer has closed it.
    close_ipc();
  }
  for (cudaEvent_t ev : slice_end_) cuda_ok_or_log(cudaEventDestroy(ev), rank, "cudaEventDestroy");
  for (cudaEvent_t ev : d2h_done_) cuda_ok_or_log(cudaEventDestroy(ev), rank, "cudaEventDestroy");
  if (nccl_ready_) cuda_ok_or_log(cudaEventDestroy(nccl_ready_), rank, "cudaEventDestroy");
  if (nccl_done_) cuda_ok_or_log(cudaEventDestroy(nccl_done_), rank, "cudaEventDestroy");
  if (pinned_) cuda_ok_or_log(cudaFreeHost(pinned_), rank, "cudaFreeHost");
  if (nccl_staging_) cuda_ok_or_log(cudaFree(nccl_staging_), rank, "cudaFree (NCCL staging)");
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
  NodeControl& c = arena_->control();
  const int me = topo_.local_rank;
  if (memory_) memory_->close_peers();
  if (events_) events_->close_peers();
  counter_publish(c.cuda_closed[me], 1);
  const auto give_up = Clock::now() + config_.timeout;
  bool all_closed = true;
  for (int x = 0; x < topo_.ranks_per_node; ++x) {
    if (x == me) continue;
    try {
      counter_wait(c.cuda_closed[x], 1, [&] {
        if (!process_alive(c.pids[x])) throw std::runtime_error("it exited");
        if (arena_->aborted()) throw std::runtime_error("the node aborted: " + arena_->abort_message());
        if (Clock::now() > give_up) throw std::runtime_error("timed out");
      });
    } catch (const std::exception& e) {
      if (!process_alive(c.pids[x])) continue;  // its mappings went with it
      all_closed = false;
      FAIRRING_LOG(topo_.rank,
                   "CUDA engine teardown: rank %d did not close this rank's CUDA IPC memory and events (%s); "
                   "leaving them to the process's exit",
                   topo_.local_ranks()[x], e.what());
    }
  }
  if (!all_closed) {
    if (memory_) memory_->leak_own();
    if (events_) events_->leak_own();
  }
  events_.reset();
  memory_.reset();
}

void CudaEngine::submit(std::shared_ptr<CudaAllreduceOp> op) {
  std::unique_lock<std::mutex> lock(mu_);
  op->seq = submitted_++;
  arena_->control().issued[topo_.local_rank].store(op->seq + 1, std::memory_order_release);
  if (!error_.empty()) {
    const std::string why = error_;
    lock.unlock();
    complete(op, std::make_exception_ptr(std::runtime_error("fairring: all_reduce #" + std::to_string(op->seq) +
                                                            " not started: this process group failed earlier: " +
                                                            why)));
    return;
  }
  queue_.push_back(std::move(op));
  lock.unlock();
  cv_.notify_all();
}

void CudaEngine::wait_idle() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return completed_ == submitted_; });
  }
  // After a failure the device work may wait on a dead peer's events: the
  // host-side completion (every op failed) is all there is to wait for.
  if (failed_.load()) return;
  c10::cuda::CUDAGuard guard(device_);
  cuda_check(cudaStreamSynchronize(tail_->stream()), "waiting for the CUDA all-reduces");
}

void CudaEngine::complete(const std::shared_ptr<CudaAllreduceOp>& op, std::exception_ptr error) {
  if (op->ready) {
    cudaEventDestroy(op->ready);  // its waits are enqueued (or never will be)
    op->ready = nullptr;
  }
  auto done = std::move(op->on_complete);
  op->on_complete = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++completed_;
  }
  cv_.notify_all();
  if (done) done(error);
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_queue_.push_back(op);
    done_errors_.push_back(error);
  }
  done_cv_.notify_all();  // quiesce() waits on it too
}

void CudaEngine::completion_loop() {
  c10::cuda::CUDAGuard guard(device_);
  // Ops completed here whose device work may still run: held for their tensors.
  std::deque<std::shared_ptr<CudaAllreduceOp>> retiring;
  Clock::time_point stop_by{};
  for (;;) {
    std::shared_ptr<CudaAllreduceOp> op;
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(done_mu_);
      done_busy_ = false;
      retiring_ = retiring.size();
      done_cv_.notify_all();  // quiesce() may be waiting for this
      auto wake = [&] { return !done_queue_.empty() || (done_stopping_ && retiring.empty()); };
      if (retiring.empty()) {
        done_cv_.wait(lock, wake);
      } else {
        done_cv_.wait_for(lock, kRetirePoll, wake);
      }
      if (!done_queue_.empty()) {
        op = std::move(done_queue_.front());
        error = done_errors_.front();
        done_queue_.pop_front();
        done_errors_.pop_front();
        done_busy_ = true;
      } else if (done_stopping_) {
        if (retiring.empty()) return;
        if (stop_by == Clock::time_point{}) stop_by = Clock::now() + config_.timeout;
        if (failed_.load() || Clock::now() > stop_by) {
          // Device work that may never finish: its tensors must not go back
          // to the allocator.
          FAIRRING_DEBUG_LOG(topo_.rank, "CUDA engine teardown: %zu ops' tensors not released", retiring.size());
          new std::deque<std::shared_ptr<CudaAllreduceOp>>(std::move(retiring));  // deliberately leaked
          retiring_ = 0;
          return;
        }
      }
    }
    if (op) {
      try {
        // The future's own event is recorded on future_stream_, which waits
        // for exactly this op (ops complete here in order).
        if (!error && op->enqueued) {
          cuda_check(cudaStreamWaitEvent(future_stream_->stream(), op->done->get(), 0), "cudaStreamWaitEvent");
        }
        auto after = std::move(op->after_complete);
        op->after_complete = nullptr;
        if (after) after(error, future_stream_->c10());
      } catch (const std::exception& e) {
        FAIRRING_LOG(topo_.rank, "a completion callback raised: %s", e.what());
      }
      retiring.push_back(std::move(op));
    }
    retire(retiring);
  }
}

void CudaEngine::retire(std::deque<std::shared_ptr<CudaAllreduceOp>>& retiring) {
  // Ops finish on the tail stream in order: the front is the first to check.
  while (!retiring.empty()) {
    CudaAllreduceOp& op = *retiring.front();
    if (op.enqueued) {
      // After a failure the device work may wait forever on a dead peer.
      if (failed_.load()) return;
      try {
        if (!cuda_done(cudaEventQuery(op.done->get()), "querying an all_reduce's completion")) return;
      } catch (const std::exception& e) {
        FAIRRING_LOG(topo_.rank, "CUDA all-reduce #%llu: %s; its tensors are not released",
                     static_cast<unsigned long long>(op.seq), e.what());
        new std::shared_ptr<CudaAllreduceOp>(std::move(retiring.front()));  // deliberately leaked
      }
    }
    retiring.pop_front();
  }
}

bool CudaEngine::quiesce(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, until, [&] { return completed_ == submitted_; })) return false;
  }
  std::unique_lock<std::mutex> lock(done_mu_);
  // After a failure held ops stay held (their device work may never end).
  return done_cv_.wait_until(
      lock, until, [&] { return done_queue_.empty() && !done_busy_ && (retiring_ == 0 || failed_.load()); });
}

void quiesce_all_cuda_engines() {
  std::lock_guard<std::mutex> lock(g_cuda_engines_mu);
  // Bounded as Engine::quiesce_all.
  const std::chrono::milliseconds limit(10000);
  for (CudaEngine* e : g_cuda_engines) {
    if (!e->quiesce(limit)) {
      FAIRRING_LOG(e->rank(), "CUDA all_reduces still in flight at exit (a peer is stalled?); not waiting for them");
    }
  }
}

void CudaEngine::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;
    error_ = why;
    failed_ = true;
  }
  FAIRRING_DEBUG_LOG(topo_.rank, "CUDA all-reduce failing: %s", why.c_str());
  arena_->abort(topo_.rank, why);
  if (rail_) rail_->abort(why);
  cv_.notify_all();
  feed_cv_.notify_all();
}

std::function<void()> CudaEngine::wait_check(int local_peer, const char* what, uint64_t op_seq, bool via_network) {
  return make_wait_check(topo_, *arena_, config_.timeout, [this] {
    if (failed_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      throw std::runtime_error(error_);
    }
  }, "CUDA all_reduce", local_peer, what, op_seq, via_network);
}

void CudaEngine::reduce_scatter(Pending& p) {
  const CudaAllreduceOp& op = *p.op;
  const int k = topo_.ranks_per_node;
  const int me = topo_.local_rank;
  const int slot = static_cast<int>(p.seq % slots_);
  const int64_t esize = c10::elementSize(op.dtype);
  const uint32_t mark = static_cast<uint32_t>(p.seq + 1);
  cudaStream_t stream = streams_[slot]->stream();
  char* tensor = static_cast<char*>(op.buffer.data_ptr()) + p.plan.slice.offset * esize;
  const int64_t divisor = (op.op == RedOp::kAvg) ? topo_.size : 0;
  NodeControl& c = arena_->control();

  // After the caller's work on the tensor (its stream at submit time).
  p.op->enqueued = true;
  cuda_check(cudaStreamWaitEvent(stream, op.ready, 0), "cudaStreamWaitEvent (caller's stream)");

  char* chunk = tensor;  // k == 1: the slice of the tensor is the node's chunk
  const bool own_chunk = me < p.plan.num_chunks();
  const Range own = own_chunk ? p.plan.chunks[me] : Range{p.plan.slice.count, 0};
  if (k > 1) {
    if (p.seq >= static_cast<uint64_t>(slots_)) {
      // The slot's previous slice: every peer must be done reading our areas
      // (their all-gather, recorded as their consumed event) before we
      // overwrite them.  The counter says the record was enqueued.
      const uint32_t freed = static_cast<uint32_t>(p.seq - slots_ + 1);
      for (int x = 0; x < k; ++x) {
        if (x == me) continue;
        counter_wait(c.consumed[x], freed, wait_check(x, "release a pipeline slot", op.seq));
        cuda_check(cudaStreamWaitEvent(stream, consumed_event(x, slot), 0), "cudaStreamWaitEvent (slot release)");
      }
    }
    arena_->header(slot, me) =
        SlotHeader{op.seq, p.seq, op.numel, static_cast<int32_t>(op.dtype), static_cast<int32_t>(op.op)};
    // Peers read our input for their chunks only; our own chunk is reduced
    // straight from the tensor.
    char* in = input_area(me, slot);
    if (own.offset > 0) {
      cuda_check(cudaMemcpyAsync(in, tensor, own.offset * esize, cudaMemcpyDeviceToDevice, stream), "input copy");
    }
    const int64_t tail = own.offset + own.count;
    if (p.plan.slice.count > tail) {
      cuda_check(cudaMemcpyAsync(in + tail * esize, tensor + tail * esize, (p.plan.slice.count - tail) * esize,
                                 cudaMemcpyDeviceToDevice, stream),
                 "input copy");
    }
    cuda_check(cudaEventRecord(in_ready_event(me, slot), stream), "cudaEventRecord");
    counter_publish(c.in_ready[me], mark);
    for (int x = 0; x < k; ++x) {
      if (x == me) continue;
      counter_wait(c.in_ready[x], mark, wait_check(x, "provide its input", op.seq));
    }
    const SlotHeader& mine = arena_->header(slot, me);
    for (int x = 0; x < k; ++x) {
      const SlotHeader& h = arena_->header(slot, x);
      if (h.op_seq != mine.op_seq || h.slice_seq != mine.slice_seq || h.numel != mine.numel ||
          h.dtype != mine.dtype || h.op != mine.op) {
        throw std::runtime_error(
            "all_reduce mismatch between ranks: for CUDA collective #" + std::to_string(op.seq) + " rank " +
            std::to_string(topo_.rank) + " has " + describe(mine.numel, mine.dtype, mine.op) + " but rank " +
            std::to_string(topo_.local_ranks()[x]) + " has collective #" + std::to_string(h.op_seq) + " with " +
            describe(h.numel, h.dtype, h.op) + ". Every rank must issue the same collectives in the same order.");
      }
    }
    if (!own_chunk) return;  // small slice: fewer chunks than ranks
    const void* inputs[kMaxLocalRanks];
    for (int x = 0; x < k; ++x) {
      if (x != me) {
        cuda_check(cudaStreamWaitEvent(stream, in_ready_event(x, slot), 0), "cudaStreamWaitEvent (peer input)");
      }
      inputs[x] = (x == me ? tensor : input_area(x, slot)) + own.offset * esize;
    }
    chunk = output_area(me, slot) + own.offset * esize;
    reduce_cuda(op.dtype, op.op, chunk, inputs, k, own.count, topo_.num_nodes == 1 ? divisor : 0, stream);
  }

  if (nccl_) {
    // Device to device on the rail; the result is in place when the slot's
    // stream passes the exchange.
    nccl_exchange(p, chunk, stream, divisor);
    if (k > 1) cuda_check(cudaEventRecord(chunk_done_event(me, slot), stream), "cudaEventRecord");
    counter_publish(c.chunk_done[me], mark);
  } else if (rail_) {
    // To the host for the network; rail_done brings the result back.
    const size_t bytes = static_cast<size_t>(own.count * esize);
    char* host = pinned_ + static_cast<int64_t>(slot) * area_;
    returns_[slot] = Return{chunk, bytes, k > 1};
    cuda_check(cudaMemcpyAsync(host, chunk, bytes, cudaMemcpyDeviceToHost, stream), "device-to-host copy");
    cuda_check(cudaEventRecord(d2h_done_[slot], stream), "cudaEventRecord");
    ToRail t;
    t.copied = d2h_done_[slot];
    t.task.slice_seq = p.seq;
    t.task.op_seq = op.seq;
    t.task.numel = op.numel;
    t.task.dtype = op.dtype;
    t.task.op = op.op;
    t.task.chunk = host;
    t.task.shards = p.plan.shards[me];
    t.task.divisor = divisor;
    {
      std::lock_guard<std::mutex> lock(feed_mu_);
      feed_.push_back(std::move(t));
    }
    feed_cv_.notify_one();
  } else {
    if (k > 1) cuda_check(cudaEventRecord(chunk_done_event(me, slot), stream), "cudaEventRecord");
    counter_publish(c.chunk_done[me], mark);
  }
}

// The reduction-server exchange of one chunk over NCCL, the same walk as
// RailStage's (plan_rail): our piece of each remote shard goes to the node
// that serves it; if we serve a shard, we sum it with the peers' pieces in
// node order (divided for AVG) and send the sum back; the other shards' sums
// come in.  All on the NCCL stream, which runs the exchanges one at a time in
// slice order (one communicator, the same order on every rank of the rail).
// Every rank of the rail has the same shard list, so an empty transfer is
// skipped on both of its ends.
void CudaEngine::nccl_exchange(const Pending& p, char* chunk, cudaStream_t stream, int64_t divisor) {
  const CudaAllreduceOp& op = *p.op;
  const int64_t esize = c10::elementSize(op.dtype);
  const int n = topo_.num_nodes;
  const int self = topo_.node;
  const RailPlan plan = plan_rail(p.plan.shards[topo_.local_rank], self, n);
  TORCH_CHECK(n <= kMaxCudaReduceInputs, "fairring: FAIRRING_GPU_TRANSPORT=nccl supports at most ",
              kMaxCudaReduceInputs, " nodes");
  cudaStream_t ns = nccl_stream_->stream();
  auto staging = [&](int j) { return nccl_staging_ + static_cast<int64_t>(j < self ? j : j - 1) * nccl_shard_bytes_; };
  auto at = [&](const Range& r) { return chunk + r.offset * esize; };
  auto bytes = [&](const Range& r) { return static_cast<size_t>(r.count * esize); };
  const bool serving = plan.serves && plan.served.count > 0;
  if (serving && static_cast<int64_t>(bytes(plan.served)) > nccl_shard_bytes_) {
    throw std::logic_error("fairring: shard larger than its NCCL staging buffer (plan bound violated)");
  }
  cuda_check(cudaEventRecord(nccl_ready_, stream), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(ns, nccl_ready_, 0), "cudaStreamWaitEvent (to NCCL)");
  nccl_->group_start();
  for (const RemoteShard& r : plan.remote) {
    if (r.shard.count > 0) nccl_->send(at(r.shard), bytes(r.shard), r.node, ns);
  }
  if (serving) {
    for (int j : plan.contributors) nccl_->recv(staging(j), bytes(plan.served), j, ns);
  }
  nccl_->group_end();
  if (serving) {
    const void* inputs[kMaxCudaReduceInputs];
    for (int j = 0; j < n; ++j) inputs[j] = j == self ? at(plan.served) : staging(j);
    reduce_cuda(op.dtype, op.op, at(plan.served), inputs, n, plan.served.count, divisor, ns);
  }
  nccl_->group_start();
  if (serving) {
    for (int j : plan.contributors) nccl_->send(at(plan.served), bytes(plan.served), j, ns);
  }
  for (const RemoteShard& r : plan.remote) {
    if (r.shard.count > 0) nccl_->recv(at(r.shard), bytes(r.shard), r.node, ns);
  }
  nccl_->group_end();
  cuda_check(cudaEventRecord(nccl_done_, ns), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(stream, nccl_done_, 0), "cudaStreamWaitEvent (from NCCL)");
}

// NCCL cannot put two ranks of a communicator on one GPU; require every rank
// of the group on its own (compared by device UUID, which is unique across
// machines).
void CudaEngine::check_own_gpus(const c10::intrusive_ptr<c10d::Store>& store) {
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, device_.index()), "cudaGetDeviceProperties");
  std::vector<uint8_t> mine(reinterpret_cast<const uint8_t*>(&prop.uuid),
                            reinterpret_cast<const uint8_t*>(&prop.uuid) + sizeof(prop.uuid));
  store->set("gpu_uuid/" + std::to_string(topo_.rank), mine);
  for (int r = 0; r < topo_.size; ++r) {
    if (r == topo_.rank) continue;
    if (store->get("gpu_uuid/" + std::to_string(r)) == mine) {
      throw std::invalid_argument(
          "fairring: FAIRRING_GPU_TRANSPORT=nccl needs every rank on its own GPU, but ranks " +
          std::to_string(std::min(r, topo_.rank)) + " and " + std::to_string(std::max(r, topo_.rank)) +
          " share " + device_.str() + " of rank " + std::to_string(topo_.rank) +
          "'s machine. Use FAIRRING_GPU_TRANSPORT=tcp, or one GPU per rank.");
    }
  }
}

// Posts reduced chunks to the rail once their device-to-host copy is done
// (polled: the proxy thread never waits on the device).
void CudaEngine::feeder_loop() {
  c10::cuda::CUDAGuard guard(device_);
  try {
    for (;;) {
      ToRail next;
      {
        std::unique_lock<std::mutex> lock(feed_mu_);
        feed_cv_.wait(lock, [&] { return !feed_.empty() || feed_stopping_ || failed_.load(); });
        if (failed_.load() || (feed_.empty() && feed_stopping_)) return;
        next = std::move(feed_.front());
        feed_.pop_front();
      }
      const auto start = Clock::now();
      for (int spins = 0;; ++spins) {
        if (cuda_done(cudaEventQuery(next.copied), "device-to-host copy of a reduced chunk")) break;
        if (failed_.load()) return;
        if (Clock::now() - start > config_.timeout) {
          throw std::runtime_error("timed out waiting for the GPU to finish reducing slice " +
                                   std::to_string(next.task.slice_seq));
        }
        if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      rail_->post(std::move(next.task));
    }
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo_.rank, e.what()));
  }
}

// From the rail's thread, in slice order: the chunk's global result is in
// pinned memory; copy it back on the slot's stream and tell the node.
void CudaEngine::rail_done(uint64_t slice_seq) {
  try {
    c10::cuda::CUDAGuard guard(device_);
    const int slot = static_cast<int>(slice_seq % slots_);
    const Return& r = returns_[slot];
    cudaStream_t stream = streams_[slot]->stream();
    cuda_check(cudaMemcpyAsync(r.device_chunk, pinned_ + static_cast<int64_t>(slot) * area_, r.bytes,
                               cudaMemcpyHostToDevice, stream),
               "host-to-device copy");
    if (r.record_chunk_event) {
      cuda_check(cudaEventRecord(chunk_done_event(topo_.local_rank, slot), stream), "cudaEventRecord");
    }
    counter_publish(arena_->control().chunk_done[topo_.local_rank], static_cast<uint32_t>(slice_seq + 1));
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo_.rank, e.what()));
  }
}

void CudaEngine::all_gather(Pending& p) {
  const CudaAllreduceOp& op = *p.op;
  const int k = topo_.ranks_per_node;
  const int me = topo_.local_rank;
  const int slot = static_cast<int>(p.seq % slots_);
  const uint32_t mark = static_cast<uint32_t>(p.seq + 1);
  const int64_t esize = c10::elementSize(op.dtype);
  cudaStream_t stream = streams_[slot]->stream();
  NodeControl& c = arena_->control();
  if (k > 1) {
    char* tensor = static_cast<char*>(op.buffer.data_ptr()) + p.plan.slice.offset * esize;
    for (int x = 0; x < p.plan.num_chunks(); ++x) {
      // Between nodes a peer's chunk comes back from the rails.
      counter_wait(c.chunk_done[x], mark,
                   wait_check(x == me ? -1 : x, "finish reducing its chunk", op.seq, rail_ || nccl_));
      if (x != me) {
        cuda_check(cudaStreamWaitEvent(stream, chunk_done_event(x, slot), 0), "cudaStreamWaitEvent (peer chunk)");
      }
      const Range& r = p.plan.chunks[x];
      if (r.count > 0) {
        cuda_check(cudaMemcpyAsync(tensor + r.offset * esize, output_area(x, slot) + r.offset * esize,
                                   r.count * esize, cudaMemcpyDeviceToDevice, stream),
                   "all-gather copy");
      }
    }
    cuda_check(cudaEventRecord(consumed_event(me, slot), stream), "cudaEventRecord");
    counter_publish(c.consumed[me], mark);
  } else if (rail_ || nccl_) {
    counter_wait(c.chunk_done[me], mark, wait_check(-1, "", op.seq));
  }
  // The op is done when every one of its slices is: the tail stream collects them.
  cuda_check(cudaEventRecord(slice_end_[slot], stream), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(tail_->stream(), slice_end_[slot], 0), "cudaStreamWaitEvent (tail)");
}

void CudaEngine::proxy_loop() {
  std::deque<Pending> pending;
  std::shared_ptr<CudaAllreduceOp> cur;
  int64_t next_index = 0;
  int64_t cur_slices = 0;
  const size_t lag = static_cast<size_t>(slots_ - 1);
  try {
    c10::cuda::CUDAGuard guard(device_);
    for (;;) {
      if (!cur) {
        std::unique_lock<std::mutex> lock(mu_);
        if (queue_.empty() && pending.empty()) {
          cv_.wait(lock, [&] { return !queue_.empty() || stopping_ || failed_; });
        }
        if (failed_) break;
        if (!queue_.empty()) {
          cur = std::move(queue_.front());
          queue_.pop_front();
          next_index = 0;
          cur_slices = num_slices(cur->numel, c10::elementSize(cur->dtype), params_);
        } else if (pending.empty()) {
          return;
        }
      }
      if (cur) {
        Pending p;
        p.op = cur;
        p.index = next_index;
        p.seq = next_slice_seq_++;
        p.plan = plan_slice(cur->numel, c10::elementSize(cur->dtype), next_index, topo_.ranks_per_node,
                            topo_.num_nodes, params_);
        reduce_scatter(p);
        pending.push_back(std::move(p));
        if (++next_index == cur_slices) cur.reset();
        if (pending.size() <= lag) continue;
      }
      Pending& front = pending.front();
      all_gather(front);
      if (front.index + 1 == num_slices(front.op->numel, c10::elementSize(front.op->dtype), params_)) {
        CudaAllreduceOp& op = *front.op;
        if (op.user.defined()) {
          // A non-contiguous caller tensor gets the result after the last slice.
          c10::cuda::CUDAStreamGuard on_tail(tail_->c10());
          at::NoGradGuard no_grad;
          op.user.copy_(op.buffer, /*non_blocking=*/true);
        }
        cuda_check(cudaEventRecord(op.done->get(), tail_->stream()), "cudaEventRecord (op done)");
        complete(front.op, nullptr);
      }
      pending.pop_front();
    }
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo_.rank, e.what()));
  }

  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = error_;
  }
  auto fail_op = [&](const std::shared_ptr<CudaAllreduceOp>& op) {
    if (!op || !op->on_complete) return;
    complete(op, std::make_exception_ptr(
                     std::runtime_error("fairring: all_reduce #" + std::to_string(op->seq) + " failed: " + why)));
  };
  for (auto& p : pending) fail_op(p.op);
  fail_op(cur);
  for (;;) {
    std::shared_ptr<CudaAllreduceOp> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    fail_op(op);
  }
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
