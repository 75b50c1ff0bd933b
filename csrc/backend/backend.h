// FairringBackend: the c10d::Backend that torch.distributed talks to.  It runs
// all-reduce, reduce-scatter, all-gather, broadcast, reduce, gather,
// scatter, all-to-all and barrier itself (pipeline/: CPU tensors on
// devices/host_engine.h, CUDA tensors on devices/cuda_engine.h), send and
// receive (p2p/), and hands every other
// collective to a gloo backend it owns, after the ops issued before it that
// touch its memory have finished.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/abort_hooks.h"
#include "backend/ephemeral_timeouts.h"
#include "backend/flight_recorder.h"
#include "backend/recent_ops.h"
#include "backend/work.h"
#include "common/config.h"
#include "common/error.h"
#include "common/reduce_op.h"
#include "pipeline/pipeline_op.h"
#include "topology/topology.h"
#include "transport/tcp_mesh.h"

namespace fairring {

class HostEngine;
class Pipeline;
struct PipelineOp;
struct HostOp;
class CudaEngine;
class InitStore;
class P2pEngine;

class FairringBackend : public c10d::Backend {
 public:
  // Collective over the group: every rank constructs its backend together.
  FairringBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const Config& config,
                  const std::string& node_key, c10::intrusive_ptr<c10d::Backend> fallback);
  ~FairringBackend() override;

  const std::string getBackendName() const override { return "fairring"; }

  // Every pending and later op fails at once ("this process group was
  // aborted"), every wait wakes, the group's peers are told; nothing waits
  // on a peer.  What is left goes when the group is destroyed.
  void abort() override;
  // Lets what is in flight finish (within the group's timeout; abort() if
  // it does not), then later ops fail ("this process group was shut down").
  // destroy_process_group() calls it.
  void shutdown() override;
  // The timeout of the waits started from now on (torch's set_timeout).
  void setTimeout(std::chrono::milliseconds timeout) override;
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // `timeout` more for the ops issued from now on, until the first of them
  // ends (torch >= 2.14; EphemeralTimeouts).  Applied to the waits those ops
  // start, as setTimeout's is.
  void addEphemeralTimeout(const std::chrono::milliseconds& timeout) override;
#endif
  // How the group failed, from its first error: SUCCESS (it has not),
  // TIMEOUT, REMOTE_ERROR (another rank failed, exited or left) or
  // COMM_ERROR (this rank's own failure, an abort() included).
  c10d::ErrorType getError() override;
  // The group's first error (CPU engine, then CUDA), if it failed.
  std::optional<Error> first_error() const;
  // Fails every pending and later op with `why`, as abort() does, without
  // running the abort hooks: the group is being replaced (reconfigure).
  void retire(const std::string& why);
  // Run once, before abort() or at the group's first failed op.
  AbortHooks& abort_hooks() { return *abort_hooks_; }
#ifdef C10D_BACKEND_HAS_HOOKS
  void registerAbortHook(int64_t hook_id, c10d::AbortHook hook) override {
    abort_hooks_->add(hook_id, std::move(hook));
  }
  void unregisterAbortHook(int64_t hook_id) override { abort_hooks_->remove(hook_id); }
#endif

  // Groups made from this one (shrink, split): the same options, a store of
  // their own, the hierarchy of their own ranks.  Each child is a new group
  // (its own numbering, failure and memory), built by `ChildFactory`, which
  // fairring_py sets at creation (it also builds the child's gloo fallback).
  using ChildFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)>;
  void set_child_factory(ChildFactory factory) { child_factory_ = std::move(factory); }
  bool supportsShrinking() const override { return true; }
  bool supportsSplitting() const override { return true; }
  // The survivors' group, without `ranks_to_exclude`; only the survivors
  // call it, all with the same list.  SHRINK_ABORT (1) aborts this group first.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
                                           const c10::intrusive_ptr<Options>& opts_override = nullptr) override;
  // The group of `ranks` (this group's ranks) on `store`, or null when this
  // rank is not among them.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;

  // CPU tensors: one all-reduce of the flattened tensors.  Others: gloo.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;

  // Native for dense CPU tensors (reduce-scatter and all-gather: every form
  // whose blocks have equal sizes; broadcast: one tensor); otherwise gloo.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  // Reduce, gather, scatter: native for dense CPU tensors (gather and
  // scatter: one per rank of the input's size on the root).
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  // All-to-all of CPU and CUDA tensors, blockwise through the pipeline:
  // without splits, equal blocks; with splits, and the list form, through
  // all_to_all_uneven.  Other tensors: gloo.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  // Send, recv, recv from any source: native (p2p/p2p_engine.h) for one
  // dense CPU tensor; otherwise gloo.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  // Reached through group.monitored_barrier(); torch's dist.monitored_barrier()
  // itself accepts gloo groups only.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // Collectives issued on this group, every kind counted: the same on every
  // rank, which is what TORCH_DISTRIBUTED_DEBUG=DETAIL checks.
  void setSequenceNumberForGroup() override {}  // starts at 0 on every rank
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  const Topology& topology() const { return topo_; }
  // Each rank's node key (FAIRRING_NODE_ID or the host), as creation read them.
  const std::vector<std::string>& node_keys() const { return node_keys_; }
  const RecentOps& recent_ops() const { return *recent_; }
  // The group's ranks in the default group, for torch's flight recorder.
  void set_global_ranks(std::vector<uint64_t> ranks) { fr_->set_global_ranks(std::move(ranks)); }
  std::vector<uint64_t> global_ranks() const { return fr_->global_ranks(); }
  // Collectives (delegated ones included) and sends and receives issued so far.
  uint64_t collectives_issued() const { return seq_.load(); }
  uint64_t p2p_issued() const { return p2p_seq_.load(); }
  // How many collectives recent_ops() keeps: enough to see the pattern
  // that led to a failure (a bucket cycle of DDP), small enough to print.
  static constexpr size_t kRecentOps = 64;
  std::string listen_address() const;
  // Ops that waited for an earlier op of the group under the order rule
  // (pipeline/op_order.h), CPU and CUDA engines together, and calls that
  // waited for a delegated collective.
  uint64_t order_waits() const;
  // A blockwise collective's slice fits this group's pieces; else a clear error.
  void check_blockwise_fits(const char* kind, c10::ScalarType dtype) const;

 private:
  // Lets the ops issued so far finish before a delegated op runs, so that
  // the group's ops take effect in issue order.
  c10d::Backend& delegate(const char* kind);
  // A delegated collective: runs `call` on gloo after the ops issued before
  // it (delegate) and after the delegated ones it conflicts with, and
  // remembers it, so that a later op that conflicts with it waits for it
  // (gloo runs its queued ops on several threads, in no order).  `fp`: every
  // tensor of the call, as written.
  // `p2p`: a send or receive (a barrier does not wait for it).
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> run_delegated(const char* kind, Footprint fp, Call call, bool p2p = false) {
    order_after_delegated(fp);
    auto work = call(delegate(kind));
    remember_delegated(work, std::move(fp), p2p);
    return work;
  }
  void remember_delegated(const c10::intrusive_ptr<c10d::Work>& work, Footprint fp, bool p2p = false);
  // Waits for the pending delegated collectives whose memory `fp` overlaps,
  // and (`with_p2p`) for the pending sends and receives it conflicts with.
  void order_after_delegated(const Footprint& fp, bool with_p2p = true);
  // Numbers a native op in the group (PipelineOp::number), records it in
  // recent_ (and torch's flight recorder) and wraps its completion (`done`) to record how it ended.
  // `kind` and `suffix` (" (CUDA)") are literals: the completion logs them.
  // The record's bytes: the op's big tensor (what this rank sends, for an
  // all-to-all with splits).  `op.def` is set.
  std::function<void(std::exception_ptr)> track(const char* kind, PipelineOp& op,
                                                std::function<void(std::exception_ptr)> done, const char* suffix = "");
  // An op's entry in torch's flight recorder under this group's name:
  // "fairring:<name> <detail>", reading `inputs`, writing `outputs`.
  RecentOps::InTorch in_torch_record(const char* name, std::string detail, std::vector<at::Tensor> inputs,
                                     std::vector<at::Tensor> outputs) const;
  // Throws if called in a fork()ed child of the process that built the group.
  void check_same_process(const char* what) const;
  // The next collective's / send's or receive's number (seq_, p2p_seq_).
  uint64_t number_collective();
  uint64_t number_p2p();
  void follow_once();
  // The collective part of construction (topology, secret, engine).
  void build(const c10::intrusive_ptr<InitStore>& store, const std::string& node_key);
  // FAIRRING_DEBUG=2: the options, topology and rails this rank ended up with.
  void log_setup() const;
  // The op builders (collective_ops.cpp): the caller's native tensors
  // turned into one op of an engine.  All-reduce of one tensor, or of
  // several flattened (allreduce_coalesced, CPU); `scale`: PREMUL_SUM's
  // factor applied to the input first (null: none, or lone_rank_avg_scale's).
  c10::intrusive_ptr<c10d::Work> submit_all_reduce(std::vector<at::Tensor>& tensors, RedOp op, c10d::OpType type,
                                                   std::function<void(at::Tensor&)> scale);
  // The scale a rank alone on its node applies to its input of an AVG whose
  // nodes divide before the rails (reduce_op.h: avg_divisors) when it runs
  // no node reduction to divide in (null: none; `t`'s device picks the
  // engine's topology).
  std::function<void(at::Tensor&)> lone_rank_avg_scale(Collective collective, RedOp op, const at::Tensor& t) const;
  // Broadcast and reduce of one tensor, from or to `root`.
  c10::intrusive_ptr<c10d::Work> submit_broadcast(std::vector<at::Tensor>& tensors, int root);
  c10::intrusive_ptr<c10d::Work> submit_reduce(std::vector<at::Tensor>& tensors, int root,
                                               const c10d::ReduceOp& reduce_op);
  // A blockwise collective (plan.h) whose every rank passes both sides, by
  // its shape (collective_def.h: reduce-scatter, all-gather, all-to-all):
  // `inputs` flattened are read, `outputs` flattened receive the result;
  // `reduce_op`: the reduction (null: none, the blocks only move).
  // `unequal`: the sizes of the blocks, one per rank, when they differ
  // (elements of the caller's dtype; every rank passes the same); `outputs`
  // then hold this rank's block.
  c10::intrusive_ptr<c10d::Work> submit_blockwise(Collective collective, const std::vector<at::Tensor>& inputs,
                                                  const std::vector<at::Tensor>& outputs,
                                                  const c10d::ReduceOp* reduce_op, c10d::OpType type,
                                                  const std::vector<int64_t>* unequal = nullptr);
  // Sparse all-reduce (sparse_all_reduce.cpp): native for one CPU COO tensor
  // with SUM (not bool); the rest goes to gloo.
  static bool sparse_native(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> allreduce_sparse_cpu(at::Tensor& t);
  // An all-to-all whose blocks may differ in size (all_to_all_uneven.cpp):
  // `inputs` and `outputs` flattened hold the blocks in rank order, block r
  // of `sends[r]` elements (to rank r) and `recvs[r]` (from rank r), as
  // `sizes_of` says (it may throw: a rank's own bad arguments are raised
  // once every rank has its sizes, and its peers fail too).  First shares
  // every rank's sizes (blocking), then runs the all-to-all.
  struct Sizes {
    std::vector<int64_t> sends, recvs;
  };
  c10::intrusive_ptr<c10d::Work> all_to_all_uneven(const std::vector<at::Tensor>& inputs,
                                                   const std::vector<at::Tensor>& outputs,
                                                   const std::function<Sizes()>& sizes_of, c10d::OpType type);
  // Its second step: the blocks, once every size is known (`counts`: the
  // real elements rank s sends rank d at [s * W + d], the same on every
  // rank), as `collective` (kAllToAll, or kAllGatherV for all_gather_uneven).
  c10::intrusive_ptr<c10d::Work> submit_unequal_blocks(Collective collective, const std::vector<at::Tensor>& inputs,
                                                       const std::vector<at::Tensor>& outputs,
                                                       std::vector<int64_t> counts, c10d::OpType type);
  // The list form of all_gather with blocks of unequal sizes: every size
  // is in `outputs` (submit_unequal_blocks).
  c10::intrusive_ptr<c10d::Work> all_gather_uneven(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  // The list form of reduce_scatter with blocks of unequal sizes (CPU):
  // submit_blockwise with the sizes.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_uneven(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                                       const c10d::ReduceOp& op);
  // Gather or scatter of CPU tensors (blockwise): `one` is this rank's
  // tensor (gather: read, scatter: written), `blocks` the root's list of one
  // tensor per rank (gather: written, scatter: read; empty elsewhere).
  c10::intrusive_ptr<c10d::Work> submit_rooted(Collective collective, int root, const at::Tensor& one,
                                               const std::vector<at::Tensor>& blocks, c10d::OpType type);
  // The order rule for work on the point-to-point engine: waits until no
  // pending op (pipeline, delegated, send or receive) conflicts with `fp`.
  void order_p2p(const Footprint& fp);
  // The same for a send or receive of a device tensor, against the device
  // engine's collectives: waits until none that conflicts is still running.
  void order_device(const Footprint& fp);
  // A send (`is_send`) or receive of `t` with `peer` (kAnySource: from
  // any), on the point-to-point engine.
  c10::intrusive_ptr<c10d::Work> submit_p2p(bool is_send, const at::Tensor& t, int peer, int tag);
  // Blocks of unequal sizes each way, pairwise (the uneven all-gather: the
  // same block to every rank; the sparse all-reduce's gathers): block j of
  // `sends` to rank j, rank j's block for us into `recvs[j]`, one send and
  // one receive per pair of ranks on the point-to-point engine.  `kind`:
  // the op's name in the recent ops.
  c10::intrusive_ptr<c10d::Work> exchange_blocks(const std::vector<at::Tensor>& sends,
                                                 const std::vector<at::Tensor>& recvs, std::vector<at::Tensor> outputs,
                                                 c10d::OpType type, const char* kind);
  uint64_t exchange_seq_ = 0;  // exchange_blocks calls so far (their tags)
  // A ValueError unless `rank`, the argument `arg` of `kind` as torch names
  // it (dst, src), is a rank of this group.  Every entry point that takes a
  // rank calls it first, before anything is numbered or delegated: a bad
  // one must never reach an engine (a send to -1 indexed its peers) nor be
  // narrowed to int (2^32 would be rank 0).
  void check_rank(const char* kind, const char* arg, int64_t rank) const;
  // Whether a send or receive of `tensors` with `peer` (the argument `arg`:
  // dst or src; null for recvAnysource, whose peer is kAnySource) runs
  // natively; throws on a peer that is not one (itself, out of the group).
  bool p2p_native(const char* kind, const char* arg, const std::vector<at::Tensor>& tensors, int peer) const;
  // An op of `collective` on the engine of `on`'s device (HostOp, CudaOp).
  static std::shared_ptr<PipelineOp> new_op(Collective collective, const at::Tensor& on);
  // Where a rank's check of its own arguments depends on its rank (its own
  // block of an uneven list, the root's list) its peers may accept theirs:
  // runs `check`, and if it throws, first takes the op's turn with
  // `stand_in` (the same collective over empty tensors; every op it submits
  // is marked rejected, OpKey::rejected), then raises the check's error.
  // The peers' op then fails at once with a mismatch that names this rank,
  // instead of waiting out the timeout; on ranks that all rejected alike
  // the stand-ins match, run empty, and the group goes on.
  void reject_in_turn(const std::function<void()>& check, const std::function<void()>& stand_in);
  // Every native collective, once: the checks its shape needs (a
  // blockwise slice fits), then its Work (`outputs`), its record and its
  // engine (submit_cpu, submit_device).  `kind`: its name in messages and
  // the profiler ("fairring:<kind>"); null: the collective's.
  c10::intrusive_ptr<c10d::Work> submit(std::shared_ptr<PipelineOp> op, c10d::OpType type,
                                        std::vector<at::Tensor> outputs, const char* kind = nullptr);
  c10::intrusive_ptr<c10d::Work> submit_cpu(std::shared_ptr<HostOp> op, c10d::OpType type,
                                            std::vector<at::Tensor> outputs, const char* kind);

  Topology topo_;
  std::vector<std::string> node_keys_;
  int blockwise_pieces_ = 1;  // blockwise_slice_pieces of topo_'s nodes
  Config config_;
  const int creator_pid_ = getpid();
  c10::intrusive_ptr<c10d::Backend> fallback_;
  std::unique_ptr<HostEngine> engine_;
  // Send and receive (null in a group of one rank).
  std::unique_ptr<P2pEngine> p2p_;
  // Collectives issued (delegated ones included: every rank issues the same,
  // so #n names the same collective on every rank), and sends and receives,
  // numbered apart as NCCL does: a rank's point-to-point ops are its own.
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> p2p_seq_{0};
  std::atomic<bool> followed_{false};  // by the status view (live_groups.h), from the first op on
  // Its ops in torch's flight recorder (_dump_fr_trace, fr_trace): the
  // group's numbering there, its ranks, its dumps.
  std::shared_ptr<FlightRecord> fr_;
  // The last ops, for post-mortems (dumped on the first failure) and the
  // status view; each op's one record, with fr_ (recent_ops.h).
  std::shared_ptr<RecentOps> recent_;
  std::shared_ptr<AbortHooks> abort_hooks_ = std::make_shared<AbortHooks>();
  std::shared_ptr<EphemeralTimeouts> ephemeral_ = std::make_shared<EphemeralTimeouts>();
  // Gives the engines config_.timeout plus the live ephemeral extensions.
  void apply_timeout();

  // Whether this build runs collectives of tensors on t's (non-CPU) device.
  static bool device_native(const at::Tensor& t);
  // Dense tensors all in host memory, or all on one device_native device.
  static bool native_tensors(const std::vector<at::Tensor>& tensors);
  // The op object of the device engine (CUDA).
  static std::shared_ptr<PipelineOp> new_device_op();
  // Like submit_cpu, on the device engine (backend_cuda.cpp; created by the
  // group's first device op, or an error).
  c10::intrusive_ptr<c10d::Work> submit_device(std::shared_ptr<PipelineOp> op, c10d::OpType type,
                                               std::vector<at::Tensor> outputs, const char* kind);
  void wait_idle_device();
  // A clear error if the current stream of `device` is capturing a CUDA graph.
  static void check_not_capturing(c10::Device device, const char* kind);
  // Sends and receives of device tensors go through host memory: a host
  // copy of `t`, made on the caller's current stream after its work so far
  // (the call returns once it is made)...
  static at::Tensor host_copy(const at::Tensor& t, const char* kind);
  // ... and, for a receive into `t`, what copies the received bytes from
  // host memory into it, after the work the caller's stream has queued at
  // this call, and is done with it when it returns (it throws if the copy
  // has not finished within the group's timeout).
  std::function<void(const at::Tensor&)> device_landing(const at::Tensor& t, const char* kind) const;
  // abort() of the CPU and CUDA engines (not of gloo).
  void abort_engines(const std::string& why);
  // Tells the peers this rank left the group (`how`: "shut it down", ...),
  // after which op: their ops that need it fail at once (Pipeline::leave).
  void leave(const char* how);
  bool left_ = false;  // leave() ran
  ChildFactory child_factory_;
  // `members`: the child's ranks in this group, in the child's order (the
  // flight recorder names them by their ranks in the default group).
  c10::intrusive_ptr<c10d::Backend> make_child(const char* kind, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                               int size, std::chrono::milliseconds timeout,
                                               const std::vector<int>& members);
  uint64_t shrinks_ = 0;  // shrink() calls so far: each child's store prefix
  // The last split's group name and child (weak: a child dropped by its
  // users must go, and tell its peers).
  std::string last_split_name_;
  c10::weak_intrusive_ptr<c10d::Backend> last_split_{c10::intrusive_ptr<c10d::Backend>()};
  // f(the CUDA engine) if there is one (its abort(), drain(), close()); else true.
  bool with_device_pipeline(const std::function<bool(Pipeline&)>& f) const;
  // The topology the CUDA engine is built on: uneven nodes run it flat.
  Topology device_topology() const { return topo_.uneven ? topo_.flat() : topo_; }
  c10::intrusive_ptr<c10d::Store> store_;
  std::string job_uid_;
  Secret secret_{};
  // Lets a Work interrupted by Ctrl-C abort the group (work.h).
  std::shared_ptr<GroupAbortHook> abort_hook_;
  // Lets the wait() of a send or receive with a node-mate move it for up to
  // Config::wait_spin (work.h); null without node-mates, or when the ranks
  // here outnumber the CPUs (then a waiter sleeps at once).
  std::shared_ptr<WaitPoller> p2p_poller_;
  std::mutex delegated_mu_;
  // Delegated collectives not yet seen done, with their footprints.
  struct Delegated {
    c10::intrusive_ptr<c10d::Work> work;
    Footprint fp;
    bool p2p = false;
  };
  std::vector<Delegated> delegated_;
  std::atomic<bool> has_delegated_{false};  // !delegated_.empty()
  // Calls that waited for a delegated collective or a send/receive: part
  // of order_waits.
  std::atomic<uint64_t> delegated_waits_{0};
  mutable std::mutex cuda_mu_;
  std::unique_ptr<CudaEngine> cuda_engine_;
};

}  // namespace fairring
