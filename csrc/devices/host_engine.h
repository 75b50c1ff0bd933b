// The collectives of CPU tensors: the pipeline core (pipeline/pipeline.h) and
// its slice schedule with a host Mover (memcpy, the CPU kernels, the node's
// shared memory) and the TCP rails (RailStage).  Ops of one slice run inline
// on the caller's thread (the pipeline's inline path), which keeps them free
// of thread wake-ups.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>
#include <vector>

#include "devices/host_op.h"
#include "devices/deferred_mover.h"
#include "rails/rail_stage.h"
#include "pipeline/pipeline.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

// The staging memory a rank of this topology needs with this config, as if
// it were on a rail (a passive rank needs less): the same on every rank, so
// that a choice made from it is too.
int64_t host_staging_bytes(const Config& c, const Topology& t);

class HostEngine : public Pipeline {
 public:
  // Collective: every rank of the group constructs its engine together.
  HostEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
             const std::string& job_uid, const Secret& secret);
  ~HostEngine() override;

  std::string listen_address() const { return mesh_ ? mesh_->listen_address() : std::string(); }

 private:
  class HostMover;

  bool runs_inline(const PipelineOp& op) const override;
  void settle(PipelineOp& op, std::exception_ptr& error) override;
  std::function<void()> completion_call(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error) override;
  void on_failed(const Error& why) override;
  void on_leave() override;
  void on_set_timeout(std::chrono::milliseconds timeout) override;
  bool let_go(TimePoint until) override;

  void op_done(PipelineOp& op) override;

  std::unique_ptr<TcpMesh> mesh_;
  std::unique_ptr<RailStage> rail_;
  // Declared after the rail: destroyed (its streams stopped) before it.
  std::unique_ptr<HostMover> mover_;
  // FAIRRING_TEST_DEFERRED_MOVER=1: the device-like mover, and its fence
  // before the rail (deferred_mover.h).
  std::unique_ptr<DeferredMover> deferred_;
  std::unique_ptr<FencedRail> fenced_;
};

}  // namespace fairring
