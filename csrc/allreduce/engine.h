// The all-reduce schedule of one process group: ops are cut into slices
// (allreduce/plan.h) that flow through a pipeline of `parallelism` slots:
//
//   reduce-scatter (node, shared memory) -> rail exchange (network, RailStage)
//   -> all-gather (node, shared memory)
//
// One local thread runs the node steps for every slice in issue order; the
// rail stage runs on its own thread.  A slice's reduce-scatter can start while
// earlier slices, of the same or of earlier ops, are still on the network, so
// back-to-back ops (DDP's buckets) progress together.
//
// A small op issued while the engine is idle runs on the caller's thread
// instead (no thread hand-offs, which dominate its latency).  If its peers
// are not there within a short spin, the local thread takes it over where it
// stopped, so the caller never blocks on a late peer.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "allreduce/completion_pool.h"
#include "allreduce/node_arena.h"
#include "allreduce/op.h"
#include "allreduce/plan.h"
#include "allreduce/rail_stage.h"
#include "common/config.h"
#include "topology/topology.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

class Engine {
 public:
  // Collective: every rank of the group constructs its engine together.
  Engine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
         const std::string& job_uid, const Secret& secret);
  ~Engine();

  // Numbers the op (issue order) and queues it; it completes through
  // op->on_complete.
  void submit(std::shared_ptr<AllreduceOp> op);
  // Blocks until every submitted op has completed (successfully or not).
  void wait_idle();
  // Blocks (up to `limit`) until every op has completed and no engine thread
  // holds a tensor or Work any more: after this, nothing of the caller's is
  // released from the engine's threads.  True if it got there.
  bool quiesce(std::chrono::milliseconds limit);
  // quiesce() on every live engine of the process.  Run at interpreter exit,
  // so that no engine thread drops the last reference to a tensor (which
  // needs the GIL) while the interpreter finalizes.
  static void quiesce_all();

  std::string listen_address() const { return mesh_ ? mesh_->listen_address() : std::string(); }

 private:
  // Where a slice is in its node steps; a step that had to stop (spin budget
  // spent) resumes from here on the local thread.
  enum class Stage { kSlotFree, kInputs, kGather, kDone };
  struct Pending {
    std::shared_ptr<AllreduceOp> op;
    int64_t index = 0;  // slice of the op
    uint64_t seq = 0;   // global slice number
    SlicePlan plan;
    Stage stage = Stage::kSlotFree;
  };
  using TimePoint = std::chrono::steady_clock::time_point;

  Pending make_pending(const std::shared_ptr<AllreduceOp>& op, int64_t index);
  void local_loop();
  // Runs a small op on the caller's thread; hands it to the local thread if
  // a peer is late.
  void run_inline(Pending p);
  // The node steps of a slice.  With `until` null they block; otherwise they
  // spin until then at most and return false, leaving p.stage to resume from.
  bool reduce_scatter(Pending& p, const TimePoint* until);
  bool all_gather(Pending& p, const TimePoint* until);
  bool await(SharedCounter& c, uint32_t target, int local_peer, const char* what, const Pending& p,
             const TimePoint* until, bool via_network = false);
  // `on_caller`: the op ran inline, so its future may complete right here.
  void complete(const std::shared_ptr<AllreduceOp>& op, std::exception_ptr error, bool on_caller = false);
  // Records the first failure, tells the node and the rail, fails what is queued.
  void fail(const std::string& why);
  // Throws if the group failed, a local peer aborted or died, or `deadline` passed.
  std::function<void()> wait_check(int local_peer, const char* what, const Pending& p, bool via_network);

  Topology topo_;
  Config config_;
  const int creator_pid_;  // quiesce_all() skips engines a fork()ed child inherited
  PlanParams params_;
  int slots_ = 1;
  std::unique_ptr<NodeArena> arena_;
  std::unique_ptr<TcpMesh> mesh_;
  std::unique_ptr<RailStage> rail_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // the local thread waits for work here
  std::condition_variable idle_cv_;  // wait_idle() and quiesce() wait here
  std::deque<std::shared_ptr<AllreduceOp>> queue_;
  uint64_t submitted_ = 0;  // also the next op's number
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::string error_;  // first failure; the group is unusable after it
  std::atomic<bool> failed_{false};

  bool inline_busy_ = false;         // an op runs on its caller's thread
  bool local_parked_ = false;        // the local thread waits for work and holds no op
  std::optional<Pending> handoff_;   // an inline op the local thread must finish
  // Owned by whichever thread runs the node steps: the local thread, or the
  // caller while inline_busy_.
  uint64_t next_slice_seq_ = 0;
  std::thread local_;

  // Runs after_complete calls, off the pipeline.
  CompletionPool completions_;
};

}  // namespace fairring
