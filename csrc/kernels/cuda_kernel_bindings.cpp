// Python hooks for the CUDA reduction kernels (fairring_py._C._reduce_cuda_for_test)
// and the build flag fairring_py._C._built_with_cuda().  Compiled in every
// build; without CUDA the test hook raises.

#include <torch/extension.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "common/reduce_op.h"
#include "kernels/reduce_cpu.h"

#ifdef FAIRRING_WITH_CUDA
#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/reduce_cuda.h"
#endif

namespace fairring {

void register_cuda_kernel_bindings(pybind11::module& m);

namespace {

#ifdef FAIRRING_WITH_CUDA
RedOp parse_op_name(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (RedOp op : {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin, RedOp::kMax, RedOp::kBand,
                   RedOp::kBor, RedOp::kBxor}) {
    if (upper == redop_name(op)) return op;
  }
  TORCH_CHECK_VALUE(false, "unknown reduction op '", name,
                    "' (expected one of SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)");
}

void reduce_cuda_for_test(at::Tensor out, const std::vector<at::Tensor>& inputs, const std::string& op_name,
                          int64_t divisor) {
  const RedOp op = parse_op_name(op_name);
  TORCH_CHECK_VALUE(!inputs.empty() && inputs.size() <= static_cast<size_t>(kMaxCudaReduceInputs),
                    "_reduce_cuda_for_test takes 1 to ", kMaxCudaReduceInputs, " input tensors, got ",
                    inputs.size());
  TORCH_CHECK_VALUE(out.defined() && out.is_cuda(), "out must be a CUDA tensor");
  TORCH_CHECK_VALUE(out.is_contiguous(), "out must be contiguous");
  const std::string why = reduce_unsupported_reason(out.scalar_type(), op);
  TORCH_CHECK_VALUE(why.empty(), why);
  TORCH_CHECK_VALUE(divisor <= 0 || at::isFloatingType(out.scalar_type()), "a divisor only applies to "
                    "floating-point tensors, got ", out.scalar_type());
  std::vector<const void*> ptrs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    TORCH_CHECK_VALUE(t.defined() && t.device() == out.device(), "inputs[", i, "] must be on ", out.device());
    TORCH_CHECK_VALUE(t.is_contiguous(), "inputs[", i, "] must be contiguous");
    TORCH_CHECK_VALUE(t.scalar_type() == out.scalar_type() && t.numel() == out.numel(), "inputs[", i,
                      "] must have out's dtype and size");
    TORCH_CHECK_VALUE(at::get_overlap_status(out, t) != at::MemOverlapStatus::Partial, "out partially overlaps inputs[",
                      i, "]");
    ptrs.push_back(t.data_ptr());
  }
  c10::cuda::CUDAGuard guard(out.device());
  reduce_cuda(out.scalar_type(), op, out.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()), out.numel(),
              divisor, c10::cuda::getCurrentCUDAStream(out.device().index()).stream());
}
#endif

}  // namespace

void register_cuda_kernel_bindings(pybind11::module& m) {
  m.def(
      "_built_with_cuda",
      [] {
#ifdef FAIRRING_WITH_CUDA
        return true;
#else
        return false;
#endif
      },
      "True if this extension was compiled with its CUDA kernels and CUDA all-reduce.");
#ifdef FAIRRING_WITH_CUDA
  m.def("_reduce_cuda_for_test", &reduce_cuda_for_test, pybind11::arg("out"), pybind11::arg("inputs"),
        pybind11::arg("op"), pybind11::arg("divisor") = 0,
        "Test hook: out = inputs[0] (op) inputs[1] (op) ... with the CUDA reduction kernel on the current "
        "stream, then divided by `divisor` if > 0. Contiguous CUDA tensors of one dtype, size and device.");
#else
  m.def(
      "_reduce_cuda_for_test",
      [](pybind11::args, pybind11::kwargs) {
        TORCH_CHECK(false, "fairring_py._C was built without CUDA (rebuild with FAIRRING_BUILD_CUDA=1 "
                           "against a CUDA torch)");
      },
      "Unavailable: this build has no CUDA kernels.");
#endif
}

}  // namespace fairring
