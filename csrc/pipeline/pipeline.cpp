#include "pipeline/pipeline.h"

#include <c10/util/Exception.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "node/wait_check.h"
#include "common/error.h"
#include "common/log.h"

namespace fairring {

namespace {

// How long an inline op spins for a peer before the loop thread takes over,
// where each rank here has a CPU (Config::wait_spin > 0) ...
constexpr auto kInlineSpin = std::chrono::microseconds(200);
// ... and where the ranks outnumber the CPUs: briefly, so that a late peer
// soon gets the CPU back (the MoE benchmark's 4 ranks on 2 CPUs: steps of
// 68-70 ms instead of 72-73).
constexpr auto kInlineSpinShared = std::chrono::microseconds(5);
// quiesce_all() waits at most this long per engine: an op stuck on a stalled
// peer must not hold the exit for the group's whole timeout.
constexpr std::chrono::milliseconds kExitQuiesceLimit(10000);

// Live engines, for quiesce_all().
std::mutex g_live_mu;
std::set<Pipeline*> g_live;

}  // namespace

Pipeline::Pipeline(const Topology& topo, const Config& config, const char* device)
    : topo_(topo),
      node_sizes_(topo.node_sizes()),
      slice_pieces_(blockwise_slice_pieces(node_sizes_)),
      config_(config),
      device_(device),
      creator_pid_(getpid()),
      timeout_(config.timeout),
      completions_(topo.rank) {
  params_.slice_bytes = config_.slice_size;
}

Pipeline::~Pipeline() { stop(); }

void Pipeline::require_memory(int64_t need) const {
  if (need <= config_.total_memory) return;
  throw Error(ErrorKind::kInvalidArgument,
              "FAIRRING_TOTAL_MEMORY=" + std::to_string(config_.total_memory) + " bytes is too small for the " +
                  device_ + "all-reduce with FAIRRING_PARALLELISM=" + std::to_string(config_.parallelism) +
                  " slices of FAIRRING_SLICE_SIZE=" + std::to_string(config_.slice_size) + " bytes, " +
                  std::to_string(topo_.ranks_per_node) + " ranks per node and " + std::to_string(topo_.num_nodes) +
                  " nodes: it needs " + std::to_string(need) +
                  " bytes. Raise FAIRRING_TOTAL_MEMORY or lower FAIRRING_SLICE_SIZE / FAIRRING_PARALLELISM.");
}

void Pipeline::set_arena(std::unique_ptr<NodeArena> arena) {
  arena_ = std::move(arena);
  slots_ = std::make_unique<NodeSlots>(
      *arena_, topo_, num_slots(),
      [this](int local_peer, const char* what, const SliceId& s, bool via_network) {
        const std::string op_name = std::string(device_) + collective_name(s.collective);
        return make_wait_check(
            topo_, *arena_, timeout(), [this] { failure_.throw_if_failed(); }, op_name.c_str(), local_peer, what,
            s.op_seq, s.op_number, via_network);
      },
      device_, config_.wait_spin);
}

void Pipeline::set_movers(Mover& mover, RailExchange* rail) {
  schedule_ = std::make_unique<SliceSchedule>(topo_, num_slots(), *slots_, mover, rail);
}

void Pipeline::start() {
  if (!schedule_) throw Error(ErrorKind::kBackend, "fairring: Pipeline::start before set_movers");
  loop_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "fairring-loop");  // (top -H, perf, py-spy)
    loop();
  });
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.insert(this);
  registered_ = true;
}

void Pipeline::stop() {
  if (registered_) {
    std::lock_guard<std::mutex> lock(g_live_mu);
    g_live.erase(this);
    registered_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

std::exception_ptr Pipeline::op_failed(const PipelineOp& op, const Error& why) const {
  return std::make_exception_ptr(reworded(why, std::string("fairring: ") + collective_name(op.collective) + " #" +
                                                   std::to_string(op.number) + " failed: " + why.what()));
}

void Pipeline::abort(const Error& why) { fail(why); }

bool Pipeline::drain(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, limit, [&] { return completed_ == submitted_; });
}

void Pipeline::close(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = why;
}

void Pipeline::leave(const std::string& why) {
  uint64_t issued;
  bool idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return;
    left_ = true;
    if (closed_.empty()) closed_ = "this rank left the process group (" + why + ")";
    issued = submitted_;
    idle = completed_ == submitted_;
  }
  arena_->leave(topo_.local_rank, issued, why);
  if (idle && !failure_.failed()) on_leave();
}

void Pipeline::set_timeout(std::chrono::milliseconds timeout) {
  timeout_.store(timeout, std::memory_order_relaxed);
  on_set_timeout(timeout);
}

void Pipeline::submit(std::shared_ptr<PipelineOp> op) {
  if (!op->def) throw Error(ErrorKind::kBackend, "fairring: an op without a collective definition was submitted");
  std::unique_lock<std::mutex> lock(mu_);
  if (op->stage && order_.must_follow(op->footprint) == 0) {
    // Nothing pending touches what the stage reads or writes: it runs now,
    // on the caller's thread, as if the op were one of the caller's own.
    lock.unlock();
    stage(*op, /*on_caller=*/true);
    op->stage = nullptr;
    lock.lock();
  }
  // Numbered here, under the lock, so that ops issued from several threads
  // are queued in the order of their numbers.
  op->seq = submitted_++;
  slots_->announce(op->seq);
  op->follows = order_.enter(op->seq, op->footprint);
  if (op->follows) order_waits_.fetch_add(1, std::memory_order_relaxed);
  if (failure_.failed() || !closed_.empty()) {
    const Error why = failure_.failed()
                          ? reworded(failure_.error(), "this process group failed earlier: " + failure_.why())
                          : Error(ErrorKind::kBackend, closed_);
    lock.unlock();
    complete(op,
             std::make_exception_ptr(reworded(why, std::string("fairring: ") + collective_name(op->collective) + " #" +
                                                       std::to_string(op->number) + " not started: " + why.what())));
    return;
  }
  // Inline only when every earlier op has completed: then the loop thread
  // holds no slice and the pipeline is ours.
  const bool idle = completed_ + 1 == submitted_ && queue_.empty() && !inline_busy_ && !handoff_;
  if (idle && !op->follows && slices_of(*op) <= num_slots() && runs_inline(*op)) {
    inline_busy_ = true;
    lock.unlock();
    run_inline(make_slice(op, 0));
    return;
  }
  queue_.push_back(std::move(op));
  lock.unlock();
  work_cv_.notify_all();
}

int64_t Pipeline::slices_of(const PipelineOp& op) const {
  return num_slices(op.def->cut(), op.numel, c10::elementSize(op.dtype), slice_pieces_, params_);
}

Slice Pipeline::make_slice(const std::shared_ptr<PipelineOp>& op, int64_t index) {
  Slice s;
  s.op = op;
  s.index = index;
  s.seq = next_slice_seq_++;
  s.plan = plan_slice(op->def->cut(), op->numel, c10::elementSize(op->dtype), index, node_sizes_, params_);
  return s;
}

void Pipeline::start_op(PipelineOp& op, bool on_caller) {
  if (op.stage || op.follows) stage(op, on_caller);
  op.stage = nullptr;
}

void Pipeline::run_inline(Slice s) {
  const TimePoint until =
      std::chrono::steady_clock::now() + (config_.wait_spin.count() > 0 ? kInlineSpin : kInlineSpinShared);
  std::exception_ptr error;
  bool finished = false;
  const int64_t slices = slices_of(*s.op);
  try {
    start_op(*s.op, /*on_caller=*/true);
    if (slices == 1) {
      finished = schedule_->front(s, &until) && schedule_->back(s, &until);
    } else if (schedule_->front(s, &until)) {
      // Every node peer has its input of the first slice in: the op runs at
      // memory speed from here, so the rest runs here too, its waits
      // blocking (they spin first).  The same order as the loop's: the op
      // fits the slots (runs_inline), so every front half, then every back.
      std::vector<Slice> rest;
      rest.reserve(static_cast<size_t>(slices - 1));
      for (int64_t i = 1; i < slices; ++i) {
        rest.push_back(make_slice(s.op, i));
        schedule_->front(rest.back(), nullptr);
      }
      schedule_->back(s, nullptr);
      for (Slice& r : rest) schedule_->back(r, nullptr);
      finished = true;
    }
    if (finished) op_done(*s.op);
  } catch (const std::exception& e) {
    fail(attributed(topo_.rank, e));
    error = op_failed(*s.op, failure_.error());
  }
  if (!finished && !error) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failure_.failed()) {
      handoff_ = std::move(s);
      inline_busy_ = false;
      lock.unlock();
      work_cv_.notify_all();
      idle_cv_.notify_all();
      return;
    }
    // The group failed meanwhile (another thread's op): the loop thread is
    // gone or going, so this op fails here.
    error = op_failed(*s.op, failure_.error());
  }
  complete(s.op, error, /*on_caller=*/true);
  bool queued_behind;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inline_busy_ = false;
    queued_behind = !queue_.empty();
  }
  // Wake the loop thread only if it has work now: a wake-up costs a context
  // switch, as much as the whole small op.
  if (queued_behind) work_cv_.notify_all();
  idle_cv_.notify_all();
}

void Pipeline::wait_idle() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return completed_ == submitted_; });
  }
  wait_device_idle();
}

bool Pipeline::wait_conflicts(const Footprint& fp) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t follow = order_.must_follow(fp);
  if (follow == 0) return false;
  order_waits_.fetch_add(1, std::memory_order_relaxed);
  idle_cv_.wait(lock, [&] { return order_.clear_before(follow); });
  return true;
}

bool Pipeline::wait_conflicts_on_device(const Footprint& fp) {
  if (!wait_conflicts(fp)) return false;
  wait_device_idle();
  return true;
}

bool Pipeline::quiesce(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A failed group's loop thread has ended and dropped what it held.
    if (!idle_cv_.wait_until(lock, until, [&] {
          return completed_ == submitted_ && !inline_busy_ && !handoff_ && (loop_parked_ || failure_.failed());
        })) {
      return false;
    }
  }
  return completions_.wait_idle(until) && quiesce_device(until);
}

void Pipeline::quiesce_all() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (Pipeline* p : g_live) {
    // In a fork()ed child the engine's threads do not exist: nothing to wait for.
    if (p->creator_pid_ != getpid()) continue;
    if (!p->quiesce(std::min(kExitQuiesceLimit, p->timeout()))) {
      FAIRRING_LOG(p->topo_.rank, "%sall_reduces still in flight at exit (a peer is stalled?); not waiting for them",
                   p->device_);
    }
  }
}

void Pipeline::complete(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error, bool on_caller) {
  if (!error && arena_->aborts_op(op->seq)) {
    // Our part ended well, but a node peer gave up on this op (we came
    // late, or it failed for another reason): it ends the same way here.
    const Error why = arena_->abort_error();
    fail(why);
    error = op_failed(*op, why);
  }
  if (error && failure_.failed()) error = after_let_go(op, error);
  settle(*op, error);
  auto done = std::move(op->on_complete);
  op->on_complete = nullptr;
  std::function<void()> call = completion_call(op, error);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++completed_;
    order_.leave(op->seq);
  }
  idle_cv_.notify_all();
  if (done) done(error);
  if (!call) return;
  // The caller's own op, with no earlier callback pending: nothing can be
  // chained on its future yet, so completing it here runs no user code and
  // saves waking a completion worker.
  if (on_caller && completions_.idle()) {
    call();
  } else {
    completions_.post(std::move(call));
  }
}

std::exception_ptr Pipeline::after_let_go(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(let_go_mu_);
  if (let_go_ == LetGo::kNotAsked) {
    const auto limit = timeout();
    let_go_ = let_go(std::chrono::steady_clock::now() + limit) ? LetGo::kReleased : LetGo::kStuck;
    if (let_go_ == LetGo::kStuck) {
      FAIRRING_LOG(topo_.rank,
                   "%sa rail or stream thread of this rank did not stop within %lld ms of the group's failure; "
                   "the failed ops' tensors are kept (and may still change) until the group is destroyed",
                   device_, static_cast<long long>(limit.count()));
    }
  }
  if (let_go_ == LetGo::kReleased) return error;
  kept_.push_back(op);
  const Error failed = error_of(error);
  return std::make_exception_ptr(
      reworded(failed, std::string(failed.what()) + " [a rail or stream thread of rank " + std::to_string(topo_.rank) +
                           " had not stopped within the timeout: this op's tensors may still change until the "
                           "process group is destroyed]"));
}

void Pipeline::fail(const Error& why) {
  uint64_t first_failed_op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.record(why)) return;
    first_failed_op = completed_;  // ops complete in issue order
  }
  FAIRRING_DEBUG_LOG(topo_.rank, "%sfailing: %s", device_, why.what());
  arena_->abort(topo_.rank, why, first_failed_op);
  on_failed(why);
  work_cv_.notify_all();
  idle_cv_.notify_all();
}

void Pipeline::loop() {
  std::deque<Slice> in_flight;
  std::shared_ptr<PipelineOp> cur;
  int64_t next_index = 0;
  int64_t cur_slices = 0;
  const size_t lag = static_cast<size_t>(num_slots() - 1);
  try {
    on_loop_start();
    for (;;) {
      if (!cur) {
        std::unique_lock<std::mutex> lock(mu_);
        if (in_flight.empty()) {
          loop_parked_ = true;
          idle_cv_.notify_all();  // quiesce() may be waiting for this
          work_cv_.wait(
              lock, [&] { return failure_.failed() || handoff_ || (!inline_busy_ && (!queue_.empty() || stopping_)); });
          loop_parked_ = false;
        }
        if (failure_.failed()) break;
        if (handoff_) {
          // An inline op whose peer was late: it is the oldest, finish it
          // first; its later slices, if any, are ours to start.
          in_flight.push_back(std::move(*handoff_));
          handoff_.reset();
          lock.unlock();
          const Slice& h = in_flight.back();
          if (h.index + 1 < slices_of(*h.op)) {
            cur = h.op;
            next_index = h.index + 1;
            cur_slices = slices_of(*cur);
          }
          if (!schedule_->front_done(in_flight.back())) schedule_->front(in_flight.back(), nullptr);
          continue;
        }
        // The order rule: an op that must follow one still in flight waits
        // here, while the back halves below complete what is in flight.
        const bool next_ready = !queue_.empty() && !inline_busy_ && order_.clear_before(queue_.front()->follows);
        if (next_ready) {
          cur = std::move(queue_.front());
          queue_.pop_front();
          next_index = 0;
          cur_slices = slices_of(*cur);
          lock.unlock();
          start_op(*cur, /*on_caller=*/false);
        } else if (in_flight.empty()) {
          // Every earlier op is complete once nothing is in flight or inline.
          if (!queue_.empty() && !inline_busy_) {
            throw Error(ErrorKind::kBackend, "fairring: op #" + std::to_string(queue_.front()->seq) +
                                                 " waits for an earlier op, but none is in flight");
          }
          return;  // stopping, nothing left
        }
      }
      if (cur) {
        Slice s = make_slice(cur, next_index);
        schedule_->front(s, nullptr);
        in_flight.push_back(std::move(s));
        if (++next_index == cur_slices) cur.reset();
        if (in_flight.size() <= lag) continue;
      }
      Slice& oldest = in_flight.front();
      schedule_->back(oldest, nullptr);
      if (oldest.index + 1 == slices_of(*oldest.op)) {
        op_done(*oldest.op);
        complete(oldest.op, nullptr);
      }
      in_flight.pop_front();
    }
  } catch (const std::exception& e) {
    fail(attributed(topo_.rank, e));
  }
  drain(in_flight, cur);
}

void Pipeline::drain(std::deque<Slice>& in_flight, std::shared_ptr<PipelineOp>& cur) {
  const Error why = failure_.error();
  auto fail_op = [&](const std::shared_ptr<PipelineOp>& op) {
    if (!op || !op->on_complete) return;  // several slices of one op, or completed
    complete(op, op_failed(*op, why));
  };
  for (auto& s : in_flight) fail_op(s.op);
  fail_op(cur);
  std::optional<Slice> handed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handed.swap(handoff_);
  }
  if (handed) fail_op(handed->op);
  for (;;) {
    std::shared_ptr<PipelineOp> op;
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
