// Python hooks for the CUDA kernels (fairring_py._C._reduce_cuda_for_test, the
// wire conversions _wire_*_cuda_for_test) and the build flag
// fairring_py._C._built_with_cuda().  Compiled in every build; without CUDA
// the test hooks raise.

#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "common/reduce_op.h"
#include "kernels/reduce_cpu.h"
#include "testing/hook_args.h"

#ifdef FAIRRING_WITH_CUDA
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "rails/wire_codec.h"
#include "kernels/convert_cuda.h"
#include "kernels/reduce_cuda.h"
#include "transport/nccl_rail.h"
#endif

namespace fairring {

void register_cuda_kernel_bindings(pybind11::module& m);

namespace {

#ifdef FAIRRING_WITH_CUDA
void reduce_cuda_for_test(at::Tensor out, const std::vector<at::Tensor>& inputs, const std::string& op_name,
                          int64_t divisor) {
  const RedOp op = parse_redop(op_name);
  TORCH_CHECK_VALUE(!inputs.empty() && inputs.size() <= static_cast<size_t>(kMaxCudaReduceInputs),
                    "_reduce_cuda_for_test takes 1 to ", kMaxCudaReduceInputs, " input tensors, got ", inputs.size());
  TORCH_CHECK_VALUE(out.defined() && out.is_cuda(), "out must be a CUDA tensor");
  TORCH_CHECK_VALUE(out.is_contiguous(), "out must be contiguous");
  const std::string why = reduce_unsupported_reason(out.scalar_type(), op);
  TORCH_CHECK_VALUE(why.empty(), why);
  TORCH_CHECK_VALUE(divisor <= 0 || at::isFloatingType(out.scalar_type()),
                    "a divisor only applies to "
                    "floating-point tensors, got ",
                    out.scalar_type());
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
  reduce_cuda(out.scalar_type(), op, out.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()), out.numel(), divisor,
              c10::cuda::getCurrentCUDAStream(out.device().index()).stream());
}

// The wire conversions (kernels/convert_cuda.h) on the current stream, with
// the CPU hooks' arguments (kernel_bindings.cpp), so that tests compare bits.
void check_wire_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined() && t.is_cuda() && t.is_contiguous(), what, " must be a contiguous CUDA tensor");
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

at::Tensor wire_narrow_cuda_for_test(const at::Tensor& src, const std::string& fmt, int64_t scale_exp) {
  check_wire_tensor(src, "src");
  const HalfFormat f = parse_half_format(fmt);
  c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out = at::empty({src.numel()}, src.options().dtype(at::kShort));
  narrow_cuda(src.scalar_type(), f, src.data_ptr(), reinterpret_cast<uint16_t*>(out.data_ptr()), src.numel(),
              static_cast<int>(scale_exp), stream_of(src));
  return out;
}

at::Tensor wire_widen_cuda_for_test(const at::Tensor& src, const std::string& fmt, at::ScalarType dtype,
                                    int64_t scale_exp) {
  check_wire_tensor(src, "src");
  TORCH_CHECK_VALUE(src.scalar_type() == at::kShort, "src must be int16 (the wire bits)");
  const HalfFormat f = parse_half_format(fmt);
  c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out = at::empty({src.numel()}, src.options().dtype(dtype));
  widen_cuda(dtype, f, reinterpret_cast<const uint16_t*>(src.data_ptr()), out.data_ptr(), src.numel(),
             static_cast<int>(scale_exp), stream_of(src));
  return out;
}

at::Tensor wire_encode_cuda_for_test(const at::Tensor& src, const std::string& fmt) {
  check_wire_tensor(src, "src");
  const HalfFormat f = parse_half_format(fmt);
  c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out =
      at::empty({static_cast<int64_t>(WireCodec::message_bytes(src.numel()))}, src.options().dtype(at::kByte));
  wire_encode_cuda(f, src.scalar_type(), src.data_ptr(), src.numel(), out.data_ptr(), stream_of(src));
  return out;
}

at::Tensor wire_decode_cuda_for_test(const at::Tensor& msg, const std::string& fmt, at::ScalarType dtype) {
  check_wire_tensor(msg, "msg");
  TORCH_CHECK_VALUE(msg.scalar_type() == at::kByte && msg.numel() >= WireCodec::kPrefixBytes &&
                        (msg.numel() - WireCodec::kPrefixBytes) % 2 == 0,
                    "msg must be the uint8 bytes of a message (8 + 2 x count)");
  const HalfFormat f = parse_half_format(fmt);
  c10::cuda::CUDAGuard guard(msg.device());
  at::Tensor out = at::empty({(msg.numel() - WireCodec::kPrefixBytes) / 2}, msg.options().dtype(dtype));
  wire_decode_cuda(f, dtype, msg.data_ptr(), out.numel(), out.data_ptr(), stream_of(msg));
  return out;
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
  m.def("_wire_narrow_cuda_for_test", &wire_narrow_cuda_for_test, pybind11::arg("src"), pybind11::arg("fmt"),
        pybind11::arg("scale_exp") = 0, "Test hook: _wire_narrow_for_test with the CUDA kernel (CUDA tensors).");
  m.def("_wire_widen_cuda_for_test", &wire_widen_cuda_for_test, pybind11::arg("src"), pybind11::arg("fmt"),
        pybind11::arg("dtype"), pybind11::arg("scale_exp") = 0,
        "Test hook: _wire_widen_for_test with the CUDA kernel (CUDA tensors).");
  m.def("_wire_encode_cuda_for_test", &wire_encode_cuda_for_test, pybind11::arg("src"), pybind11::arg("fmt"),
        "Test hook: _wire_encode_for_test with the CUDA codec (the NCCL rail's): prefix computed on the device.");
  m.def("_wire_decode_cuda_for_test", &wire_decode_cuda_for_test, pybind11::arg("msg"), pybind11::arg("fmt"),
        pybind11::arg("dtype"), "Test hook: _wire_decode_for_test with the CUDA codec (a bad prefix gives NaNs).");
  m.def(
      "_nccl_environment_refusal_for_test",
      [](const std::optional<std::string>& comm_blocking) {
        return nccl_environment_refusal(comm_blocking ? comm_blocking->c_str() : nullptr);
      },
      pybind11::arg("comm_blocking"),
      "Test hook: the error the NCCL rail refuses to start with for this NCCL_COMM_BLOCKING (None: unset), "
      "or ''.");
#else
  for (const char* name :
       {"_reduce_cuda_for_test", "_wire_narrow_cuda_for_test", "_wire_widen_cuda_for_test",
        "_wire_encode_cuda_for_test", "_wire_decode_cuda_for_test", "_nccl_environment_refusal_for_test"}) {
    m.def(
        name,
        [](pybind11::args, pybind11::kwargs) {
          TORCH_CHECK(false,
                      "fairring_py._C was built without CUDA (rebuild with FAIRRING_BUILD_CUDA=1 "
                      "against a CUDA torch)");
        },
        "Unavailable: this build has no CUDA kernels.");
  }
#endif
}

}  // namespace fairring
