#include "devices/host_engine.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/fault_injection.h"
#include "kernels/copy_cpu.h"
#include "kernels/reduce_cpu.h"

namespace fairring {

namespace {

// Staging memory of one rank: its share of the node's shared slot areas (K
// inputs + 1 output, none for a node of one) and, on a rail between nodes,
// the buffers its reduction server receives the peers' shards into (and,
// with compressed rails, the rail stage's wire buffers:
// rail_stage_bytes_per_slot).
int64_t required_memory(const Config& c, const PlanParams& p, const Topology& t, bool on_rail) {
  const int k = t.ranks_per_node;
  // A node of one rank has slot areas on uneven nodes only (node_arena.h).
  const int64_t shared = k > 1 ? c.slice_size * (k + 1) / k : (t.uneven ? 2 * c.slice_size : 0);
  const int64_t rail = on_rail ? rail_stage_bytes_per_slot(c, p, t.rails, t.num_nodes, t.largest_node) : 0;
  return (shared + rail) * c.parallelism;
}

}  // namespace

int64_t host_staging_bytes(const Config& c, const Topology& t) {
  PlanParams p;
  p.slice_bytes = c.slice_size;
  return required_memory(c, p, t, /*on_rail=*/t.num_nodes > 1);
}

// Host memory: the node's shared slot areas, memcpy and the CPU kernels, all
// done by the time a call returns (NodeSlots' counters order them).
class HostEngine::HostMover : public Mover {
 public:
  explicit HostMover(NodeArena& arena) : arena_(arena) {}
  char* input_area(int slot, int x) override { return arena_.input_area(slot, x); }
  // One output area per slot for the whole node: each chunk at its offset.
  char* output_area(int slot, int) override { return arena_.output_area(slot); }
  void copy(int, char* to, const char* from, int64_t bytes, bool large) override {
    if (large) {
      copy_streaming(to, from, bytes);
    } else {
      std::memcpy(to, from, static_cast<size_t>(bytes));
    }
  }
  void reduce(int, c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int n, int64_t count,
              int64_t divisor) override {
    reduce_cpu(dtype, op, out, inputs, n, count, divisor);
  }

 private:
  NodeArena& arena_;
};

HostEngine::HostEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                       const std::string& job_uid, const Secret& secret)
    : Pipeline(topo, config, "") {
  require_memory(required_memory(config, params(), topo, topo.on_rail()));
  const char* deferred = std::getenv("FAIRRING_TEST_DEFERRED_MOVER");
  const bool test_deferred = deferred && std::string(deferred) == "1";
  // Construction steps (FAIRRING_TEST_FAIL_AT): arena, rail, movers, start.
  construction_step("arena");
  set_arena(std::make_unique<NodeArena>(store, topo, job_uid, num_slots(), config.slice_size, config.timeout,
                                        test_deferred ? DeferredMover::kCounters : 0));
  construction_step("rail");
  if (topo.num_nodes > 1 && topo.on_rail()) {  // a passive rank has no rail (topology.h)
    RailStage::Callbacks cb;
    cb.slice_done = [this](uint64_t seq) { chunk_back(seq); };
    cb.failed = [this](const Error& why) { fail(why); };
    rail_ = connect_rail(store, topo, config, params(), secret, std::move(cb), mesh_);
  }
  construction_step("movers");
  if (test_deferred) {
    deferred_ = std::make_unique<DeferredMover>(arena(), topo.local_rank, topo.ranks_per_node, num_slots(), topo.rank,
                                                config.timeout);
    if (rail_) {
      fenced_ = std::make_unique<FencedRail>(*deferred_, *rail_, topo.rank, config.timeout,
                                             [this](const Error& why) { fail(why); });
    }
    set_movers(*deferred_, fenced_.get());
  } else {
    mover_ = std::make_unique<HostMover>(arena());
    set_movers(*mover_, rail_.get());
  }
  construction_step("start");
  // Its thread may fail the group at once, which reaches rail_ and fenced_.
  if (rail_) rail_->start();
  start();
}

HostEngine::~HostEngine() {
  stop();
  deferred_.reset();  // its streams may still reach a fence
  fenced_.reset();    // which may still post to the rail
  rail_.reset();
  mesh_.reset();
}

bool HostEngine::runs_inline(const PipelineOp& op) const {
  // An op of one slice runs on the caller's thread when the engine is idle
  // (pipeline.h).  Handing it to the loop thread instead costs two thread
  // wake-ups, about 100 us on a 2-core VM: more than the whole op up to a
  // few hundred KiB, and more CPU time too (docs/BENCHMARKS_HISTORY.md, "The inline path
  // up to one slice").  On one node so does an op that fits the slots (up
  // to 4 MiB by default): it runs at memory speed once the peers are in,
  // the same schedule as the loop's (docs/BENCHMARKS_HISTORY.md, "Mid-size ops").
  // Between nodes an op of several slices waits on the network: the loop
  // runs it and the caller stays free.
  if (deferred_) return false;  // like a device: the caller never runs the steps
  return slices_of(op) == 1 || topo().num_nodes == 1;
}

void HostEngine::on_failed(const Error& why) {
  if (deferred_) deferred_->cancel();
  if (fenced_) {
    fenced_->abort(why);  // and the rail behind it
  } else if (rail_) {
    rail_->abort(why);
  }
}

void HostEngine::on_set_timeout(std::chrono::milliseconds timeout) {
  if (rail_) rail_->set_timeout(timeout);
}

void HostEngine::on_leave() {
  if (rail_) rail_->leave();  // nothing is in flight: its fence, if any, is idle too
}

bool HostEngine::let_go(TimePoint until) {
  // The deferred mover's streams, and the rail's thread (behind its fence).
  if (deferred_ && !deferred_->let_go(until)) return false;
  RailExchange* rail = fenced_ ? static_cast<RailExchange*>(fenced_.get()) : rail_.get();
  return !rail || rail->let_go(until);
}

void HostEngine::op_done(PipelineOp&) {
  // The deferred mover's streams hold the op's last steps.
  if (deferred_) deferred_->synchronize();
}

void HostEngine::settle(PipelineOp& base, std::exception_ptr& error) {
  auto& op = static_cast<HostOp&>(base);
  if (error || op.users.empty()) return;
  try {
    op.copy_to_users(false);
  } catch (...) {
    error = std::current_exception();
  }
}

std::function<void()> HostEngine::completion_call(const std::shared_ptr<PipelineOp>& base, std::exception_ptr error) {
  auto& op = static_cast<HostOp&>(*base);
  auto after = std::move(op.after_complete);
  auto here = std::move(op.complete_here);
  op.after_complete = nullptr;
  op.complete_here = nullptr;
  if (!after) return nullptr;
  if (here && completions_idle() && here(error)) return nullptr;
  // Holds the Work, not the op: its tensors go with the pipeline's slices.
  return [after = std::move(after), error] { after(error); };
}

}  // namespace fairring
