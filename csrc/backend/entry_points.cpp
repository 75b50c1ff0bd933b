// The c10d entry points of the collectives.  Each checks what must be
// checked before anything is numbered or delegated (a root's rank), decides
// whether its arguments run natively or go to gloo (run_delegated), and
// hands the native ones to the op builders of collective_ops.cpp.
#include "backend/backend.h"
#include "collectives/collectives.h"

#include <algorithm>

#include "backend/tensor_args.h"

namespace fairring {

namespace {
// The coalesced forms of torch 2.x: one op per (input, output) pair, in
// order; the last one's Work completes after the others' (an engine ends
// its ops in issue order).
template <typename Fn>
c10::intrusive_ptr<c10d::Work> each_pair(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                                         Fn submit_one) {
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) last = submit_one(inputs[i], outputs[i]);
  return last;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "fairring: all_reduce got an empty list of tensors");
  check_same_process("all_reduce");
  // Sparse gradients (nn.Embedding(sparse=True)): sparse_all_reduce.cpp, or
  // gloo for what that does not take.  Ordered after the ops issued before.
  if (sparse_native(tensors, opts)) return allreduce_sparse_cpu(tensors[0]);
  if (tensors[0].layout() != c10::kStrided) {
    return run_delegated("allreduce", touched(tensors),
                         [&](c10d::Backend& gloo) { return gloo.allreduce(tensors, opts); });
  }
  // c10d's list form means one tensor per device, all reduced together
  // (gloo adds the list's tensors to each other too): not what a list of
  // different tensors wants, and not something Fairring does.
  TORCH_CHECK(tensors.size() == 1, "fairring: all_reduce takes one tensor per call, got ", tensors.size(),
              " (the old one-tensor-per-device form). Issue one all_reduce per tensor, or use "
              "all_reduce_coalesced to reduce several tensors in one op.");
  const at::Tensor& t = tensors[0];
  TORCH_CHECK(t.is_cpu() || device_native(t), "fairring: all_reduce of ", t.device().str(), " tensors is not supported",
              t.is_cuda() ? " by this build; only CPU tensors are (this fairring_py._C was built without CUDA: "
                            "rebuild with FAIRRING_BUILD_CUDA=1 against a CUDA build of torch)"
                          : "; it supports CPU and CUDA tensors");
  return submit_all_reduce(tensors, to_redop(opts.reduceOp, t.scalar_type()), c10d::OpType::ALLREDUCE,
                           premul_factor(opts.reduceOp, t.scalar_type(), "all_reduce"));
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  // Native for dense CPU tensors: one all-reduce of them flattened.
  const bool native = !tensors.empty() && std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && t.device().is_cpu();
  });
  if (!native) {
    return run_delegated("allreduce_coalesced", touched(tensors),
                         [&](c10d::Backend& gloo) { return gloo.allreduce_coalesced(tensors, opts); });
  }
  const c10::ScalarType dtype = tensors[0].scalar_type();
  return submit_all_reduce(tensors, to_redop(opts.reduceOp, dtype), c10d::OpType::ALLREDUCE_COALESCED,
                           premul_factor(opts.reduceOp, dtype, "all_reduce_coalesced"));
}

c10::intrusive_ptr<c10d::Work> FairringBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  // One dense tensor on the CPU (or on the GPU, in a CUDA build) is native;
  // the rest (several tensors, sparse, conjugate or negative views) goes to gloo.
  check_rank("broadcast", "src", opts.rootRank);
  const bool native = tensors.size() == 1 && opts.rootTensor == 0 && native_tensors(tensors) && !tensors[0].is_conj() &&
                      !tensors[0].is_neg();
  if (!native) {
    return run_delegated("broadcast", touched(tensors),
                         [&](c10d::Backend& gloo) { return gloo.broadcast(tensors, opts); });
  }
  return submit_broadcast(tensors, static_cast<int>(opts.rootRank));
}

c10::intrusive_ptr<c10d::Work> FairringBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  // One dense CPU tensor is native; the rest (several tensors, sparse,
  // device tensors) goes to gloo.
  check_rank("reduce", "dst", opts.rootRank);
  const bool native = tensors.size() == 1 && opts.rootTensor == 0 && tensors[0].layout() == c10::kStrided &&
                      tensors[0].device().is_cpu();
  if (!native) {
    return run_delegated("reduce", touched(tensors), [&](c10d::Backend& gloo) { return gloo.reduce(tensors, opts); });
  }
  return submit_reduce(tensors, static_cast<int>(opts.rootRank), opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  // Native when every output has the input's size (blockwise), and for a
  // list of one tensor per rank of other sizes (each rank's input size):
  // an all-to-all of unequal blocks in which every rank sends its block to
  // every rank, through the hierarchy like any other.  Other forms go to gloo.
  const bool native = outputs.size() == 1 && inputs.size() == 1 && native_tensors(both(inputs, outputs[0]));
  TORCH_CHECK_VALUE(!native || static_cast<int>(outputs[0].size()) == getSize(), "fairring: all_gather needs one ",
                    "output tensor per rank (", getSize(), "), but the output list holds ", outputs[0].size());
  const bool even = native && std::all_of(outputs[0].begin(), outputs[0].end(),
                                          [&](const at::Tensor& t) { return t.numel() == inputs[0].numel(); });
  if (even) return submit_blockwise(Collective::kAllGather, inputs, outputs[0], nullptr, c10d::OpType::ALLGATHER);
  if (native && static_cast<int>(outputs[0].size()) == getSize()) return all_gather_uneven(outputs[0], inputs[0]);
  return run_delegated("allgather", touched(outputs, inputs),
                       [&](c10d::Backend& gloo) { return gloo.allgather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> FairringBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  if (!native_tensors({output, input})) {
    return run_delegated("_allgather_base", touched(output, input),
                         [&](c10d::Backend& gloo) { return gloo._allgather_base(output, input, opts); });
  }
  return submit_blockwise(Collective::kAllGather, {input}, {output}, nullptr, c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives rank r's inputs[i]: one all-gather of the
  // flattened inputs, whose block r is outputs[r] flattened.
  std::vector<at::Tensor> flat_out;
  bool even = static_cast<int>(outputs.size()) == getSize();
  for (size_t r = 0; even && r < outputs.size(); ++r) {
    even = outputs[r].size() == inputs.size() && native_tensors(both(inputs, outputs[r]));
    for (size_t i = 0; even && i < inputs.size(); ++i) even = outputs[r][i].numel() == inputs[i].numel();
    flat_out.insert(flat_out.end(), outputs[r].begin(), outputs[r].end());
  }
  if (!even || inputs.empty()) {
    return run_delegated("allgather_coalesced", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.allgather_coalesced(outputs, inputs, opts); });
  }
  return submit_blockwise(Collective::kAllGather, inputs, flat_out, nullptr, c10d::OpType::ALLGATHER_COALESCED);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  if (outputs.empty() || outputs.size() != inputs.size() || !native_tensors(both(inputs, outputs))) {
    return run_delegated("allgather_into_tensor_coalesced", touched(outputs, inputs), [&](c10d::Backend& gloo) {
      return gloo.allgather_into_tensor_coalesced(outputs, inputs, opts);
    });
  }
  return each_pair(inputs, outputs, [&](const at::Tensor& in, const at::Tensor& out) {
    return submit_blockwise(Collective::kAllGather, {in}, {out}, nullptr, c10d::OpType::COALESCED);
  });
}

c10::intrusive_ptr<c10d::Work> FairringBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  // Native for one dense CPU or CUDA input (the same test on every rank);
  // the root's list is checked in submit_rooted.
  check_rank("gather", "dst", opts.rootRank);
  if (inputs.size() != 1 || !native_tensors(inputs) || outputs.size() > 1) {
    return run_delegated("gather", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.gather(outputs, inputs, opts); });
  }
  return submit_rooted(Collective::kGather, static_cast<int>(opts.rootRank), inputs[0],
                       outputs.empty() ? std::vector<at::Tensor>{} : outputs[0], c10d::OpType::GATHER);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  check_rank("scatter", "src", opts.rootRank);
  if (outputs.size() != 1 || !native_tensors(outputs) || inputs.size() > 1) {
    return run_delegated("scatter", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.scatter(outputs, inputs, opts); });
  }
  return submit_rooted(Collective::kScatter, static_cast<int>(opts.rootRank), outputs[0],
                       inputs.empty() ? std::vector<at::Tensor>{} : inputs[0], c10d::OpType::SCATTER);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  // inputs[0][r] is reduced into rank r's output: one reduce-scatter of the
  // inputs flattened; blocks of unequal sizes each as long as it is (CPU).  Other lists
  // (several outputs, device tensors of unequal sizes) go to gloo.
  const bool native = outputs.size() == 1 && inputs.size() == 1 && native_tensors(both(inputs[0], outputs)) &&
                      static_cast<int>(inputs[0].size()) == getSize();
  const bool even = native && std::all_of(inputs[0].begin(), inputs[0].end(),
                                          [&](const at::Tensor& t) { return t.numel() == outputs[0].numel(); });
  if (even) {
    return submit_blockwise(Collective::kReduceScatter, inputs[0], outputs, &opts.reduceOp,
                            c10d::OpType::REDUCE_SCATTER);
  }
  if (native && outputs[0].is_cpu()) return reduce_scatter_uneven(outputs[0], inputs[0], opts.reduceOp);
  return run_delegated("reduce_scatter", touched(outputs, inputs),
                       [&](c10d::Backend& gloo) { return gloo.reduce_scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> FairringBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  if (!native_tensors({output, input})) {
    return run_delegated("_reduce_scatter_base", touched(output, input),
                         [&](c10d::Backend& gloo) { return gloo._reduce_scatter_base(output, input, opts); });
  }
  return submit_blockwise(Collective::kReduceScatter, {input}, {output}, &opts.reduceOp,
                          c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.empty() || outputs.size() != inputs.size() || !native_tensors(both(inputs, outputs))) {
    return run_delegated("reduce_scatter_tensor_coalesced", touched(outputs, inputs), [&](c10d::Backend& gloo) {
      return gloo.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    });
  }
  return each_pair(inputs, outputs, [&](const at::Tensor& in, const at::Tensor& out) {
    return submit_blockwise(Collective::kReduceScatter, {in}, {out}, &opts.reduceOp, c10d::OpType::COALESCED);
  });
}

c10::intrusive_ptr<c10d::Work> FairringBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  // Native (CPU and CUDA): without splits, equal blocks (all_to_all.cpp);
  // with splits, equal or not, all_to_all_uneven: the path depends only on
  // whether splits are passed, which every rank must do alike (a rank that
  // passes none while its peers pass some gets a mismatch on CPU tensors).
  const int world = getSize();
  const bool native = native_tensors({output, input});
  if ((!input_splits.empty() || !output_splits.empty()) && native) {
    // The splits are checked once every rank has its sizes (so a rank's bad
    // splits fail its peers too, at once).
    return all_to_all_uneven(
        {input}, {output},
        [&] {
          check_splits(input_splits, input, world, "input");
          check_splits(output_splits, output, world, "output");
          // Elements per block: rows times the elements of a row.
          const auto elements = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
            const int64_t per_row = t.size(0) == 0 ? 0 : t.numel() / t.size(0);
            std::vector<int64_t> out(world);
            for (int r = 0; r < world; ++r) out[r] = (splits.empty() ? t.size(0) / world : splits[r]) * per_row;
            return out;
          };
          return Sizes{elements(input, input_splits), elements(output, output_splits)};
        },
        c10d::OpType::ALLTOALL_BASE);
  }
  check_splits(input_splits, input, world, "input");
  check_splits(output_splits, output, world, "output");
  if (!native) {
    return run_delegated("alltoall_base", touched(output, input), [&](c10d::Backend& gloo) {
      return gloo.alltoall_base(output, input, output_splits, input_splits, opts);
    });
  }
  return submit_blockwise(Collective::kAllToAll, {input}, {output}, nullptr, c10d::OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  // Native for W dense tensors each way (CPU and CUDA), of any sizes: the
  // list form always shares its sizes first (all_to_all_uneven), so that
  // ranks whose lists happen to be of one size take the same path as
  // their peers.  Other lists go to gloo.
  if (inputs.empty() || static_cast<int>(inputs.size()) != getSize() || outputs.size() != inputs.size() ||
      !native_tensors(both(inputs, outputs))) {
    return run_delegated("alltoall", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.alltoall(outputs, inputs, opts); });
  }
  return all_to_all_uneven(
      inputs, outputs,
      [&] {
        Sizes sizes;
        for (const at::Tensor& t : inputs) sizes.sends.push_back(t.numel());
        for (const at::Tensor& t : outputs) sizes.recvs.push_back(t.numel());
        return sizes;
      },
      c10d::OpType::ALLTOALL);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::barrier(const c10d::BarrierOptions& opts) {
  check_same_process("barrier");
  // CUDA collectives run on their own engine, which the CPU pipeline does not
  // order against: the caller waits for them (their device work included),
  // as before a delegated call; a group without any returns at once.
  wait_idle_device();
  // And for every delegated collective still running (its memory is not the
  // barrier's).  Not for sends and receives: a receive posted before the
  // barrier may be matched by a send issued after it.
  order_after_delegated(Footprint::all_memory(), /*with_p2p=*/false);
  // Native: one byte all-reduced (MAX) through the pipeline, after every
  // collective issued before it; a small op, so it runs inline when idle.
  std::vector<at::Tensor> token{at::zeros({1}, at::kByte)};
  auto op = new_op(Collective::kBarrier, token[0]);
  op->buffer = token[0];
  op->dtype = at::kByte;
  op->op = RedOp::kMax;
  op->numel = 1;
  return submit(std::move(op), c10d::OpType::BARRIER, token);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceOptions& opts) {
  if (sparse_native(tensors, opts)) return allreduce_sparse_cpu(tensors[0]);
  return run_delegated("allreduce_sparse", touched(tensors),
                       [&](c10d::Backend& gloo) { return gloo.allreduce_sparse(tensors, opts); });
}

void FairringBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  delegate("monitoredBarrier").monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace fairring
