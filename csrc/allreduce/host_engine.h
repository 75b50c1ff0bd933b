// The all-reduce of CPU tensors: the pipeline core (pipeline/pipeline.h) with
// host memory.  Per slice:
//
//   reduce-scatter (node, shared memory) -> rail exchange (network, RailStage)
//   -> all-gather (node, shared memory)
//
// Each rank copies its input into its slot area of the node's shared memory,
// reduces its chunk of every rank's input with the CPU kernels, and (between
// nodes) hands it to the rail; the all-gather copies the other ranks' final
// chunks from the slot's shared output area.  Small ops run inline on the
// caller's thread (the pipeline's inline path), which keeps them at a few
// microseconds.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>
#include <vector>

#include "allreduce/op.h"
#include "allreduce/rail_stage.h"
#include "pipeline/pipeline.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

class HostEngine : public Pipeline {
 public:
  // Collective: every rank of the group constructs its engine together.
  HostEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
             const std::string& job_uid, const Secret& secret);
  ~HostEngine() override;

  std::string listen_address() const { return mesh_ ? mesh_->listen_address() : std::string(); }

 private:
  bool runs_inline(const PipelineOp& op) const override;
  bool reduce_scatter(Slice& s, const TimePoint* until) override;
  bool all_gather(Slice& s, const TimePoint* until) override;
  void settle(PipelineOp& op, std::exception_ptr& error) override;
  std::function<void()> completion_call(const std::shared_ptr<PipelineOp>& op, std::exception_ptr error) override;
  void on_failed(const std::string& why) override;

  // From the rail's thread, in slice order: the chunk is final.
  void chunk_back(uint64_t slice_seq);

  std::unique_ptr<TcpMesh> mesh_;
  std::unique_ptr<RailStage> rail_;
  // Per slot, between nodes: where our chunk is copied for the local peers'
  // all-gather once it is back from the rails (a node step, not the rail's).
  struct Mirror {
    const char* from = nullptr;
    char* to = nullptr;
    size_t bytes = 0;
  };
  std::vector<Mirror> mirrors_;
};

}  // namespace fairring
