// The all-to-all of blocks of unequal sizes (all_to_all_single with splits,
// the list form with tensors of several sizes), hierarchical like the equal
// one, in two ops of the group:
//
//   1. every rank's block sizes (what it sends to each rank, what it
//      expects from each) all-gathered (Collective::kAllToAllSizes) and
//      waited for: the only step that blocks the caller.  Every rank then
//      holds the whole matrix and checks every pair the same way, so sizes
//      that do not match (rank A sends 3 elements to B, B expects 4) are
//      the same error on every rank, before anything moves, and the group
//      goes on;
//   2. the blocks through collectives/all_to_all.cpp as blocks of up to the
//      largest size (PipelineOp::block_counts): a short block's pieces are
//      shorter or empty, so no padding is copied or sent.
//
// Which path a rank takes depends only on what every rank passes alike
// (splits or none, a list), never on the sizes' values: a rank whose
// splits happen to be equal takes this path too, as its peers do.
//
// The all-gather of blocks of unequal sizes (Collective::kAllGatherV) is
// step 2 alone: every rank knows every size from its own outputs, and
// ranks whose lists differ meet a mismatch (the sizes' hash is in the
// op's key, OpKey::layout).
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "backend/reduce_input.h"
#include "backend/stand_in.h"
#include "backend/tensor_args.h"
#include "collectives/collectives.h"
#include "common/dtype_name.h"
#include "common/gil.h"
#include "devices/host_op.h"

namespace fairring {

c10::intrusive_ptr<c10d::Work> FairringBackend::all_to_all_uneven(const std::vector<at::Tensor>& inputs,
                                                                  const std::vector<at::Tensor>& outputs,
                                                                  const std::function<Sizes()>& sizes_of,
                                                                  c10d::OpType type) {
  const char* kind = "all_to_all";
  check_same_process(kind);
  const int world = getSize();
  const at::Tensor& first = inputs[0];
  // This rank's own checks.  A failing one is raised only once every rank
  // has its row (flagged), so that the peers fail too instead of waiting.
  std::exception_ptr rejected;
  Sizes mine_sizes;
  const auto check = [&](const at::Tensor& t, const char* which, size_t i) {
    TORCH_CHECK(t.scalar_type() == first.scalar_type() && t.device() == first.device(), "fairring: ", kind,
                " needs every input and output of one dtype and device (", dtype_name(first.scalar_type()), " on ",
                first.device().str(), "), but ", which, " ", i, " is ", dtype_name(t.scalar_type()), " on ",
                t.device().str());
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "fairring: ", kind, " of a tensor whose ",
                "elements share memory (sizes ", t.sizes(), ", strides ", t.strides(), "): clone() it first");
  };
  try {
    for (size_t i = 0; i < inputs.size(); ++i) check(inputs[i], "input", i);
    for (size_t i = 0; i < outputs.size(); ++i) check(outputs[i], "output", i);
    mine_sizes = sizes_of();
  } catch (const std::exception&) {
    rejected = std::current_exception();
  }

  // 1. Every rank's sizes, in its elements: W sent, W expected, its dtype,
  //    its device type, whether it rejected its own arguments.
  const int64_t row = 2 * world + 3;
  at::Tensor mine = at::zeros({row}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  if (!rejected) {
    std::copy(mine_sizes.sends.begin(), mine_sizes.sends.end(), m);
    std::copy(mine_sizes.recvs.begin(), mine_sizes.recvs.end(), m + world);
  }
  m[2 * world] = static_cast<int64_t>(first.scalar_type());
  m[2 * world + 1] = static_cast<int64_t>(first.device().type());
  m[2 * world + 2] = rejected ? 1 : 0;
  at::Tensor all = at::empty({world * row}, at::kLong);
  auto sizes =
      submit_blockwise(Collective::kAllToAllSizes, {mine}, {all}, /*reduce_op=*/nullptr, c10d::OpType::ALLGATHER);
  {
    GilReleaseIfHeld no_gil;
    sizes->wait();
  }
  if (rejected) std::rethrow_exception(rejected);
  const int64_t* a = all.data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(a[r * row + 2 * world + 2] == 0, "fairring: ", kind, ": rank ", r,
                      " rejected its own arguments (its error says why); nothing was sent");
  }
  const auto dtype_of = [&](int r) { return static_cast<c10::ScalarType>(a[r * row + 2 * world]); };
  const auto device_of = [&](int r) { return static_cast<c10::DeviceType>(a[r * row + 2 * world + 1]); };
  for (int r = 1; r < world; ++r) {
    TORCH_CHECK_TYPE(dtype_of(r) == dtype_of(0), "fairring: ", kind, ": rank 0 passes blocks of ",
                     dtype_name(dtype_of(0)), " but rank ", r, " of ", dtype_name(dtype_of(r)),
                     " (every rank's sizes were compared; nothing was sent)");
    TORCH_CHECK_VALUE(device_of(r) == device_of(0), "fairring: ", kind, ": rank 0 passes ",
                      c10::DeviceTypeName(device_of(0), true), " tensors but rank ", r, " ",
                      c10::DeviceTypeName(device_of(r), true),
                      " ones (every rank's sizes were compared; nothing was sent)");
  }
  const int64_t reals = first.is_complex() ? 2 : 1;
  std::vector<int64_t> counts(static_cast<size_t>(world) * world);  // [sender * W + receiver], real elements
  for (int s = 0; s < world; ++s) {
    for (int d = 0; d < world; ++d) {
      const int64_t sent = a[s * row + d];
      const int64_t expected = a[d * row + world + s];
      TORCH_CHECK_VALUE(sent == expected, "fairring: ", kind, ": rank ", s, " sends ", sent, " element(s) to rank ", d,
                        ", but rank ", d, " expects ", expected, " from rank ", s,
                        " (every rank's splits were compared; nothing was sent)");
      counts[s * world + d] = sent * reals;
    }
  }
  return submit_unequal_blocks(Collective::kAllToAll, inputs, outputs, std::move(counts), type);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_unequal_blocks(Collective collective,
                                                                      const std::vector<at::Tensor>& inputs,
                                                                      const std::vector<at::Tensor>& outputs,
                                                                      std::vector<int64_t> counts, c10d::OpType type) {
  const char* kind = collective_name(collective);
  // 2. The blocks, read and written where the caller has them when it can.
  const int world = getSize();
  const int me = getRank();
  const at::Tensor& first = inputs[0];
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> send_reals(world), recv_reals(world);
  for (int r = 0; r < world; ++r) {
    send_reals[r] = counts[me * world + r];
    recv_reals[r] = counts[r * world + me];
  }
  auto op = new_op(collective, first);
  op->op = RedOp::kSum;  // compared between ranks, not applied
  op->dtype = first.is_complex() ? c10::toRealValueType(first.scalar_type()) : first.scalar_type();
  op->numel = largest;
  op->layout = block_layout(counts.data(), static_cast<int>(counts.size()));
  op->block_counts = std::move(counts);
  const bool list = inputs.size() > 1;
  if (list && std::all_of(inputs.begin(), inputs.end(), plain_tensor)) {
    op->buffer = first;  // (its device and dtype)
    for (const at::Tensor& t : inputs) op->input_blocks.push_back(flat_reals(t));
  } else {
    ReduceInput in = prepare_input(inputs, kind);
    op->buffer = in.buffer;
    op->stage = in.fill;
    op->input_blocks = cut_blocks(flat_reals(in.buffer), send_reals.data(), world);
  }
  bool aliased = false;  // an output shares memory with an input
  for (const at::Tensor& o : outputs) {
    for (const at::Tensor& i : inputs) aliased = aliased || o.is_alias_of(i);
    aliased = aliased || o.is_alias_of(op->buffer);
  }
  if (!aliased && std::all_of(outputs.begin(), outputs.end(), plain_tensor)) {
    if (list) {
      for (const at::Tensor& t : outputs) op->output_blocks.push_back(flat_reals(t));
    } else {
      op->output_blocks = cut_blocks(flat_reals(outputs[0]), recv_reals.data(), world);
    }
  } else {
    int64_t total = 0;
    for (const at::Tensor& t : outputs) total += t.numel();
    op->output = stand_in(total, first.options());
    op->users = outputs;
    op->output_blocks = cut_blocks(flat_reals(op->output), recv_reals.data(), world);
  }
  for (const at::Tensor& t : inputs) op->footprint.read(t);
  for (const at::Tensor& t : outputs) op->footprint.write(t);
  return submit(std::move(op), type, outputs);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::all_gather_uneven(const std::vector<at::Tensor>& outputs,
                                                                  const at::Tensor& input) {
  const int world = getSize();
  const int me = getRank();
  check_outputs(outputs, input.scalar_type(), "all_gather");
  reject_in_turn(
      [&] {
        TORCH_CHECK_VALUE(outputs[me].numel() == input.numel(), "fairring: all_gather: this rank's input has ",
                          input.numel(), " element(s), but its block of the output list (tensor ", me, ") has ",
                          outputs[me].numel());
      },
      [&] {
        const std::vector<at::Tensor> empties(world, at::empty({0}, input.options()));
        submit_unequal_blocks(Collective::kAllGatherV, empties, empties,
                              std::vector<int64_t>(static_cast<size_t>(world) * world, 0), c10d::OpType::ALLGATHER);
      });
  // Rank s sends its block, the size of output s, to every rank.
  const int64_t reals = input.is_complex() ? 2 : 1;
  std::vector<int64_t> counts(static_cast<size_t>(world) * world);
  for (int s = 0; s < world; ++s) {
    for (int d = 0; d < world; ++d) counts[s * world + d] = outputs[s].numel() * reals;
  }
  return submit_unequal_blocks(Collective::kAllGatherV, std::vector<at::Tensor>(world, input), outputs,
                               std::move(counts), c10d::OpType::ALLGATHER);
}

}  // namespace fairring
