// ReconfigurableBackend: a Fairring group whose members can change in place
// (torch >= 2.14's reconfigure API; built only where c10d has it).
//
// torch.distributed creates it when a group is made with
// enable_reconfigure=True.  It starts with no members: its ops raise until
// the first reconfigure().  Each reconfigure(uuid, handles) builds a new
// FairringBackend of the ranks whose handles are listed (their own
// numbering, failure state and hierarchy, on a corner of the group's store
// named by the uuid) and retires the one before; every op is passed to the
// current one.  Handles are exchanged out of band (torchft's quorum, a
// store): "fairring:<rank>:<uuid>:<token>:<store address>", where the token
// tells two processes apart and the store address the job.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#ifdef C10D_BACKEND_HAS_RECONFIGURE

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <mutex>
#include <set>
#include <string>

#include "backend/backend.h"

namespace fairring {

// The ops a ReconfigurableBackend passes on: X(name, (parameters), (arguments)).
#define FAIRRING_RECONFIGURABLE_OPS(X)                                                                                \
  X(allreduce, (std::vector<at::Tensor> & t, const c10d::AllreduceOptions& o), (t, o))                                \
  X(allreduce_coalesced, (std::vector<at::Tensor> & t, const c10d::AllreduceCoalescedOptions& o), (t, o))             \
  X(allreduce_sparse, (std::vector<at::Tensor> & t, const c10d::AllreduceOptions& o), (t, o))                         \
  X(broadcast, (std::vector<at::Tensor> & t, const c10d::BroadcastOptions& o), (t, o))                                \
  X(reduce, (std::vector<at::Tensor> & t, const c10d::ReduceOptions& o), (t, o))                                      \
  X(allgather,                                                                                                        \
    (std::vector<std::vector<at::Tensor>> & out, std::vector<at::Tensor> & in, const c10d::AllgatherOptions& o),      \
    (out, in, o))                                                                                                     \
  X(_allgather_base, (at::Tensor & out, at::Tensor & in, const c10d::AllgatherOptions& o), (out, in, o))              \
  X(allgather_coalesced,                                                                                              \
    (std::vector<std::vector<at::Tensor>> & out, std::vector<at::Tensor> & in, const c10d::AllgatherOptions& o),      \
    (out, in, o))                                                                                                     \
  X(allgather_into_tensor_coalesced,                                                                                  \
    (std::vector<at::Tensor> & out, std::vector<at::Tensor> & in, const c10d::AllgatherOptions& o), (out, in, o))     \
  X(gather, (std::vector<std::vector<at::Tensor>> & out, std::vector<at::Tensor> & in, const c10d::GatherOptions& o), \
    (out, in, o))                                                                                                     \
  X(scatter,                                                                                                          \
    (std::vector<at::Tensor> & out, std::vector<std::vector<at::Tensor>> & in, const c10d::ScatterOptions& o),        \
    (out, in, o))                                                                                                     \
  X(reduce_scatter,                                                                                                   \
    (std::vector<at::Tensor> & out, std::vector<std::vector<at::Tensor>> & in, const c10d::ReduceScatterOptions& o),  \
    (out, in, o))                                                                                                     \
  X(_reduce_scatter_base, (at::Tensor & out, at::Tensor & in, const c10d::ReduceScatterOptions& o), (out, in, o))     \
  X(reduce_scatter_tensor_coalesced,                                                                                  \
    (std::vector<at::Tensor> & out, std::vector<at::Tensor> & in, const c10d::ReduceScatterOptions& o), (out, in, o)) \
  X(alltoall_base,                                                                                                    \
    (at::Tensor & out, at::Tensor & in, std::vector<int64_t> & out_splits, std::vector<int64_t> & in_splits,          \
     const c10d::AllToAllOptions& o),                                                                                 \
    (out, in, out_splits, in_splits, o))                                                                              \
  X(alltoall, (std::vector<at::Tensor> & out, std::vector<at::Tensor> & in, const c10d::AllToAllOptions& o),          \
    (out, in, o))                                                                                                     \
  X(send, (std::vector<at::Tensor> & t, int dst, int tag), (t, dst, tag))                                             \
  X(recv, (std::vector<at::Tensor> & t, int src, int tag), (t, src, tag))                                             \
  X(recvAnysource, (std::vector<at::Tensor> & t, int tag), (t, tag))                                                  \
  X(barrier, (const c10d::BarrierOptions& o), (o))

class ReconfigurableBackend : public c10d::Backend {
 public:
  // `rank`, `size`: as torch created the group (reported until the first
  // reconfigure).  `make` builds each member group (fairring_py's options).
  ReconfigurableBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        std::chrono::milliseconds timeout, FairringBackend::ChildFactory make);

  const std::string getBackendName() const override { return "fairring"; }
  bool supportsReconfigure() const override { return true; }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
  // The group of the last reconfigure (null before the first).
  c10::intrusive_ptr<FairringBackend> current() const;

  void registerAbortHook(int64_t hook_id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hook_id) override;
  void abort() override;
  void shutdown() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void addEphemeralTimeout(const std::chrono::milliseconds& timeout) override;
  c10d::ErrorType getError() override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsShrinking() const override { return true; }
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
                                           const c10::intrusive_ptr<Options>& opts_override = nullptr) override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;

  // Every op c10d gives a backend, each passed to the current members.
#define FAIRRING_DECLARE_OP(name, params, args) c10::intrusive_ptr<c10d::Work> name params override;
  FAIRRING_RECONFIGURABLE_OPS(FAIRRING_DECLARE_OP)
#undef FAIRRING_DECLARE_OP
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

 private:
  // The current group, or a clear error before the first reconfigure.
  c10::intrusive_ptr<FairringBackend> members(const char* what) const;

  const c10::intrusive_ptr<c10d::Store> store_;
  const FairringBackend::ChildFactory make_;
  const std::string token_;  // this process's instance of the group
  std::string store_address_;
  std::chrono::milliseconds timeout_;
  int64_t uuid_ = -1;  // of the last reconfigure
  std::set<int64_t> used_uuids_;
  AbortHooks hooks_;  // handed to each member group
  mutable std::mutex mu_;
  c10::intrusive_ptr<FairringBackend> current_;
};

}  // namespace fairring

#endif  // C10D_BACKEND_HAS_RECONFIGURE
