// What the backend makes of c10d's arguments before it runs an op: the
// reduction, PREMUL_SUM's factor, the memory a call touches (the order
// rule's footprint), an all-to-all's splits.  Pure: no group, no engine.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <vector>

#include "common/reduce_op.h"
#include "pipeline/pipeline_op.h"

namespace fairring {

RedOp to_redop(const c10d::ReduceOp& op, c10::ScalarType dtype);

// PREMUL_SUM is a SUM of every rank's tensors each multiplied by the op's
// factor first (as NCCL defines it).  Checks the op now and returns what
// scales a tensor in place; null for any other op.
std::function<void(at::Tensor&)> premul_factor(const c10d::ReduceOp& op, c10::ScalarType dtype, const char* kind);

// `splits` (rows of dim 0 per rank; none: as many each) must cut `t`
// exactly: gloo reads past a tensor they do not fit.  Throws what is wrong.
void check_splits(const std::vector<int64_t>& splits, const at::Tensor& t, int world, const char* which);

// Outputs a collective writes: each of the input's dtype, none whose
// elements share memory.  Returns their real elements (a complex one
// counts twice); throws what is wrong, naming the output.
int64_t check_outputs(const std::vector<at::Tensor>& outputs, c10::ScalarType dtype, const char* kind);

// The real elements of a tensor (a complex one counts twice: ops move and
// reduce its real and imaginary parts).
inline int64_t reals_of(const at::Tensor& t) { return t.numel() * (t.is_complex() ? 2 : 1); }

// `t` (contiguous) as a flat tensor of real elements, a view.
at::Tensor flat_reals(const at::Tensor& t);

// Views of `flat`, one per count (elements), in order: the blocks of a
// flattened list of unequal blocks.
std::vector<at::Tensor> cut_blocks(const at::Tensor& flat, const int64_t* counts, int n);

// The tensors of both lists, in order.
std::vector<at::Tensor> both(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

// What a send reads.
Footprint read_only(const std::vector<at::Tensor>& ts);

// Every tensor of a delegated call, as written (backend.h, run_delegated).
inline void touch(Footprint& fp, const at::Tensor& t) { fp.write(t); }
inline void touch(Footprint& fp, const std::vector<at::Tensor>& ts) {
  for (const at::Tensor& t : ts) fp.write(t);
}
inline void touch(Footprint& fp, const std::vector<std::vector<at::Tensor>>& tss) {
  for (const auto& ts : tss) touch(fp, ts);
}
template <typename... Groups>
Footprint touched(const Groups&... groups) {
  Footprint fp;
  (touch(fp, groups), ...);
  return fp;
}

}  // namespace fairring
