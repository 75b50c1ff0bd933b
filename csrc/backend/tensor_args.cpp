#include "backend/tensor_args.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/view_as_real.h>
#include <c10/util/Exception.h>

#include "common/dtype_name.h"

namespace fairring {

RedOp to_redop(const c10d::ReduceOp& op, c10::ScalarType dtype) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return RedOp::kSum;
    case c10d::ReduceOp::AVG:
      return RedOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return RedOp::kProduct;
    case c10d::ReduceOp::MIN:
      return RedOp::kMin;
    case c10d::ReduceOp::MAX:
      return RedOp::kMax;
    case c10d::ReduceOp::BAND:
      return RedOp::kBand;
    case c10d::ReduceOp::BOR:
      return RedOp::kBor;
    case c10d::ReduceOp::BXOR:
      return RedOp::kBxor;
    case c10d::ReduceOp::PREMUL_SUM:
      return RedOp::kSum;  // after premultiply()
    default:
      TORCH_CHECK(false, "fairring: unsupported ReduceOp ", static_cast<int>(op.op_), " (tensor of ", dtype_name(dtype),
                  ")");
  }
}

std::function<void(at::Tensor&)> premul_factor(const c10d::ReduceOp& op, c10::ScalarType dtype, const char* kind) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return nullptr;
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s, "fairring: ", kind, " with PREMUL_SUM but no factor");
  TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "fairring: ", kind,
              " with PREMUL_SUM needs floating-point tensors, got ", dtype_name(dtype));
  return [tensor_factor = s->tensor_factor, factor = s->double_factor](at::Tensor& t) {
    at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
    if (tensor_factor.defined()) {
      t.mul_(tensor_factor);
    } else {
      t.mul_(factor);
    }
  };
}

void check_splits(const std::vector<int64_t>& splits, const at::Tensor& t, int world, const char* which) {
  TORCH_CHECK(t.dim() > 0, "fairring: all_to_all_single needs tensors of at least one dimension, but the ", which,
              " is a scalar");
  if (splits.empty()) {
    TORCH_CHECK(t.size(0) % world == 0, "fairring: all_to_all_single without ", which, " splits cuts dim 0 into ",
                world, " equal blocks, but the ", which, " has ", t.size(0), " rows; give the splits");
    return;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == world, "fairring: all_to_all_single needs one ", which,
              " split per rank (", world, "), but got ", splits.size());
  // Each split at most what the rows left allow: a sum of huge splits
  // must not wrap around to the row count.
  int64_t left = t.size(0);
  for (size_t i = 0; i < splits.size(); ++i) {
    const int64_t n = splits[i];
    TORCH_CHECK(n >= 0, "fairring: all_to_all_single got a negative ", which, " split (", n, ")");
    TORCH_CHECK(n <= left, "fairring: all_to_all_single's ", which, " splits add up to more than the ", t.size(0),
                " rows of the ", which, " (split ", i, " is ", n, ")");
    left -= n;
  }
  TORCH_CHECK(left == 0, "fairring: all_to_all_single's ", which, " splits add up to ", t.size(0) - left,
              " rows, but the ", which, " has ", t.size(0));
}

int64_t check_outputs(const std::vector<at::Tensor>& outputs, c10::ScalarType dtype, const char* kind) {
  int64_t reals = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    TORCH_CHECK(t.scalar_type() == dtype, "fairring: ", kind, " needs outputs of the input's dtype (",
                dtype_name(dtype), "), but output ", i, " is ", dtype_name(t.scalar_type()));
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "fairring: ", kind,
                " into a tensor whose elements share memory (sizes ", t.sizes(), ", strides ", t.strides(),
                "): clone() it first");
    reals += reals_of(t);
  }
  return reals;
}

at::Tensor flat_reals(const at::Tensor& t) {
  at::Tensor f = t.reshape({-1});
  return f.is_complex() ? at::view_as_real(f).reshape({-1}) : f;
}

std::vector<at::Tensor> cut_blocks(const at::Tensor& flat, const int64_t* counts, int n) {
  std::vector<at::Tensor> out;
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    out.push_back(flat.narrow(0, at, counts[i]));
    at += counts[i];
  }
  return out;
}

std::vector<at::Tensor> both(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  std::vector<at::Tensor> all(a);
  all.insert(all.end(), b.begin(), b.end());
  return all;
}

Footprint read_only(const std::vector<at::Tensor>& ts) {
  Footprint fp;
  for (const at::Tensor& t : ts) fp.read(t);
  return fp;
}

}  // namespace fairring
