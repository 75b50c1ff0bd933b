#include "allreduce/engine.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

#include "allreduce/wait_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "kernels/copy_cpu.h"
#include "kernels/reduce_cpu.h"

namespace fairring {

namespace {

// Ops up to this size run on the caller's thread when the engine is idle.
// Larger ones would keep the caller from overlapping them with its work.
constexpr int64_t kInlineMaxBytes = 64 << 10;
// How long an inline op spins for a peer before the local thread takes over.
constexpr auto kInlineSpin = std::chrono::microseconds(200);
// Results of ops at least this large are written to the tensor with
// non-temporal stores: it outgrows the caches, so caching it only costs.
constexpr int64_t kStreamingBytes = 4 << 20;

// The error of an op that the group's failure `why` took down.
std::exception_ptr op_failed(const AllreduceOp& op, const std::string& why) {
  return std::make_exception_ptr(
      std::runtime_error("fairring: all_reduce #" + std::to_string(op.seq) + " failed: " + why));
}

// Live engines, for quiesce_all().
std::mutex g_engines_mu;
std::set<Engine*> g_engines;

// Staging memory of one rank: its share of the node's shared slot areas (K
// inputs + 1 output, none for a node of one) and, between nodes, the buffers
// its reduction server receives the peers' shards into.
int64_t required_memory(const Config& c, const PlanParams& p, int k, int n) {
  const int64_t shared = k > 1 ? c.slice_size * (k + 1) / k : 0;
  const int64_t staging = n > 1 ? (n - 1) * max_shard_bytes(p, k, n) : 0;
  return (shared + staging) * c.parallelism;
}

}  // namespace

Engine::Engine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
               const std::string& job_uid, const Secret& secret)
    : topo_(topo), config_(config), creator_pid_(getpid()), completions_(topo.rank) {
  params_.slice_bytes = config_.slice_size;
  slots_ = config_.parallelism;
  const int64_t need = required_memory(config_, params_, topo_.ranks_per_node, topo_.num_nodes);
  if (need > config_.total_memory) {
    throw std::invalid_argument(
        "FAIRRING_TOTAL_MEMORY=" + std::to_string(config_.total_memory) + " bytes is too small for FAIRRING_PARALLELISM=" +
        std::to_string(slots_) + " slices of FAIRRING_SLICE_SIZE=" + std::to_string(config_.slice_size) +
        " bytes with " + std::to_string(topo_.ranks_per_node) + " ranks per node and " +
        std::to_string(topo_.num_nodes) + " nodes: it needs " + std::to_string(need) +
        " bytes. Raise FAIRRING_TOTAL_MEMORY or lower FAIRRING_SLICE_SIZE / FAIRRING_PARALLELISM.");
  }

  arena_ = std::make_unique<NodeArena>(store, topo_, job_uid, slots_, config_.slice_size, config_.timeout);

  if (topo_.num_nodes > 1) {
    std::vector<int> peers;
    for (int r : topo_.rail()) {
      if (r != topo_.rank) peers.push_back(r);
    }
    mesh_ = std::make_unique<TcpMesh>(store, topo_.rank, peers, secret, config_.socket_ifname, config_.timeout);
    mesh_->connect();
    RailStage::Callbacks cb;
    cb.slice_done = [this](uint64_t seq) {
      counter_publish(arena_->control().chunk_done[topo_.local_rank], static_cast<uint32_t>(seq + 1));
    };
    cb.failed = [this](const std::string& why) { fail(why); };
    rail_ = std::make_unique<RailStage>(topo_, *mesh_, reduce_cpu, std::move(cb), config_.timeout, slots_,
                                        max_shard_bytes(params_, topo_.ranks_per_node, topo_.num_nodes));
  }
  local_ = std::thread([this] { local_loop(); });
  std::lock_guard<std::mutex> lock(g_engines_mu);
  g_engines.insert(this);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(g_engines_mu);
    g_engines.erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (local_.joinable()) local_.join();
  rail_.reset();
  mesh_.reset();
}

void Engine::submit(std::shared_ptr<AllreduceOp> op) {
  std::unique_lock<std::mutex> lock(mu_);
  // Numbered here, under the lock, so that ops issued from several threads
  // are queued in the order of their numbers.
  op->seq = submitted_++;
  arena_->control().issued[topo_.local_rank].store(op->seq + 1, std::memory_order_release);
  if (!error_.empty()) {
    const std::string why = error_;
    lock.unlock();
    complete(op, std::make_exception_ptr(std::runtime_error(
                     "fairring: all_reduce #" + std::to_string(op->seq) +
                     " not started: this process group failed earlier: " + why)));
    return;
  }
  // Inline only when every earlier op has completed: then the local thread
  // holds no slice and the pipeline is ours.
  const bool idle = completed_ + 1 == submitted_ && queue_.empty() && !inline_busy_ && !handoff_;
  const int64_t esize = c10::elementSize(op->dtype);
  if (idle && op->numel * esize <= kInlineMaxBytes && num_slices(op->numel, esize, params_) == 1) {
    inline_busy_ = true;
    lock.unlock();
    run_inline(make_pending(op, 0));
    return;
  }
  queue_.push_back(std::move(op));
  lock.unlock();
  work_cv_.notify_all();
}

Engine::Pending Engine::make_pending(const std::shared_ptr<AllreduceOp>& op, int64_t index) {
  Pending p;
  p.op = op;
  p.index = index;
  p.seq = next_slice_seq_++;
  p.plan = plan_slice(op->numel, c10::elementSize(op->dtype), index, topo_.ranks_per_node, topo_.num_nodes, params_);
  return p;
}

void Engine::run_inline(Pending p) {
  const TimePoint until = std::chrono::steady_clock::now() + kInlineSpin;
  std::exception_ptr error;
  bool finished = false;
  try {
    finished = reduce_scatter(p, &until) && all_gather(p, &until);
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo_.rank, e.what()));
    std::lock_guard<std::mutex> lock(mu_);
    error = op_failed(*p.op, error_);
  }
  if (!finished && !error) {
    std::unique_lock<std::mutex> lock(mu_);
    if (error_.empty()) {
      handoff_ = std::move(p);
      inline_busy_ = false;
      lock.unlock();
      work_cv_.notify_all();
      idle_cv_.notify_all();
      return;
    }
    // The group failed meanwhile (another thread's op): the local thread
    // is gone or going, so this op fails here.
    error = op_failed(*p.op, error_);
  }
  complete(p.op, error, /*on_caller=*/true);
  bool queued_behind;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inline_busy_ = false;
    queued_behind = !queue_.empty();
  }
  // Wake the local thread only if it has work now: a wake-up costs a
  // context switch, as much as the whole small op.
  if (queued_behind) work_cv_.notify_all();
  idle_cv_.notify_all();
}

void Engine::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return completed_ == submitted_; });
}

bool Engine::quiesce(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A failed group's local thread has ended and dropped what it held.
    if (!idle_cv_.wait_until(lock, until, [&] {
          return completed_ == submitted_ && !inline_busy_ && !handoff_ && (local_parked_ || failed_);
        })) {
      return false;
    }
  }
  return completions_.wait_idle(until);
}

void Engine::quiesce_all() {
  std::lock_guard<std::mutex> lock(g_engines_mu);
  // Bounded: an op stuck on a stalled peer must not hold the exit for the
  // group's whole timeout.
  const std::chrono::milliseconds limit(10000);
  for (Engine* e : g_engines) {
    // In a fork()ed child the engine's threads do not exist: nothing to wait for.
    if (e->creator_pid_ != getpid()) continue;
    if (!e->quiesce(std::min(limit, e->config_.timeout))) {
      FAIRRING_LOG(e->topo_.rank, "all_reduces still in flight at exit (a peer is stalled?); not waiting for them");
    }
  }
}

void Engine::complete(const std::shared_ptr<AllreduceOp>& op, std::exception_ptr error, bool on_caller) {
  if (!error && arena_->aborts_op(op->seq)) {
    // Our part ended well, but a node peer gave up on this op (we came
    // late, or it failed for another reason): it ends the same way here.
    const std::string why = arena_->abort_message();
    fail(why);
    error = op_failed(*op, why);
  }
  if (!error && !op->users.empty()) {
    try {
      at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
      const at::Tensor flat = op->buffer.reshape({-1});
      int64_t offset = 0;
      for (at::Tensor& u : op->users) {
        u.copy_(flat.narrow(0, offset, u.numel()).view(u.sizes()));
        offset += u.numel();
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  auto done = std::move(op->on_complete);
  auto after = std::move(op->after_complete);
  op->on_complete = nullptr;
  op->after_complete = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++completed_;
  }
  idle_cv_.notify_all();
  if (done) done(error);
  if (!after) return;
  // The caller's own op, with no earlier callback pending: nothing can be
  // chained on its future yet, so completing it here runs no user code and
  // saves waking a completion worker.
  if (on_caller && completions_.idle()) {
    after(error);
  } else {
    completions_.post([after = std::move(after), error] { after(error); });
  }
}

void Engine::fail(const std::string& why) {
  uint64_t first_failed_op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;
    error_ = why;
    failed_ = true;
    first_failed_op = completed_;  // ops complete in issue order
  }
  FAIRRING_DEBUG_LOG(topo_.rank, "failing: %s", why.c_str());
  arena_->abort(topo_.rank, why, first_failed_op);
  if (rail_) rail_->abort(why);
  work_cv_.notify_all();
  idle_cv_.notify_all();
}

std::function<void()> Engine::wait_check(int local_peer, const char* what, const Pending& p, bool via_network) {
  return make_wait_check(topo_, *arena_, config_.timeout, [this] {
    if (failed_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      throw std::runtime_error(error_);
    }
  }, "all_reduce", local_peer, what, p.op->seq, via_network);
}

bool Engine::await(SharedCounter& c, uint32_t target, int local_peer, const char* what, const Pending& p,
                   const TimePoint* until, bool via_network) {
  if (until) return counter_spin(c, target, *until);
  counter_wait(c, target, wait_check(local_peer, what, p, via_network));
  return true;
}

bool Engine::reduce_scatter(Pending& p, const TimePoint* until) {
  const AllreduceOp& op = *p.op;
  const int k = topo_.ranks_per_node;
  const int me = topo_.local_rank;
  const int slot = static_cast<int>(p.seq % slots_);
  const int64_t esize = c10::elementSize(op.dtype);
  const uint32_t mark = static_cast<uint32_t>(p.seq + 1);
  char* tensor = static_cast<char*>(op.buffer.data_ptr()) + p.plan.slice.offset * esize;
  const int64_t divisor = (op.op == RedOp::kAvg) ? topo_.size : 0;
  NodeControl& c = arena_->control();

  char* chunk = tensor;
  char* mirror = nullptr;
  if (k > 1) {
    // Peers read our input for their chunks only; our own chunk we reduce
    // straight from the tensor, so it is not copied.  A replicated slice is
    // reduced by everyone, so all of it is shared.
    const bool own_chunk = me < p.plan.num_chunks();
    const Range own = own_chunk && !p.plan.replicated ? p.plan.chunks[me] : Range{p.plan.slice.count, 0};
    if (p.stage == Stage::kSlotFree) {
      if (p.seq >= static_cast<uint64_t>(slots_)) {
        const uint32_t freed = static_cast<uint32_t>(p.seq - slots_ + 1);
        for (int x = 0; x < k; ++x) {
          if (x != me && !await(c.consumed[x], freed, x, "release a pipeline slot", p, until)) return false;
        }
      }
      arena_->header(slot, me) = SlotHeader{op.seq, p.seq, op.numel, static_cast<int32_t>(op.dtype),
                                            static_cast<int32_t>(op.op)};
      std::memcpy(arena_->input_area(slot, me), tensor, own.offset * esize);
      const int64_t tail = own.offset + own.count;
      std::memcpy(arena_->input_area(slot, me) + tail * esize, tensor + tail * esize,
                  (p.plan.slice.count - tail) * esize);
      counter_publish(c.in_ready[me], mark);
      p.stage = Stage::kInputs;
    }
    for (int x = 0; x < k; ++x) {
      if (x != me && !await(c.in_ready[x], mark, x, "provide its input", p, until)) return false;
    }
    const SlotHeader& mine = arena_->header(slot, me);
    for (int x = 0; x < k; ++x) {
      const SlotHeader& h = arena_->header(slot, x);
      if (h.op_seq != mine.op_seq || h.slice_seq != mine.slice_seq || h.numel != mine.numel ||
          h.dtype != mine.dtype || h.op != mine.op) {
        throw std::runtime_error(
            "all_reduce mismatch between ranks: for collective #" + std::to_string(op.seq) + " rank " +
            std::to_string(topo_.rank) + " has " + describe(mine.numel, mine.dtype, mine.op) + " but rank " +
            std::to_string(topo_.local_ranks()[x]) + " has collective #" + std::to_string(h.op_seq) + " with " +
            describe(h.numel, h.dtype, h.op) + ". Every rank must issue the same collectives in the same order.");
      }
    }
    p.stage = Stage::kGather;
    const void* inputs[kMaxLocalRanks];
    if (p.plan.replicated) {
      // Straight into the tensor: the result is complete, nothing to gather.
      for (int x = 0; x < k; ++x) inputs[x] = x == me ? tensor : arena_->input_area(slot, x);
      reduce_cpu(op.dtype, op.op, tensor, inputs, k, p.plan.slice.count, divisor);
      return true;
    }
    if (!own_chunk) return true;  // small slice: fewer chunks than ranks
    for (int x = 0; x < k; ++x) {
      inputs[x] = (x == me ? tensor : arena_->input_area(slot, x)) + own.offset * esize;
    }
    // Our chunk is reduced in place, in our tensor; the peers' all-gather
    // reads a copy of it in the shared output area, made from the cache
    // once it is final (here, or by the rail stage after the network), so
    // that our own all-gather copies the other chunks only.
    chunk = tensor + own.offset * esize;
    mirror = arena_->output_area(slot) + own.offset * esize;
    reduce_cpu(op.dtype, op.op, chunk, inputs, k, own.count, topo_.num_nodes == 1 ? divisor : 0);
    if (!rail_) std::memcpy(mirror, chunk, own.count * esize);
  }
  // A node of one rank (k == 1) reduces nothing locally: its chunk is the
  // slice of its own tensor, which goes to the rail as it is.
  p.stage = Stage::kGather;

  if (rail_) {
    RailTask t;
    t.slice_seq = p.seq;
    t.op_seq = op.seq;
    t.numel = op.numel;
    t.dtype = op.dtype;
    t.op = op.op;
    t.chunk = chunk;
    t.mirror = mirror;
    t.shards = p.plan.shards[me];
    t.divisor = divisor;
    rail_->post(std::move(t));
  } else {
    counter_publish(c.chunk_done[me], mark);
  }
  return true;
}

bool Engine::all_gather(Pending& p, const TimePoint* until) {
  const AllreduceOp& op = *p.op;
  const int k = topo_.ranks_per_node;
  const int me = topo_.local_rank;
  const uint32_t mark = static_cast<uint32_t>(p.seq + 1);
  NodeControl& c = arena_->control();
  if (k > 1) {
    const int slot = static_cast<int>(p.seq % slots_);
    const int64_t esize = c10::elementSize(op.dtype);
    if (!p.plan.replicated) {
      for (int x = 0; x < p.plan.num_chunks(); ++x) {
        // Between nodes a peer's chunk comes back from the rails.
        if (!await(c.chunk_done[x], mark, x == me ? -1 : x, "finish reducing its chunk", p, until,
                   /*via_network=*/rail_ != nullptr)) {
          return false;
        }
      }
      char* tensor = static_cast<char*>(op.buffer.data_ptr()) + p.plan.slice.offset * esize;
      const char* gathered = arena_->output_area(slot);
      auto copy = [&](int64_t from, int64_t to) {  // elements [from, to) of the slice
        if (to <= from) return;
        if (op.numel * esize >= kStreamingBytes) {
          copy_streaming(tensor + from * esize, gathered + from * esize, (to - from) * esize);
        } else {
          std::memcpy(tensor + from * esize, gathered + from * esize, (to - from) * esize);
        }
      };
      // Our own chunk is in the tensor already.
      const bool own_in_place = me < p.plan.num_chunks();
      const Range skip = own_in_place ? p.plan.chunks[me] : Range{p.plan.slice.count, 0};
      copy(0, skip.offset);
      copy(skip.offset + skip.count, p.plan.slice.count);
    }
    // Published here, in slice order, also for a replicated slice (whose
    // reads ended in reduce_scatter): the counter only moves forward.
    counter_publish(c.consumed[me], mark);
  } else {
    if (!await(c.chunk_done[me], mark, -1, "", p, until)) return false;
  }
  p.stage = Stage::kDone;
  return true;
}

void Engine::local_loop() {
  std::deque<Pending> pending;
  std::shared_ptr<AllreduceOp> cur;
  int64_t next_index = 0;
  int64_t cur_slices = 0;
  const size_t lag = static_cast<size_t>(slots_ - 1);
  try {
    for (;;) {
      if (!cur) {
        std::unique_lock<std::mutex> lock(mu_);
        if (pending.empty()) {
          local_parked_ = true;
          idle_cv_.notify_all();  // quiesce() may be waiting for this
          work_cv_.wait(lock, [&] {
            return failed_ || handoff_ || (!inline_busy_ && (!queue_.empty() || stopping_));
          });
          local_parked_ = false;
        }
        if (failed_) break;
        if (handoff_) {
          // An inline op whose peer was late: it is the oldest, finish it first.
          pending.push_back(std::move(*handoff_));
          handoff_.reset();
          lock.unlock();
          if (pending.back().stage < Stage::kGather) reduce_scatter(pending.back(), nullptr);
          continue;
        }
        if (!queue_.empty() && !inline_busy_) {
          cur = std::move(queue_.front());
          queue_.pop_front();
          next_index = 0;
          cur_slices = num_slices(cur->numel, c10::elementSize(cur->dtype), params_);
        } else if (pending.empty()) {
          return;  // stopping, nothing left
        }
      }
      if (cur) {
        Pending p = make_pending(cur, next_index);
        reduce_scatter(p, nullptr);
        pending.push_back(std::move(p));
        if (++next_index == cur_slices) cur.reset();
        if (pending.size() <= lag) continue;
      }
      Pending& front = pending.front();
      all_gather(front, nullptr);
      if (front.index + 1 == num_slices(front.op->numel, c10::elementSize(front.op->dtype), params_)) {
        complete(front.op, nullptr);
      }
      pending.pop_front();
    }
  } catch (const std::exception& e) {
    fail(attribute_to_rank(topo_.rank, e.what()));
  }

  // Failed: everything in flight or queued fails with the group's error.
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = error_;
  }
  auto fail_op = [&](const std::shared_ptr<AllreduceOp>& op) {
    if (!op || !op->on_complete) return;
    complete(op, op_failed(*op, why));
  };
  for (auto& p : pending) fail_op(p.op);
  fail_op(cur);
  std::optional<Pending> handed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handed.swap(handoff_);
  }
  if (handed) fail_op(handed->op);
  for (;;) {
    std::shared_ptr<AllreduceOp> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty()) return;  // later submits fail inside submit()
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    fail_op(op);
  }
}

}  // namespace fairring
