#ifdef FAIRRING_WITH_CUDA

#include "rails/cuda_rails.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <stdexcept>

#include "plan/rail_walk.h"
#include "common/cuda_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "kernels/convert_cuda.h"
#include "kernels/reduce_cuda.h"
#include "common/error.h"

namespace fairring {

int64_t staged_rail_bytes(const Config& config, const PlanParams& params, int k, int n, int64_t area) {
  return (exchange_staging_bytes(area, n) + rail_stage_bytes_per_slot(config, params, k, n)) * config.parallelism;
}

NcclRailBuffers nccl_rail_buffers(const Config& config, const PlanParams& params, int k, int n) {
  NcclRailBuffers b;
  b.nodes = n;
  const int64_t shard = max_shard_bytes(params, k, n);
  b.shard = round_up(shard, kDeviceAlignBytes);
  // 256-byte aligned: the prefix's 8 bytes and the elements after it stay aligned.
  b.message = config.wire_dtype == "none" ? 0 : round_up(WireCodec::buffer_bytes(shard), kDeviceAlignBytes);
  return b;
}

// ---- CudaStagedRail ----

CudaStagedRail::CudaStagedRail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                               const PlanParams& params, const Secret& secret, c10::Device device, int64_t area,
                               SlotStream slot_stream, SliceDone done, Failed failed)
    : topo_(topo),
      device_(device),
      timeout_(config.timeout),
      slots_(config.parallelism),
      area_(exchange_staging_bytes(area, topo.num_nodes)),
      slot_stream_(std::move(slot_stream)),
      done_(std::move(done)),
      failed_(std::move(failed)) {
  c10::cuda::CUDAGuard guard(device_);
  void* host = nullptr;
  cuda_check(cudaHostAlloc(&host, static_cast<size_t>(area_ * slots_), cudaHostAllocPortable),
             "cannot allocate pinned host staging memory");
  pinned_ = static_cast<char*>(host);
  returns_.resize(slots_);
  for (int s = 0; s < slots_; ++s) d2h_done_.push_back(new_event());
  RailStage::Callbacks cb;
  cb.slice_done = [this](uint64_t seq) { back(seq); };
  cb.failed = failed_;
  stage_ = connect_rail(store, topo, config, params, secret, std::move(cb), mesh_);
  // Polls each chunk's D2H event: the rail's thread never waits on the device.
  const int index = device_.index();
  const int rank = topo_.rank;
  feeder_ = std::make_unique<RailFeeder>(*stage_, topo_.rank, "the GPU's copy of a reduced chunk to the host", timeout_,
                                         failed_, [index, rank] {
                                           cuda_check(cudaSetDevice(index), "cudaSetDevice");
                                           relax_capture_mode_of_this_thread(rank);
                                         });
}

CudaStagedRail::~CudaStagedRail() {
  feeder_.reset();
  stage_.reset();
  mesh_.reset();
  c10::cuda::CUDAGuard guard(device_);
  for (cudaEvent_t ev : d2h_done_) cuda_ok_or_log(cudaEventDestroy(ev), topo_.rank, "cudaEventDestroy");
  if (pinned_ && !leak_) cuda_ok_or_log(cudaFreeHost(pinned_), topo_.rank, "cudaFreeHost");
}

void CudaStagedRail::post(RailTask task) {
  // The chunk's shards go through pinned memory at their offsets: the ones
  // the walk reads go down now (D2H), the ones it writes go up in back()
  // (our served sum into the result, if the task has one).
  const int slot = task.slot;
  cudaStream_t stream = slot_stream_(slot);
  const int64_t esize = c10::elementSize(task.dtype());
  const RailWalk walk = task.walk(topo_.node, topo_.num_nodes);
  char* host = pinned_ + static_cast<int64_t>(slot) * area_;
  if (walk.pattern == RailPattern::kExchange) return post_exchange(std::move(task), walk, host);
  // Pinned memory mirrors the chunk at the shards' offsets.
  auto copy_of = [&](int j) {
    const Range& r = task.shards[j];
    return Copy{task.shard_at(j), host + r.offset * esize, static_cast<size_t>(r.count * esize)};
  };
  for (int j : walk.shards_read()) {
    const Copy c = copy_of(j);
    cuda_check(cudaMemcpyAsync(const_cast<char*>(c.host), c.device, c.bytes, cudaMemcpyDeviceToHost, stream),
               "device-to-host copy");
  }
  std::vector<Copy> back;
  for (int j : walk.shards_written()) {
    Copy c = copy_of(j);
    if (walk.reduces && j == walk.served && task.result) c.device = task.result;
    back.push_back(c);
  }
  returns_[slot] = std::move(back);  // read by back(), ordered by the feed
  cuda_check(cudaEventRecord(d2h_done_[slot], stream), "cudaEventRecord");
  task.chunk = host;
  task.pieces.clear();
  task.result = nullptr;  // the server reduces into our host shard; back() takes it up
  cudaEvent_t copied = d2h_done_[slot];
  feeder_->push(std::move(task),
                [copied] { return cuda_done(cudaEventQuery(copied), "device-to-host copy of a reduced chunk"); });
}

// An exchange's pieces are scattered over device memory (the tensors, the
// node-mates' input areas): the ones we send go down side by side into the
// slot's pinned memory, the ones we receive land after them, and back()
// takes each up to where the task says it lands.
void CudaStagedRail::post_exchange(RailTask task, const RailWalk& walk, char* host) {
  const int slot = task.slot;
  cudaStream_t stream = slot_stream_(slot);
  const int64_t esize = c10::elementSize(task.dtype());
  int64_t used = 0;
  auto take = [&](int64_t count) {
    char* at = host + used;
    used += count * esize;
    if (used > area_) {
      throw Error(ErrorKind::kBackend, "fairring: an exchange larger than the staged rail's pinned memory per slot (" +
                                           std::to_string(area_) + " bytes; plan bound violated)");
    }
    return at;
  };
  // Empty pieces travel as empty messages: any host address will do.
  std::vector<char*> pieces(task.shards.size(), host);
  std::vector<char*> landings(task.shards.size(), host);
  for (const Transfer& x : walk.sends) {
    if (x.count == 0) continue;
    pieces[x.shard] = take(x.count);
    cuda_check(cudaMemcpyAsync(pieces[x.shard], task.shard_at(x.shard), static_cast<size_t>(x.count * esize),
                               cudaMemcpyDeviceToHost, stream),
               "device-to-host copy");
  }
  std::vector<Copy> back;
  for (const Transfer& x : walk.receives) {
    if (x.count == 0) continue;
    landings[x.shard] = take(x.count);
    back.push_back(Copy{task.landing_at(x.shard), landings[x.shard], static_cast<size_t>(x.count * esize)});
  }
  returns_[slot] = std::move(back);  // read by back(), ordered by the feed
  cuda_check(cudaEventRecord(d2h_done_[slot], stream), "cudaEventRecord");
  task.chunk = host;
  task.pieces = std::move(pieces);
  task.landings = std::move(landings);
  cudaEvent_t copied = d2h_done_[slot];
  feeder_->push(std::move(task),
                [copied] { return cuda_done(cudaEventQuery(copied), "device-to-host copy of an exchange's pieces"); });
}

void CudaStagedRail::abort(const Error& why) {
  leak_on_destroy();
  stage_->abort(why);
  feeder_->stop();
}

// From the stage's thread, in slice order: the chunk's result is in pinned
// memory; copy it back on the slot's stream, then the schedule's turn.
void CudaStagedRail::back(uint64_t slice_seq) {
  try {
    c10::cuda::CUDAGuard guard(device_);
    // The stage's thread is the TCP rail's, device-agnostic: relaxed here.
    static thread_local bool relaxed = false;
    if (!relaxed) relax_capture_mode_of_this_thread(topo_.rank);
    relaxed = true;
    const int slot = static_cast<int>(slice_seq % slots_);
    for (const Copy& c : returns_[slot]) {
      cuda_check(cudaMemcpyAsync(c.device, c.host, c.bytes, cudaMemcpyHostToDevice, slot_stream_(slot)),
                 "host-to-device copy");
    }
    done_(slice_seq);
  } catch (const std::exception& e) {
    failed_(attributed(topo_.rank, e));
  }
}

// ---- CudaNcclRail ----

CudaNcclRail::CudaNcclRail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                           const PlanParams& params, c10::Device device, SlotStream slot_stream, SliceDone done,
                           std::function<void()> interrupted)
    : topo_(topo),
      device_(device),
      timeout_(config.timeout),
      slot_stream_(std::move(slot_stream)),
      done_(std::move(done)),
      codec_(wire_dtype_from_name(config.wire_dtype)) {
  const int n = topo.num_nodes;
  if (n > kMaxCudaReduceInputs) {
    throw Error(ErrorKind::kInvalidArgument, "fairring: FAIRRING_GPU_TRANSPORT=nccl supports at most " +
                                                 std::to_string(kMaxCudaReduceInputs) + " nodes, this group has " +
                                                 std::to_string(n));
  }
  c10::cuda::CUDAGuard guard(device_);
  check_own_gpus(store);
  nccl_ = std::make_unique<NcclRail>(store, "nccl/rail" + std::to_string(topo.local_rank), n, topo.node, config.timeout,
                                     topo.rank, std::move(interrupted));
  stream_ = std::make_unique<DedicatedStream>(device_, true);
  buffers_ = nccl_rail_buffers(config, params, topo.rails, n);
  void* staging = nullptr;
  cuda_check(cudaMalloc(&staging, static_cast<size_t>(buffers_.total())), "cannot allocate the NCCL rail's buffers");
  staging_ = static_cast<char*>(staging);
  ready_ = new_event();
  finished_ = new_event();
  fenced_ = new_event();
}

CudaNcclRail::~CudaNcclRail() {
  c10::cuda::CUDAGuard guard(device_);
  const int rank = topo_.rank;
  if (!leak_) {
    // The owner has seen the slot streams idle, and each waits for its
    // exchange; a walk that failed half-way may still have transfers queued
    // for a peer that is gone: bounded, like every other wait on the device.
    bool idle = false;
    try {
      idle = stream_caught_up(device_, stream_->stream(), std::chrono::steady_clock::now() + timeout_);
      if (!idle) {
        FAIRRING_LOG(rank, "NCCL rail teardown: its stream's work did not finish within %lld ms",
                     static_cast<long long>(timeout_.count()));
      }
    } catch (const std::exception& e) {
      FAIRRING_LOG(rank, "NCCL rail teardown: %s", e.what());
    }
    // Aborting ends its kernels; the buffers they used go to the process's exit.
    if (!idle) leak_on_destroy();
  }
  if (leak_) nccl_->abort_on_destroy();
  nccl_.reset();
  if (ready_) cuda_ok_or_log(cudaEventDestroy(ready_), rank, "cudaEventDestroy");
  if (finished_) cuda_ok_or_log(cudaEventDestroy(finished_), rank, "cudaEventDestroy");
  if (fenced_) cuda_ok_or_log(cudaEventDestroy(fenced_), rank, "cudaEventDestroy");
  if (staging_ && !leak_) cuda_ok_or_log(cudaFree(staging_), rank, "cudaFree (NCCL staging)");
}

void CudaNcclRail::abort(const Error&) {
  leak_on_destroy();
  nccl_->abort();
}

void CudaNcclRail::check() {
  const std::string error = nccl_->async_error();
  if (!error.empty()) throw Error(ErrorKind::kBackend, "the NCCL rail failed: " + error);
}

void CudaNcclRail::order_before(cudaStream_t stream) {
  cuda_check(cudaEventRecord(fenced_, stream_->stream()), "cudaEventRecord (NCCL stream)");
  cuda_check(cudaStreamWaitEvent(stream, fenced_, 0), "cudaStreamWaitEvent (after NCCL)");
}

// The exchange of one chunk on the NCCL stream, after the slot stream's work
// so far and before its next (walk()).
void CudaNcclRail::post(RailTask task) {
  cudaStream_t slot = slot_stream_(task.slot);
  cudaStream_t ns = stream_->stream();
  cuda_check(cudaEventRecord(ready_, slot), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(ns, ready_, 0), "cudaStreamWaitEvent (to NCCL)");
  walk(task, ns);
  cuda_check(cudaEventRecord(finished_, ns), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(slot, finished_, 0), "cudaStreamWaitEvent (from NCCL)");
  // The result is in place once the slot's stream passes the exchange.
  done_(task.slice_seq);
}

// The chunk's rail walk (plan/rail_walk.h), the TCP rail's, as two groups of
// NCCL sends and receives with the reduction between them, on the NCCL
// stream, which runs the exchanges one at a time in slice order (one
// communicator, the same order on every rank of the rail).  Every rank of
// the rail has the same shard list, so an empty transfer (which on TCP
// carries only the op's key) is skipped on both of its ends.  kReduce's
// pieces land in staging, one buffer per peer; kShare's shards in place.
//
// Compressed (codec_.applies): the same walk with messages instead of
// elements, and the values rounded where RailStage rounds them
// (wire_codec.h): our pieces once when sent, the served sum once, which we
// also widen into our own copy; the peers' pieces are widened into staging
// so that the reduction is the uncompressed one.  The message buffers are
// reused by the next exchange only after this one's transfers and kernels,
// in the NCCL stream's order.
void CudaNcclRail::walk(const RailTask& task, cudaStream_t ns) {
  const c10::ScalarType dtype = task.dtype();
  const int64_t esize = c10::elementSize(dtype);
  const int self = topo_.node;
  const RailWalk w = task.walk(self, topo_.num_nodes);
  const bool reduction = w.pattern == RailPattern::kReduce;
  const bool wire = codec_.applies(task);
  const HalfFormat fmt = half_format_of(codec_.dtype());
  // What travels for a transfer: its elements, or its message.
  auto bytes = [&](int64_t count) {
    return static_cast<size_t>(wire ? WireCodec::message_bytes(count) : count * esize);
  };
  const bool serving = w.reduces && w.served_count > 0;
  if (serving && w.served_count * esize > buffers_.shard) {
    throw Error(ErrorKind::kBackend, "fairring: shard larger than its NCCL staging buffer (plan bound violated)");
  }
  // Round one: pieces (or shared shards).
  if (wire) {
    for (const Transfer& x : w.sends) {
      if (x.count > 0) wire_encode_cuda(fmt, dtype, task.shard_at(x.shard), x.count, message_out(x.node), ns);
    }
  }
  nccl_->group_start();
  for (const Transfer& x : w.sends) {
    if (x.count > 0) nccl_->send(wire ? message_out(x.node) : task.shard_at(x.shard), bytes(x.count), x.node, ns);
  }
  for (const Transfer& x : w.receives) {
    if (x.count == 0) continue;
    char* into = !reduction ? task.landing_at(x.shard) : wire ? message_in(x.node) : staging(x.node);
    nccl_->recv(into, bytes(x.count), x.node, ns);
  }
  nccl_->group_end();
  if (!reduction) return;
  // The served reduction, in node order (ours included), in place or into the result.
  const char* result = nullptr;  // what we send back
  if (serving) {
    const int64_t count = w.served_count;
    if (wire) {
      for (const Transfer& x : w.receives) wire_decode_cuda(fmt, dtype, message_in(x.node), count, staging(x.node), ns);
    }
    char* out = task.result ? task.result : task.shard_at(self);
    const void* inputs[kMaxCudaReduceInputs];
    for (int j = 0; j < topo_.num_nodes; ++j) inputs[j] = j == self ? task.shard_at(self) : staging(j);
    reduce_cuda(dtype, task.op(), out, inputs, topo_.num_nodes, count, task.divisor, ns);
    result = out;
    if (wire && w.sends_sum_data()) {
      wire_encode_cuda(fmt, dtype, out, count, message_out(self), ns);
      wire_decode_cuda(fmt, dtype, message_out(self), count, out, ns);
      result = message_out(self);
    }
  }
  // Round two: the sums.
  if (!carries_data(w.sum_sends) && !carries_data(w.sum_receives)) return;
  nccl_->group_start();
  for (const Transfer& x : w.sum_sends) {
    if (x.count > 0) nccl_->send(result, bytes(x.count), x.node, ns);
  }
  for (const Transfer& x : w.sum_receives) {
    if (x.count > 0) nccl_->recv(wire ? message_in(x.node) : task.shard_at(x.shard), bytes(x.count), x.node, ns);
  }
  nccl_->group_end();
  if (wire) {
    for (const Transfer& x : w.sum_receives) {
      if (x.count > 0) wire_decode_cuda(fmt, dtype, message_in(x.node), x.count, task.shard_at(x.shard), ns);
    }
  }
}

// NCCL cannot put two ranks of a communicator on one GPU.  The only
// communicator is the rail's, so only the rail peers must be on distinct
// GPUs (compared by device UUID, unique across machines): ranks of one node
// may share a card (the intra-node steps are CUDA IPC), which is how a node
// is tested on one GPU.
void CudaNcclRail::check_own_gpus(const c10::intrusive_ptr<c10d::Store>& store) {
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, device_.index()), "cudaGetDeviceProperties");
  std::vector<uint8_t> mine(reinterpret_cast<const uint8_t*>(&prop.uuid),
                            reinterpret_cast<const uint8_t*>(&prop.uuid) + sizeof(prop.uuid));
  store->set("gpu_uuid/" + std::to_string(topo_.rank), mine);
  for (int r : topo_.rail()) {
    if (r == topo_.rank) continue;
    if (store->get("gpu_uuid/" + std::to_string(r)) == mine) {
      throw Error(ErrorKind::kInvalidArgument,
                  "fairring: FAIRRING_GPU_TRANSPORT=nccl needs the ranks of a rail (local rank " +
                      std::to_string(topo_.local_rank) + " of every node) on distinct GPUs, but ranks " +
                      std::to_string(std::min(r, topo_.rank)) + " and " + std::to_string(std::max(r, topo_.rank)) +
                      " share " + device_.str() + " of rank " + std::to_string(topo_.rank) +
                      "'s machine. Use FAIRRING_GPU_TRANSPORT=tcp, or give each node's ranks their own GPUs.");
    }
  }
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
