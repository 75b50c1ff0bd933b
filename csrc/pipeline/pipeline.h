// The pipeline core shared by every device's engine.  It owns, once:
//
//   - the op queue and op/slice numbering (submit; issue order is match order),
//   - the loop thread that keeps `parallelism` slices in flight: the
//     reduce-scatter of slice i+lag, then the all-gather of the oldest,
//   - the order rule (op_order.h): an op whose memory overlaps a pending
//     op's, one of them writing it, starts after that op has completed,
//   - the inline path: an op issued while the pipeline is idle runs on the
//     caller's thread if the device says so (runs_inline); if a peer is late
//     for its first slice the loop thread takes it over where it stopped,
//   - failure: first error wins (GroupFailure), the node and the rails are
//     told, and what is in flight or queued fails with the group's error,
//   - completion: on_complete in issue order, then future completion on a
//     CompletionPool (callbacks may block on another collective),
//   - the exit quiesce of every live engine (quiesce_all).
//
// The steps of each slice are the SliceSchedule's (slice_schedule.h), also
// written once.  A device's engine derives from the core and supplies only a
// Mover (how its memory moves), a RailExchange (how its chunks cross the
// rails) and hooks around an op's completion.  Like TensorPipe's channel
// boilerplate: the base numbers and fails; the channel moves bytes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "node/node_arena.h"
#include "plan/plan.h"
#include "common/config.h"
#include "pipeline/completion_pool.h"
#include "pipeline/group_failure.h"
#include "node/node_slots.h"
#include "pipeline/pipeline_op.h"
#include "pipeline/slice.h"
#include "pipeline/slice_schedule.h"
#include "topology/topology.h"

namespace fairring {

class Pipeline {
 public:
  virtual ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Numbers the op (issue order) and queues it, or runs it inline.
  void submit(std::shared_ptr<PipelineOp> op);
  // Blocks until every submitted op has completed (and, on a device, until
  // its device work is over unless the group failed).
  void wait_idle();
  // Blocks until no pending op's memory conflicts with `fp` (the order rule,
  // for work that runs outside the pipeline: point-to-point ops).  True if
  // it waited.  A failed group's ops complete too, so this ends.
  bool wait_conflicts(const Footprint& fp);
  // The same, and on a device then also until the device work enqueued so
  // far is over (the conflicting ops' included), for work that reads or
  // writes the memory outside the device's streams.  Unlike wait_idle it
  // does not wait for later ops to be issued to the device.
  bool wait_conflicts_on_device(const Footprint& fp);
  // Blocks (up to `limit`) until every op has completed and no engine thread
  // holds a tensor or Work any more: after this, nothing of the caller's is
  // released from the engine's threads.  True if it got there.
  bool quiesce(std::chrono::milliseconds limit);
  // quiesce() on every live engine of the process, bounded.  Run at
  // interpreter exit, so that no engine thread drops the last reference to a
  // tensor (which needs the GIL) while the interpreter finalizes.
  static void quiesce_all();

  // Fails every pending and later op with `why` at once, wakes every wait
  // and tells the node and the rails (their ops with us fail too).
  void abort(const Error& why);
  // Waits (up to `limit`) until every submitted op has completed; true if so.
  bool drain(std::chrono::milliseconds limit);
  // Later ops fail at once with `why` (the group was shut down); nothing is
  // told to the peers, what is in flight goes on.
  void close(const std::string& why);
  // This rank leaves the group (shut down, destroyed or dropped) while its
  // process may live on, saying `why`: its node-mates' waits for an op it
  // never issued fail at once, naming it; when nothing is in flight the
  // device's rails end their streams too (on_leave), so that peers on other
  // nodes fail their next op at once.  Later ops here fail (as after close).
  void leave(const std::string& why);
  // The group's timeout from now on (setTimeout): the waits started after
  // it, here and on the device's rails, give up after `timeout`.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_.load(std::memory_order_relaxed); }

  int rank() const { return topo_.rank; }
  bool failed() const { return failure_.failed(); }
  // The group's first error; call only once failed().
  Error failure() const { return failure_.error(); }
  // Ops that waited for an earlier op under the order rule (op_order.h).
  uint64_t order_waits() const { return order_waits_.load(std::memory_order_relaxed); }

 protected:
  using TimePoint = std::chrono::steady_clock::time_point;

  // `device`: "" or "CUDA ", for messages.
  Pipeline(const Topology& topo, const Config& config, const char* device);
  // Throws the error users see when FAIRRING_TOTAL_MEMORY cannot hold the
  // engine's staging memory (`need` bytes per rank).
  void require_memory(int64_t need) const;
  // The node's shared control block; before start().  Builds slots().
  void set_arena(std::unique_ptr<NodeArena> arena);
  // How the device moves memory and (null on one node) exchanges on the
  // rails; after set_arena, before start().  Both outlive the loop thread.
  void set_movers(Mover& mover, RailExchange* rail);
  // The rail's callback: the slice's chunk is final (in slice order).
  void chunk_back(uint64_t slice_seq) { schedule_->publish_chunk(slice_seq); }
  // Last in the derived constructor: starts the loop thread and registers
  // the engine for quiesce_all().
  void start();
  // First in the derived destructor (the loop thread calls the hooks):
  // unregisters, lets queued ops finish and joins the loop thread.
  void stop();
  // Records the first failure, tells the node and the rails (on_failed),
  // wakes every wait.
  void fail(const Error& why);
  const Topology& topo() const { return topo_; }
  const Config& config() const { return config_; }
  const PlanParams& params() const { return params_; }
  int num_slots() const { return config_.parallelism; }
  int64_t slices_of(const PipelineOp& op) const;
  NodeArena& arena() { return *arena_; }
  NodeSlots& slots() { return *slots_; }

  // ---- Hooks ----
  // Runs first on the loop thread (a device makes itself current).
  virtual void on_loop_start() {}
  // Whether `op`, issued while the pipeline is idle, runs on the caller's
  // thread (only an op whose slices fit the slots at once is asked).  Its
  // first slice's steps then get a spin deadline; once the peers are there
  // the rest blocks.
  virtual bool runs_inline(const PipelineOp& op) const {
    (void)op;
    return false;
  }
  // Runs the op's stage (PipelineOp::stage), if any, before its first step:
  // on the caller's thread at submit (`on_caller`), or on the thread that
  // starts an op that had to follow an earlier one (then also without a
  // stage, so that a device orders the op's work after that op's).
  virtual void stage(PipelineOp& op, bool on_caller) {
    (void)on_caller;
    if (op.stage) op.stage();
  }
  // After the last slice's back half of a successful op (loop thread).
  virtual void op_done(PipelineOp& op) { (void)op; }
  // Just before on_complete, also for a failed op: may turn success into an
  // error (e.g. copying the result back to the caller's tensors failed).
  virtual void settle(PipelineOp& op, std::exception_ptr& error) {
    (void)op;
    (void)error;
  }
  // What completes the op's future, posted to the completion pool (null:
  // nothing to run).  Called once per op, in issue order.
  virtual std::function<void()> completion_call(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error) = 0;
  // No completion call is queued or running: one completed in place now
  // overtakes none (completion_call may then do its work itself).
  bool completions_idle() const { return completions_.idle(); }
  // The group failed: stop the device's own threads and rails.
  virtual void on_failed(const Error& why) { (void)why; }
  // set_timeout: the device's rails take the new timeout too.
  virtual void on_set_timeout(std::chrono::milliseconds timeout) { (void)timeout; }
  // The rank left the group with nothing in flight: the rails may end their
  // streams now (peers on other nodes see them end) rather than at teardown.
  virtual void on_leave() {}
  // After on_failed: blocks until no thread of the device's own (rails,
  // streams) reads or writes host memory of an op any more, or `until`
  // passes; true if so.  Device work already enqueued is the engine's to
  // hold (its tensors stay allocated until it is over).
  virtual bool let_go(TimePoint until) = 0;
  // After wait_idle's host part: the device work of every op is over.
  virtual void wait_device_idle() {}
  // After quiesce's host part: the device holds nothing of the caller's.
  virtual bool quiesce_device(TimePoint until) {
    (void)until;
    return true;
  }

 private:
  Slice make_slice(const std::shared_ptr<PipelineOp>& op, int64_t index);
  void loop();
  // Fails, with the group's error, every op in flight, handed over or queued.
  void drain(std::deque<Slice>& in_flight, std::shared_ptr<PipelineOp>& cur);
  void run_inline(Slice s);
  // What an op needs before its first slice (stage, order) on the thread starting it.
  void start_op(PipelineOp& op, bool on_caller);
  // `on_caller`: the op ran inline, so its future may complete right here.
  void complete(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error, bool on_caller = false);
  std::exception_ptr op_failed(const PipelineOp& op, const Error& why) const;
  // A failed op's tensors go back to its caller only once the engine's own
  // threads have let go of them (let_go), at most the group's timeout after
  // the failure; if they have not by then, the op is kept here, with its
  // tensors, until the engine is destroyed (its threads joined), and its
  // error says so.  Returns the error to complete the op with.
  std::exception_ptr after_let_go(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error);

  Topology topo_;
  const std::vector<int> node_sizes_;  // topo_'s, for the plans
  const int slice_pieces_;             // blockwise_slice_pieces(node_sizes_)
  Config config_;
  PlanParams params_;
  const char* device_;
  const int creator_pid_;  // quiesce_all() skips engines a fork()ed child inherited
  std::unique_ptr<NodeArena> arena_;
  std::unique_ptr<NodeSlots> slots_;
  std::unique_ptr<SliceSchedule> schedule_;
  GroupFailure failure_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // the loop thread waits for work here
  std::condition_variable idle_cv_;  // wait_idle() and quiesce() wait here
  std::deque<std::shared_ptr<PipelineOp>> queue_;
  OrderBook order_;  // the pending ops' footprints
  std::atomic<uint64_t> order_waits_{0};
  uint64_t submitted_ = 0;  // also the next op's number
  uint64_t completed_ = 0;
  bool left_ = false;                               // leave() ran
  std::atomic<std::chrono::milliseconds> timeout_;  // Config::timeout, then set_timeout's
  bool stopping_ = false;
  std::string closed_;  // close()'s reason; later ops fail with it
  bool registered_ = false;

  bool inline_busy_ = false;      // an op runs on its caller's thread
  bool loop_parked_ = false;      // the loop thread waits for work and holds no op
  std::optional<Slice> handoff_;  // an inline op the loop thread must finish
  // Owned by whichever thread runs the node steps: the loop thread, or the
  // caller while inline_busy_.
  uint64_t next_slice_seq_ = 0;
  std::thread loop_;

  std::mutex let_go_mu_;  // after_let_go()
  enum class LetGo { kNotAsked, kReleased, kStuck } let_go_ = LetGo::kNotAsked;
  std::vector<std::shared_ptr<PipelineOp>> kept_;  // failed ops a thread may still touch

  // Runs completion_call()s, off the pipeline.
  CompletionPool completions_;
};

}  // namespace fairring
