#include "backend/reduce_input.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "backend/stand_in.h"
#include "common/dtype_name.h"
#include "kernels/reduce_cpu.h"

namespace fairring {

bool plain_tensor(const at::Tensor& t) { return t.is_contiguous() && !t.is_conj() && !t.is_neg(); }

ReduceInput prepare_input(const std::vector<at::Tensor>& tensors, const char* kind, bool copy, bool as_blocks) {
  TORCH_CHECK(!tensors.empty(), "fairring: ", kind, " got an empty list of tensors");
  const at::Tensor& first = tensors[0];
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.scalar_type() == first.scalar_type() && t.device() == first.device(), "fairring: ", kind,
                " of several tensors needs one dtype and device, but tensor 0 is ", dtype_name(first.scalar_type()),
                " on ", first.device().str(), " and tensor ", i, " is ", dtype_name(t.scalar_type()), " on ",
                t.device().str());
    // The result would be written into one element several times, once
    // per alias, with no single right answer.
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "fairring: ", kind, " of a tensor whose ",
                "elements share memory (an expanded or overlapping view, e.g. stride 0; sizes ", t.sizes(),
                ", strides ", t.strides(), "): clone() it first");
    total += t.numel();
  }
  ReduceInput in;
  // A tensor with the conjugate or negative bit set holds its values
  // transformed in memory: reduce a resolved copy (copy_ resolves the bit),
  // and copy back through the view (copy_ applies the bit again).
  if (tensors.size() == 1 && plain_tensor(first) && !copy) {
    in.buffer = first;
  } else if (as_blocks && !copy && std::all_of(tensors.begin(), tensors.end(), plain_tensor)) {
    in.buffer = first;
    in.blocks = tensors;
  } else {
    // Only allocated here: the caller's tensors are read when the stage runs.
    in.buffer = stand_in(total, first.options());
    in.fill = [buffer = in.buffer, tensors] {
      at::NoGradGuard no_grad;
      int64_t offset = 0;
      for (const at::Tensor& t : tensors) {
        buffer.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
        offset += t.numel();
      }
    };
    // A private copy of a plain tensor leaves the caller's as it is.
    if (!(tensors.size() == 1 && plain_tensor(first))) in.users = tensors;
  }
  in.dtype = in.buffer.scalar_type();
  in.numel = in.blocks.empty() ? in.buffer.numel() : total;
  if (in.buffer.is_complex()) {
    in.dtype = c10::toRealValueType(in.dtype);
    in.numel *= 2;
  }
  return in;
}

ReduceInput prepare_reduce_input(const std::vector<at::Tensor>& tensors, RedOp op, const char* kind, bool copy,
                                 bool as_blocks) {
  ReduceInput in = prepare_input(tensors, kind, copy, as_blocks);
  TORCH_CHECK(!in.buffer.is_complex() || op == RedOp::kSum || op == RedOp::kAvg, "fairring: ", kind,
              " of complex tensors supports SUM and AVG only, got ", redop_name(op));
  const std::string why = reduce_unsupported_reason(in.dtype, op);
  TORCH_CHECK(why.empty(), "fairring: ", kind, (tensors[0].is_cuda() ? " of a CUDA tensor" : ""), ": ", why);
  return in;
}

// The op's stage (pipeline_op.h): the input copied into the buffer, then
// scaled there (PREMUL_SUM's factor, a lone rank's AVG share; the caller's
// own tensor when it is the buffer).
std::function<void()> stage_of(const ReduceInput& in, std::function<void(at::Tensor&)> scale) {
  if (!scale) return in.fill;
  return [fill = in.fill, scale = std::move(scale), buffer = in.buffer]() mutable {
    if (fill) fill();
    scale(buffer);
  };
}

}  // namespace fairring
