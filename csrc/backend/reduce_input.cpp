#include "backend/reduce_input.h"

#include <ATen/MemoryOverlap.h>

#include "common/dtype_name.h"
#include "kernels/reduce_cpu.h"

namespace fairring {

ReduceInput prepare_input(const std::vector<at::Tensor>& tensors, const char* kind) {
  TORCH_CHECK(!tensors.empty(), "fairring: ", kind, " got an empty list of tensors");
  const at::Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.scalar_type() == first.scalar_type() && t.device() == first.device(),
                "fairring: ", kind, " of several tensors needs one dtype and device, but tensor 0 is ",
                dtype_name(first.scalar_type()), " on ", first.device().str(), " and tensor ", i, " is ",
                dtype_name(t.scalar_type()), " on ", t.device().str());
    // The result would be written into one element several times, once
    // per alias, with no single right answer.
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "fairring: ", kind, " of a tensor whose ",
                "elements share memory (an expanded or overlapping view, e.g. stride 0; sizes ", t.sizes(),
                ", strides ", t.strides(), "): clone() it first");
  }
  ReduceInput in;
  // A tensor with the conjugate or negative bit set holds its values
  // transformed in memory: reduce a resolved copy, and copy back through
  // the view (copy_ applies the bit again).
  const auto plain = [](const at::Tensor& t) { return !t.is_conj() && !t.is_neg() && t.is_contiguous(); };
  if (tensors.size() == 1 && plain(first)) {
    in.buffer = first;
  } else if (tensors.size() == 1) {
    in.buffer = first.resolve_conj().resolve_neg().contiguous();
    in.users = tensors;
  } else {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : tensors) flat.push_back(t.resolve_conj().resolve_neg().reshape({-1}));
    in.buffer = at::cat(flat);
    in.users = tensors;
  }
  in.dtype = in.buffer.scalar_type();
  in.numel = in.buffer.numel();
  if (in.buffer.is_complex()) {
    in.dtype = c10::toRealValueType(in.dtype);
    in.numel *= 2;
  }
  return in;
}

ReduceInput prepare_reduce_input(const std::vector<at::Tensor>& tensors, RedOp op, const char* kind) {
  ReduceInput in = prepare_input(tensors, kind);
  TORCH_CHECK(!in.buffer.is_complex() || op == RedOp::kSum || op == RedOp::kAvg, "fairring: ", kind,
              " of complex tensors supports SUM and AVG only, got ", redop_name(op));
  const std::string why = reduce_unsupported_reason(in.dtype, op);
  TORCH_CHECK(why.empty(), "fairring: ", kind, (tensors[0].is_cuda() ? " of a CUDA tensor" : ""), ": ", why);
  return in;
}

}  // namespace fairring
