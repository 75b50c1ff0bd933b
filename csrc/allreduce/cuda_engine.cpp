#ifdef FAIRRING_WITH_CUDA

#include "allreduce/cuda_engine.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>
#include <stdexcept>

#include "allreduce/rail_plan.h"
#include "allreduce/wait_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "kernels/reduce_cuda.h"
#include "transport/socket.h"

namespace fairring {

namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

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
    : Pipeline(topo, config, "CUDA "), device_(device) {
  area_ = round_up(config.slice_size, 256);
  const int k = topo.ranks_per_node;
  const int n = topo.num_nodes;
  require_memory(cuda_required_memory(config, params(), k, n));
  c10::cuda::CUDAGuard guard(device_);
  // Its own corner of the store: the CPU engine's node arena and TCP mesh use
  // the same keys.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("fairring-cuda/", store);
  // Settings every rank must share for its CUDA all-reduces to meet.
  {
    const std::string mine = "FAIRRING_GPU_TRANSPORT=" + config.gpu_transport;
    prefixed->set("transport/" + std::to_string(topo.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < topo.size; ++r) {
      const std::vector<uint8_t> raw = prefixed->get("transport/" + std::to_string(r));
      const std::string theirs(raw.begin(), raw.end());
      if (theirs != mine) {
        throw std::invalid_argument("fairring: ranks of one process group must use the same options, but rank " +
                                    std::to_string(topo.rank) + " has " + mine + " and rank " + std::to_string(r) +
                                    " has " + theirs);
      }
    }
  }
  // Host counters and slot headers only: no host data areas (the data is on
  // the device).  A shared-memory name of its own, too.
  set_arena(std::make_unique<NodeArena>(prefixed, topo, job_uid + "-cuda", num_slots(), 64, config.timeout));
  if (k > 1) {
    const std::string key = "node" + std::to_string(topo.node);
    memory_ = std::make_unique<SharedDeviceMemory>(prefixed, key + "/mem", topo.local_ranks(), topo.local_rank,
                                                   static_cast<size_t>(2 * area_ * num_slots()), config.timeout);
    events_ = std::make_unique<SharedEvents>(prefixed, key + "/events", topo.local_ranks(), topo.local_rank,
                                             kEventsPerSlot * num_slots(), config.timeout);
  }
  for (int s = 0; s < num_slots(); ++s) {
    streams_.push_back(std::make_unique<DedicatedStream>(device_, /*high_priority=*/true));
    slice_end_.push_back(new_event());
  }
  tail_ = std::make_unique<DedicatedStream>(device_, true);
  future_stream_ = std::make_unique<DedicatedStream>(device_, false);

  if (n > 1 && config.gpu_transport == "nccl") {
    check_own_gpus(prefixed);
    nccl_ = std::make_unique<NcclRail>(prefixed, "nccl/rail" + std::to_string(topo.local_rank), n, topo.node,
                                       config.timeout, topo.rank);
    nccl_stream_ = std::make_unique<DedicatedStream>(device_, true);
    nccl_shard_bytes_ = round_up(max_shard_bytes(params(), k, n), 256);
    void* staging = nullptr;
    cuda_check(cudaMalloc(&staging, static_cast<size_t>(nccl_shard_bytes_ * (n - 1))),
               "cannot allocate the NCCL receive buffers");
    nccl_staging_ = static_cast<char*>(staging);
    nccl_ready_ = new_event();
    nccl_done_ = new_event();
  } else if (n > 1) {
    void* host = nullptr;
    cuda_check(cudaHostAlloc(&host, static_cast<size_t>(area_ * num_slots()), cudaHostAllocPortable),
               "cannot allocate pinned host staging memory");
    pinned_ = static_cast<char*>(host);
    returns_.resize(num_slots());
    for (int s = 0; s < num_slots(); ++s) d2h_done_.push_back(new_event());
    RailStage::Callbacks cb;
    cb.slice_done = [this](uint64_t seq) { rail_done(seq); };
    cb.failed = [this](const std::string& why) { fail(why); };
    rail_ = connect_rail(prefixed, topo, config, params(), secret, std::move(cb), mesh_);
    feeder_ = std::thread([this] { feeder_loop(); });
  }
  held_ = std::make_unique<HeldOps>(
      topo.rank, device_,
      [](const PipelineOp& op) -> const CudaEvent* {
        const auto& c = static_cast<const CudaAllreduceOp&>(op);
        return c.enqueued ? c.done.get() : nullptr;
      },
      [this] { return failed(); }, config.timeout);
  start();
}

CudaEngine::~CudaEngine() {
  stop();
  {
    std::lock_guard<std::mutex> lock(feed_mu_);
    feed_stopping_ = true;
  }
  feed_cv_.notify_all();
  if (feeder_.joinable()) feeder_.join();
  held_.reset();  // waits for the held ops' device work (not after a failure)
  rail_.reset();
  mesh_.reset();
  c10::cuda::CUDAGuard guard(device_);
  const int rank = topo().rank;
  if (nccl_ && (failed() || arena().aborted())) nccl_->abort_on_destroy();
  nccl_.reset();
  if (failed() || arena().aborted()) {
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
        if (!process_alive(c.pids[x])) throw std::runtime_error("it exited");
        if (arena().aborted()) throw std::runtime_error("the node aborted: " + arena().abort_message());
        if (Clock::now() > give_up) throw std::runtime_error("timed out");
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

void CudaEngine::on_loop_start() { cuda_check(cudaSetDevice(device_.index()), "cudaSetDevice"); }

// Never spins (the CUDA engine runs nothing inline): `until` is unused.
bool CudaEngine::reduce_scatter(Slice& s, const TimePoint*) {
  auto& op = static_cast<CudaAllreduceOp&>(*s.op);
  const int k = topo().ranks_per_node;
  const int me = topo().local_rank;
  const SliceId id = s.id();
  const int slot = slots().slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  cudaStream_t stream = streams_[slot]->stream();
  char* tensor = static_cast<char*>(op.buffer.data_ptr()) + s.plan.slice.offset * esize;
  const int64_t divisor = (op.op == RedOp::kAvg) ? topo().size : 0;

  // After the caller's work on the tensor (its stream at submit time).
  op.enqueued = true;
  cuda_check(cudaStreamWaitEvent(stream, op.ready, 0), "cudaStreamWaitEvent (caller's stream)");

  char* chunk = tensor;  // k == 1: the slice of the tensor is the node's chunk
  const bool own_chunk = me < s.plan.num_chunks();
  const Range own = own_chunk ? s.plan.chunks[me] : Range{s.plan.slice.count, 0};
  if (k > 1) {
    if (!slots().first_use(s.seq)) {
      // The slot's previous slice: every peer must be done reading our areas
      // (their all-gather, recorded as their consumed event) before we
      // overwrite them.  The protocol says the record was enqueued.
      for (int x = 0; x < k; ++x) {
        if (x == me) continue;
        slots().wait_free(id, x);
        cuda_check(cudaStreamWaitEvent(stream, slot_event(x, slot, kConsumed), 0),
                   "cudaStreamWaitEvent (slot release)");
      }
    }
    slots().claim(id, op.key());
    // Peers read our input for their chunks only; our own chunk is reduced
    // straight from the tensor.
    char* in = input_area(me, slot);
    if (own.offset > 0) {
      cuda_check(cudaMemcpyAsync(in, tensor, own.offset * esize, cudaMemcpyDeviceToDevice, stream), "input copy");
    }
    const int64_t tail = own.offset + own.count;
    if (s.plan.slice.count > tail) {
      cuda_check(cudaMemcpyAsync(in + tail * esize, tensor + tail * esize, (s.plan.slice.count - tail) * esize,
                                 cudaMemcpyDeviceToDevice, stream),
                 "input copy");
    }
    cuda_check(cudaEventRecord(slot_event(me, slot, kInReady), stream), "cudaEventRecord");
    slots().publish_input(id);
    for (int x = 0; x < k; ++x) {
      if (x != me) slots().wait_input(id, x);
    }
    slots().check_match(id);
    if (!own_chunk) return true;  // small slice: fewer chunks than ranks
    const void* inputs[kMaxLocalRanks];
    for (int x = 0; x < k; ++x) {
      if (x != me) {
        cuda_check(cudaStreamWaitEvent(stream, slot_event(x, slot, kInReady), 0), "cudaStreamWaitEvent (peer input)");
      }
      inputs[x] = (x == me ? tensor : input_area(x, slot)) + own.offset * esize;
    }
    chunk = output_area(me, slot) + own.offset * esize;
    reduce_cuda(op.dtype, op.op, chunk, inputs, k, own.count, topo().num_nodes == 1 ? divisor : 0, stream);
  }

  if (nccl_) {
    // Device to device on the rail; the result is in place when the slot's
    // stream passes the exchange.
    nccl_exchange(s, chunk, stream, divisor);
    if (k > 1) cuda_check(cudaEventRecord(slot_event(me, slot, kChunkDone), stream), "cudaEventRecord");
    slots().publish_chunk(s.seq);
  } else if (rail_) {
    // To the host for the network; rail_done brings the result back.
    const size_t bytes = static_cast<size_t>(own.count * esize);
    char* host = pinned_ + static_cast<int64_t>(slot) * area_;
    returns_[slot] = Return{chunk, bytes, k > 1};
    cuda_check(cudaMemcpyAsync(host, chunk, bytes, cudaMemcpyDeviceToHost, stream), "device-to-host copy");
    cuda_check(cudaEventRecord(d2h_done_[slot], stream), "cudaEventRecord");
    ToRail t;
    t.copied = d2h_done_[slot];
    t.task.slice_seq = s.seq;
    t.task.key = op.key();
    t.task.chunk = host;
    t.task.shards = s.plan.shards[me];
    t.task.divisor = divisor;
    {
      std::lock_guard<std::mutex> lock(feed_mu_);
      feed_.push_back(std::move(t));
    }
    feed_cv_.notify_one();
  } else {
    if (k > 1) cuda_check(cudaEventRecord(slot_event(me, slot, kChunkDone), stream), "cudaEventRecord");
    slots().publish_chunk(s.seq);
  }
  return true;
}

// The reduction-server exchange of one chunk over NCCL, the same walk as
// RailStage's (plan_rail): our piece of each remote shard goes to the node
// that serves it; if we serve a shard, we sum it with the peers' pieces in
// node order (divided for AVG) and send the sum back; the other shards' sums
// come in.  All on the NCCL stream, which runs the exchanges one at a time in
// slice order (one communicator, the same order on every rank of the rail).
// Every rank of the rail has the same shard list, so an empty transfer is
// skipped on both of its ends.
void CudaEngine::nccl_exchange(const Slice& s, char* chunk, cudaStream_t stream, int64_t divisor) {
  const PipelineOp& op = *s.op;
  const int64_t esize = c10::elementSize(op.dtype);
  const int n = topo().num_nodes;
  const int self = topo().node;
  const RailPlan plan = plan_rail(s.plan.shards[topo().local_rank], self, n);
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
  store->set("gpu_uuid/" + std::to_string(topo().rank), mine);
  for (int r = 0; r < topo().size; ++r) {
    if (r == topo().rank) continue;
    if (store->get("gpu_uuid/" + std::to_string(r)) == mine) {
      throw std::invalid_argument(
          "fairring: FAIRRING_GPU_TRANSPORT=nccl needs every rank on its own GPU, but ranks " +
          std::to_string(std::min(r, topo().rank)) + " and " + std::to_string(std::max(r, topo().rank)) +
          " share " + device_.str() + " of rank " + std::to_string(topo().rank) +
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
        feed_cv_.wait(lock, [&] { return !feed_.empty() || feed_stopping_ || failed(); });
        if (failed() || (feed_.empty() && feed_stopping_)) return;
        next = std::move(feed_.front());
        feed_.pop_front();
      }
      const auto start = Clock::now();
      for (int spins = 0;; ++spins) {
        if (cuda_done(cudaEventQuery(next.copied), "device-to-host copy of a reduced chunk")) break;
        if (failed()) return;
        if (Clock::now() - start > config().timeout) {
          throw std::runtime_error("timed out waiting for the GPU to finish reducing slice " +
                                   std::to_string(next.task.slice_seq));
        }
        if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      rail_->post(std::move(next.task));
    }
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo().rank, e.what()));
  }
}

// From the rail's thread, in slice order: the chunk's global result is in
// pinned memory; copy it back on the slot's stream and tell the node.
void CudaEngine::rail_done(uint64_t slice_seq) {
  try {
    c10::cuda::CUDAGuard guard(device_);
    const int slot = slots().slot(slice_seq);
    const Return& r = returns_[slot];
    cudaStream_t stream = streams_[slot]->stream();
    cuda_check(cudaMemcpyAsync(r.device_chunk, pinned_ + static_cast<int64_t>(slot) * area_, r.bytes,
                               cudaMemcpyHostToDevice, stream),
               "host-to-device copy");
    if (r.record_chunk_event) {
      cuda_check(cudaEventRecord(slot_event(topo().local_rank, slot, kChunkDone), stream), "cudaEventRecord");
    }
    slots().publish_chunk(slice_seq);
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo().rank, e.what()));
  }
}

bool CudaEngine::all_gather(Slice& s, const TimePoint*) {
  const PipelineOp& op = *s.op;
  const int k = topo().ranks_per_node;
  const int me = topo().local_rank;
  const SliceId id = s.id();
  const int slot = slots().slot(s.seq);
  cudaStream_t stream = streams_[slot]->stream();
  if (k > 1) {
    const int64_t esize = c10::elementSize(op.dtype);
    char* tensor = static_cast<char*>(op.buffer.data_ptr()) + s.plan.slice.offset * esize;
    for (int x = 0; x < s.plan.num_chunks(); ++x) {
      slots().wait_chunk(id, x);
      if (x != me) {
        cuda_check(cudaStreamWaitEvent(stream, slot_event(x, slot, kChunkDone), 0), "cudaStreamWaitEvent (peer chunk)");
      }
      const Range& r = s.plan.chunks[x];
      if (r.count > 0) {
        cuda_check(cudaMemcpyAsync(tensor + r.offset * esize, output_area(x, slot) + r.offset * esize,
                                   r.count * esize, cudaMemcpyDeviceToDevice, stream),
                   "all-gather copy");
      }
    }
    cuda_check(cudaEventRecord(slot_event(me, slot, kConsumed), stream), "cudaEventRecord");
    slots().release(id);
  } else if (rail_ || nccl_) {
    slots().wait_chunk(id, me);
  }
  // The op is done when every one of its slices is: the tail stream collects them.
  cuda_check(cudaEventRecord(slice_end_[slot], stream), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(tail_->stream(), slice_end_[slot], 0), "cudaStreamWaitEvent (tail)");
  return true;
}

void CudaEngine::op_done(PipelineOp& base) {
  auto& op = static_cast<CudaAllreduceOp&>(base);
  if (op.user.defined()) {
    // A non-contiguous caller tensor gets the result after the last slice.
    c10::cuda::CUDAStreamGuard on_tail(tail_->c10());
    at::NoGradGuard no_grad;
    op.user.copy_(op.buffer, /*non_blocking=*/true);
  }
  cuda_check(cudaEventRecord(op.done->get(), tail_->stream()), "cudaEventRecord (op done)");
}

void CudaEngine::settle(PipelineOp& base, std::exception_ptr&) {
  auto& op = static_cast<CudaAllreduceOp&>(base);
  if (op.ready) {
    cudaEventDestroy(op.ready);  // its waits are enqueued (or never will be)
    op.ready = nullptr;
  }
}

std::function<void()> CudaEngine::completion_call(const std::shared_ptr<PipelineOp>& base, std::exception_ptr error) {
  auto& op = static_cast<CudaAllreduceOp&>(*base);
  auto after = std::move(op.after_complete);
  op.after_complete = nullptr;
  const bool on_device = !error && op.enqueued;
  std::shared_ptr<CudaEvent> done = op.done;
  held_->hold(base);  // its tensors, until its device work is over
  if (!after) return nullptr;
  // Captures no engine member: a completion may run after the engine is gone.
  return [after = std::move(after), error, on_device, done = std::move(done), stream = future_stream_,
          device = device_] {
    c10::cuda::CUDAGuard guard(device);
    // The future's own event is recorded on the future stream, which waits
    // for exactly this op (completions start in issue order).
    if (on_device) cuda_check(cudaStreamWaitEvent(stream->stream(), done->get(), 0), "cudaStreamWaitEvent");
    after(error, stream->c10());
  };
}

void CudaEngine::on_failed(const std::string& why) {
  if (rail_) rail_->abort(why);
  feed_cv_.notify_all();
}

void CudaEngine::wait_device_idle() {
  // After a failure the device work may wait on a dead peer's events: the
  // host-side completion (every op failed) is all there is to wait for.
  if (failed()) return;
  c10::cuda::CUDAGuard guard(device_);
  cuda_check(cudaStreamSynchronize(tail_->stream()), "waiting for the CUDA all-reduces");
}

bool CudaEngine::quiesce_device(TimePoint until) { return held_->wait_released(until); }

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
