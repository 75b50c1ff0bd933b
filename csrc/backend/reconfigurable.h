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

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
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
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
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
