// The ops the collectives' entry points (entry_points.cpp) hand to an
// engine: the caller's tensors turned into one PipelineOp (its buffer,
// blocks, stand-ins, footprint), by the shape of its collective
// (pipeline/collective_def.h), and every op's checks, Work, record and
// submission, once (submit).
#include "backend/backend.h"
#include "collectives/collectives.h"

#include <ATen/MemoryOverlap.h>

#include <algorithm>

#include "backend/reduce_input.h"
#include "backend/stand_in.h"
#include "backend/tensor_args.h"
#include "common/dtype_name.h"
#include "common/log.h"
#include "devices/host_engine.h"
#include "devices/host_op.h"
#include "kernels/first_touch.h"

namespace fairring {

namespace {
// What an op writes that may be fresh memory (kernels/first_touch.h): the
// caller's tensors it writes, and the stand-ins made for them.  Advice only:
// no byte changes, so it may run while an earlier op still writes there.
void advise_fresh(const PipelineOp& op) {
  for (const MemRange& r : op.footprint.writes) {
    advise_fresh_memory(reinterpret_cast<void*>(r.begin), static_cast<int64_t>(r.end - r.begin));
  }
  for (const at::Tensor* t : {&op.output, &op.buffer}) {
    if (t->defined() && t->is_cpu()) advise_fresh_memory(t->data_ptr(), static_cast<int64_t>(t->nbytes()));
  }
}
}  // namespace

std::shared_ptr<PipelineOp> FairringBackend::new_op(Collective collective, const at::Tensor& on) {
  auto op = on.is_cpu() ? std::make_shared<HostOp>() : new_device_op();
  op->collective = collective;
  return op;
}

namespace {
// Set while reject_in_turn submits its stand-in (on the issuing thread):
// submit() marks the op rejected.
thread_local bool t_submitting_stand_in = false;
}  // namespace

void FairringBackend::reject_in_turn(const std::function<void()>& check, const std::function<void()>& stand_in) {
  try {
    check();
  } catch (const std::exception&) {
    const std::exception_ptr rejected = std::current_exception();
    t_submitting_stand_in = true;
    try {
      stand_in();
    } catch (const std::exception& e) {
      // (the group may have failed already: the rank's own error still says what it rejected)
      FAIRRING_DEBUG_LOG(getRank(), "the stand-in for a rejected op was not issued: %s", e.what());
    }
    t_submitting_stand_in = false;
    std::rethrow_exception(rejected);
  }
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit(std::shared_ptr<PipelineOp> op, c10d::OpType type,
                                                       std::vector<at::Tensor> outputs, const char* kind) {
  if (kind == nullptr) kind = collective_name(op->collective);
  check_same_process(kind);
  op->rejected = t_submitting_stand_in;
  op->def = &collective_def(op->collective);
  if (op->def->cut() == Cut::kBlockwise) check_blockwise_fits(kind, op->dtype);
  if (!op->buffer.is_cpu()) return submit_device(std::move(op), type, std::move(outputs), kind);
  return submit_cpu(std::static_pointer_cast<HostOp>(op), type, std::move(outputs), kind);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_cpu(std::shared_ptr<HostOp> op, c10d::OpType type,
                                                           std::vector<at::Tensor> outputs, const char* kind) {
  order_after_delegated(op->footprint);
  if (config_.huge_pages == "advise") advise_fresh(*op);
  auto work =
      c10::make_intrusive<FairringWork>(getRank(), type, std::move(outputs), (std::string("fairring:") + kind).c_str());
  op->on_complete = track(kind, *op, [work](std::exception_ptr error) { work->mark_done(error); });
  op->after_complete = [work](std::exception_ptr error) { work->complete_future(error); };
  op->complete_here = [work](std::exception_ptr error) { return work->complete_future_if_untaken(error); };
  work->set_interrupt_hook(abort_hook_, kind);
  engine_->submit(std::move(op));
  return work;
}

void FairringBackend::check_blockwise_fits(const char* kind, c10::ScalarType dtype) const {
  PlanParams params;
  params.slice_bytes = config_.slice_size;
  // A slice holds a piece per rank, or more on uneven nodes (plan.h).
  TORCH_CHECK(blockwise_fits(c10::elementSize(dtype), blockwise_pieces_, params), "fairring: ", kind, " on ", getSize(),
              " ranks does not fit a slice of FAIRRING_SLICE_SIZE=", config_.slice_size, " bytes; raise it");
}

std::function<void(at::Tensor&)> FairringBackend::lone_rank_avg_scale(Collective collective, RedOp op,
                                                                      const at::Tensor& t) const {
  if (op != RedOp::kAvg) return nullptr;  // (and no Topology copied for every op)
  const c10::ScalarType dtype = c10::toRealValueType(t.scalar_type());
  const auto divisor_of = [&](const Topology& topo) -> int64_t {
    // A rank that runs the node steps divides in its node reduction.
    if (topo.num_nodes == 1 || runs_node_steps(collective_def(collective).cut(), topo.ranks_per_node, topo.uneven)) {
      return 0;
    }
    return avg_divisors(op, dtype, topo.size, topo.num_nodes, topo.largest_node, topo.uneven).node;
  };
  const int64_t divisor = t.is_cpu() ? divisor_of(topo_) : divisor_of(device_topology());
  if (divisor == 0) return nullptr;
  return [divisor](at::Tensor& buffer) {
    at::NoGradGuard no_grad;
    (buffer.is_complex() ? at::view_as_real(buffer) : buffer).div_(divisor);  // as the node reduction divides
  };
}

// One tensor reduced in place (through a contiguous copy if it is not
// contiguous), or several flattened into one buffer and copied back (the
// old multi-tensor API, allreduce_coalesced).
c10::intrusive_ptr<c10d::Work> FairringBackend::submit_all_reduce(std::vector<at::Tensor>& tensors, RedOp redop,
                                                                  c10d::OpType type,
                                                                  std::function<void(at::Tensor&)> scale) {
  if (!scale) scale = lone_rank_avg_scale(Collective::kAllReduce, redop, tensors[0]);
  ReduceInput in = prepare_reduce_input(tensors, redop);
  auto op = new_op(Collective::kAllReduce, tensors[0]);
  op->buffer = in.buffer;
  op->users = std::move(in.users);
  op->dtype = in.dtype;
  op->op = redop;
  op->numel = in.numel;
  op->stage = stage_of(in, std::move(scale));
  for (const at::Tensor& t : tensors) op->footprint.write(t);
  return submit(std::move(op), type, tensors,
                type == c10d::OpType::ALLREDUCE_COALESCED ? "all_reduce_coalesced" : "all_reduce");
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_broadcast(std::vector<at::Tensor>& tensors, int root) {
  // The tensor's bytes, whatever its dtype: the root's reach every rank
  // exactly (collectives/broadcast.cpp).
  const at::Tensor& t = tensors[0];
  auto op = new_op(Collective::kBroadcast, t);
  op->root = root;
  const bool is_root = getRank() == root;
  if (t.is_contiguous()) {
    op->buffer = t;
  } else {
    op->buffer = stand_in(t.numel(), t.options());
    if (is_root) {
      op->stage = [buffer = op->buffer, t] { buffer.view(t.sizes()).copy_(t); };  // only read
    } else {
      op->users = {t};  // receives the result
    }
  }
  if (is_root) {
    op->footprint.read(t);
  } else {
    op->footprint.write(t);
  }
  op->dtype = at::kByte;
  op->op = RedOp::kSum;  // compared between ranks, not applied
  op->numel = t.numel() * static_cast<int64_t>(t.element_size());
  return submit(std::move(op), c10d::OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_reduce(std::vector<at::Tensor>& tensors, int root,
                                                              const c10d::ReduceOp& reduce_op) {
  const at::Tensor& t = tensors[0];
  const RedOp redop = to_redop(reduce_op, t.scalar_type());
  const bool is_root = getRank() == root;
  auto scale = premul_factor(reduce_op, t.scalar_type(), "reduce");
  if (!scale) scale = lone_rank_avg_scale(Collective::kReduce, redop, t);
  // The root's tensor gets the result; the others' are only read (a copy
  // when it is scaled first), and nothing is copied back into them.
  ReduceInput in = prepare_reduce_input(tensors, redop, "reduce", /*copy=*/!is_root && scale != nullptr);
  auto op = new_op(Collective::kReduce, t);
  op->root = root;
  op->buffer = in.buffer;
  op->dtype = in.dtype;
  op->op = redop;
  op->numel = in.numel;
  op->stage = stage_of(in, std::move(scale));
  if (is_root) {
    op->users = std::move(in.users);
    op->footprint.write(t);
  } else {
    op->footprint.read(t);
    // On a node of one rank the sums this rank serves need memory of their
    // own (reduce.cpp): never the caller's tensor.
    if (topo_.ranks_per_node == 1 && topo_.num_nodes > 1)
      op->output = stand_in(in.numel, in.buffer.options().dtype(in.dtype));
  }
  return submit(std::move(op), c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_blockwise(Collective collective,
                                                                 const std::vector<at::Tensor>& inputs,
                                                                 const std::vector<at::Tensor>& outputs,
                                                                 const c10d::ReduceOp* reduce_op, c10d::OpType type,
                                                                 const std::vector<int64_t>* unequal) {
  const Shape shape = collective_def(collective).shape();
  const char* kind = collective_name(collective);
  const int world = getSize();
  const int me = getRank();
  const c10::ScalarType dtype = inputs[0].scalar_type();
  const RedOp redop = reduce_op ? to_redop(*reduce_op, dtype) : RedOp::kSum;
  // The tensors read, as one contiguous buffer (a copy if several or strided,
  // or scaled first: the caller's input is only read).
  auto scale = reduce_op ? premul_factor(*reduce_op, dtype, kind) : nullptr;
  if (!scale) scale = lone_rank_avg_scale(collective, redop, inputs[0]);
  // A reduction's list of one tensor per rank is read where it is: the
  // same schedule as one tensor of the blocks, no copy first.
  const bool rank_blocks = reduce_op && static_cast<int>(inputs.size()) == world && world > 1;
  ReduceInput in = reduce_op ? prepare_reduce_input(inputs, redop, kind, /*copy=*/scale != nullptr, rank_blocks)
                             : prepare_input(inputs, kind);
  const int64_t out_reals = check_outputs(outputs, dtype, kind);
  const int64_t reals = in.buffer.is_complex() ? 2 : 1;
  // Blocks of unequal sizes, each rank's the same: every rank sends block d
  // to rank d, so row s of the counts (PipelineOp::block_counts) is the sizes.
  std::vector<int64_t> counts;
  if (unequal) {
    for (int s = 0; s < world; ++s) {
      for (int64_t n : *unequal) counts.push_back(n * reals);
    }
    // A flattened copy of the list, cut back into its blocks.
    if (in.blocks.empty()) in.blocks = cut_blocks(flat_reals(in.buffer), counts.data() + int64_t{me} * world, world);
  }
  // One block per rank on the shape's per-rank side, one on the other
  // (unequal: up to the largest; the caller checked the sizes).
  const int64_t block = unequal                ? *std::max_element(counts.begin(), counts.end())
                        : shape.input_per_rank ? in.numel / world
                                               : in.numel;
  const bool fits = unequal || (in.numel == block * (shape.input_per_rank ? world : 1) &&
                                out_reals == block * (shape.output_per_rank ? world : 1));
  const auto blocks = [&](bool per_rank) { return per_rank ? std::to_string(world) : std::string("one"); };
  TORCH_CHECK(fits, "fairring: ", kind, " on ", world, " ranks needs ", blocks(shape.input_per_rank),
              " block(s) in the input and ", blocks(shape.output_per_rank),
              " in the output, all of equal size, but the input has ", in.numel, " and the output ", out_reals,
              " elements (a complex one counts as two)");

  auto op = new_op(collective, in.buffer);
  op->buffer = in.buffer;
  op->dtype = in.dtype;
  op->op = redop;
  op->numel = block;
  if (unequal) op->layout = block_layout(unequal->data(), world);
  op->block_counts = std::move(counts);
  op->stage = stage_of(in, std::move(scale));
  op->input_blocks = in.blocks;
  for (const at::Tensor& t : inputs) op->footprint.read(t);
  for (const at::Tensor& t : outputs) op->footprint.write(t);
  // The result goes straight into the caller's tensor when it is one plain
  // contiguous tensor that is not the input, or is exactly this rank's block
  // of it (in place: FSDP's reduce-scatter and all-gather); otherwise into
  // a stand-in copied back.
  const at::Tensor& out = outputs[0];
  const int64_t esize = c10::elementSize(in.dtype);
  const char* out_at = static_cast<const char*>(out.data_ptr());
  const char* in_at = static_cast<const char*>(op->buffer.data_ptr());
  const char* own_in =
      in.blocks.empty() ? in_at + me * block * esize : static_cast<const char*>(in.blocks[me].data_ptr());
  bool own_block = false;
  if (shape.input_per_rank != shape.output_per_rank) {
    own_block = shape.input_per_rank ? out_at == own_in : in_at == out_at + me * block * esize;
  }
  const bool out_aliases_input =
      out.is_alias_of(op->buffer) ||
      std::any_of(in.blocks.begin(), in.blocks.end(), [&](const at::Tensor& b) { return out.is_alias_of(b); });
  const bool plain = outputs.size() == 1 && plain_tensor(out);
  // A list of one tensor per rank (all_gather's, all_to_all's): each block
  // straight into its tensor, unless one shares memory with the input (but
  // for exactly our own block, in place).
  const bool list = outputs.size() > 1 && static_cast<int>(outputs.size()) == world && in.buffer.is_cpu() &&
                    std::all_of(outputs.begin(), outputs.end(), plain_tensor);
  bool blocks_apart = list;
  for (int r = 0; list && r < world; ++r) {
    const bool in_place = r == me && outputs[r].data_ptr() == op->buffer.data_ptr();
    if (outputs[r].is_alias_of(op->buffer) && !in_place) blocks_apart = false;
  }
  if (plain && (!out_aliases_input || own_block)) {
    op->output = out;
  } else if (!unequal && blocks_apart) {
    op->output_blocks = outputs;
  } else {
    op->output = stand_in(out_reals / reals, out.options());
    op->users = outputs;
  }
  return submit(std::move(op), type, outputs);
}

// The blocks, each of its own size, read where the caller has them (or
// from one flattened copy), reduced and scattered through the hierarchy as
// blocks of up to the largest (collectives/reduce_scatter.cpp): nothing is
// padded.  The sizes' hash in the op's key makes ranks that cut their lists
// differently fail with a mismatch (same total, other cuts included).
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter_uneven(const at::Tensor& output,
                                                                      const std::vector<at::Tensor>& inputs,
                                                                      const c10d::ReduceOp& op) {
  std::vector<int64_t> sizes;
  for (const at::Tensor& t : inputs) sizes.push_back(t.numel());
  reject_in_turn(
      [&] {
        TORCH_CHECK_VALUE(output.numel() == sizes[getRank()], "fairring: reduce_scatter: this rank's output has ",
                          output.numel(), " element(s), but its block of the input list (tensor ", getRank(), ") has ",
                          sizes[getRank()]);
      },
      [&] {
        const std::vector<int64_t> none(getSize(), 0);
        const at::Tensor empty = at::empty({0}, output.options());
        submit_blockwise(Collective::kReduceScatter, std::vector<at::Tensor>(getSize(), empty), {empty}, &op,
                         c10d::OpType::REDUCE_SCATTER, &none);
      });
  return submit_blockwise(Collective::kReduceScatter, inputs, {output}, &op, c10d::OpType::REDUCE_SCATTER, &sizes);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_rooted(Collective collective, int root, const at::Tensor& one,
                                                              const std::vector<at::Tensor>& blocks,
                                                              c10d::OpType type) {
  // The root's list is the per-rank side: a gather's output, a scatter's input.
  const bool gather = collective_def(collective).shape().output_per_rank;
  const char* kind = collective_name(collective);
  const int world = getSize();
  const bool is_root = getRank() == root;
  // Only the root has a list to check: the others would wait for it.
  const auto check_list = [&] {
    if (!is_root) {
      TORCH_CHECK(blocks.empty(), "fairring: ", kind, " takes a list of tensors on the root (rank ", root,
                  ") only, but rank ", getRank(), " got ", blocks.size());
      return;
    }
    TORCH_CHECK(static_cast<int>(blocks.size()) == world, "fairring: ", kind, " needs one tensor per rank (", world,
                ") on the root, but got ", blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const at::Tensor& b = blocks[i];
      TORCH_CHECK(b.numel() == one.numel() && b.scalar_type() == one.scalar_type() && b.device() == one.device(),
                  "fairring: ", kind, " needs the root's tensors to be like its own (", one.numel(), " elements of ",
                  dtype_name(one.scalar_type()), " on ", one.device().str(), "), but tensor ", i, " has ", b.numel(),
                  " of ", dtype_name(b.scalar_type()), " on ", b.device().str());
      TORCH_CHECK(b.layout() == c10::kStrided && (!gather || at::has_internal_overlap(b) != at::MemOverlap::Yes),
                  "fairring: ", kind, " into tensor ", i,
                  " of the root's list, whose elements share memory or which "
                  "is not dense: clone() it first");
    }
  };
  reject_in_turn(check_list, [&] {
    const at::Tensor empty = at::empty({0}, one.options());
    submit_rooted(collective, root, empty, is_root ? std::vector<at::Tensor>(world, empty) : std::vector<at::Tensor>{},
                  type);
  });
  auto op = new_op(collective, one);
  op->root = root;
  op->op = RedOp::kSum;  // compared between ranks, not applied
  if (gather) {
    ReduceInput in = prepare_input({one}, kind);
    op->buffer = in.buffer;
    op->stage = in.fill;
    op->footprint.read(one);
    if (is_root) {
      // Straight into the caller's tensors, or a stand-in copied back.
      if (std::all_of(blocks.begin(), blocks.end(), plain_tensor)) {
        op->output_blocks = blocks;
      } else {
        op->output = stand_in(world * one.numel(), one.options());
        op->users = blocks;
      }
      for (const at::Tensor& b : blocks) op->footprint.write(b);
    }
  } else {
    TORCH_CHECK(at::has_internal_overlap(one) != at::MemOverlap::Yes, "fairring: scatter into a tensor whose ",
                "elements share memory (sizes ", one.sizes(), ", strides ", one.strides(), "): clone() it first");
    bool aliased = false;  // our output shares memory with the root's input
    if (is_root) {
      // Read where the caller has them, or from a contiguous copy.
      if (std::all_of(blocks.begin(), blocks.end(), plain_tensor)) {
        op->input_blocks = blocks;
        op->buffer = blocks[0];  // (its device and dtype)
      } else {
        ReduceInput in = prepare_input(blocks, kind);
        op->buffer = in.buffer;
        op->stage = in.fill;
      }
      for (const at::Tensor& b : blocks) {
        op->footprint.read(b);
        aliased = aliased || one.is_alias_of(b);
      }
      aliased = aliased || one.is_alias_of(op->buffer);
    }
    if (plain_tensor(one) && !aliased) {
      op->output = one;
    } else {
      op->output = stand_in(one.numel(), one.options());
      op->users = {one};
    }
    if (!is_root) op->buffer = op->output;  // not read: only the root's input is
    op->footprint.write(one);
  }
  op->dtype = one.is_complex() ? c10::toRealValueType(one.scalar_type()) : one.scalar_type();
  op->numel = reals_of(one);
  return submit(std::move(op), type, gather ? blocks : std::vector<at::Tensor>{one});
}

}  // namespace fairring
