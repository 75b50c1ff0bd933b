// Python test hooks for the CPU reduction kernels (fairring_py._C._reduce_*).

#include <torch/csrc/utils/pybind.h>

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "kernels/nan_rule.h"
#include "rails/wire_codec.h"
#include "common/reduce_op.h"
#include "kernels/convert_cpu.h"
#include "kernels/first_touch.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cpu_internal.h"
#include "testing/hook_args.h"

namespace fairring {

void register_kernel_bindings(pybind11::module& m);

RedOp parse_redop(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (RedOp op :
       {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin, RedOp::kMax, RedOp::kBand, RedOp::kBor, RedOp::kBxor}) {
    if (upper == redop_name(op)) {
      return op;
    }
  }
  TORCH_CHECK_VALUE(false, "unknown reduction op '", name,
                    "' (expected one of SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)");
}

HalfFormat parse_half_format(const std::string& name) {
  if (name == "bf16") return HalfFormat::kBFloat16;
  if (name == "fp16") return HalfFormat::kFloat16;
  TORCH_CHECK_VALUE(false, "unknown wire format '", name, "' (expected bf16 or fp16)");
}

namespace {

void check_tensor(const at::Tensor& t, const char* what, const at::Tensor& out) {
  TORCH_CHECK_VALUE(t.defined(), what, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), what, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK_VALUE(!t.is_sparse(), what, " must be a dense tensor");
  TORCH_CHECK_VALUE(t.is_contiguous(), what, " must be contiguous");
  TORCH_CHECK_VALUE(t.scalar_type() == out.scalar_type(), what, " has dtype ", t.scalar_type(), " but out has dtype ",
                    out.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == out.numel(), what, " has ", t.numel(), " elements but out has ", out.numel());
}

void reduce_for_test(at::Tensor out, const std::vector<at::Tensor>& inputs, const std::string& op_name,
                     int64_t divisor) {
  const RedOp op = parse_redop(op_name);
  TORCH_CHECK_VALUE(!inputs.empty(), "_reduce_for_test needs at least one input tensor");
  check_tensor(out, "out", out);
  std::vector<const void*> ptrs;
  ptrs.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string what = "inputs[" + std::to_string(i) + "]";
    check_tensor(inputs[i], what.c_str(), out);
    // `out` may be exactly one of the inputs, but must not partially overlap.
    TORCH_CHECK_VALUE(at::get_overlap_status(out, inputs[i]) != at::MemOverlapStatus::Partial,
                      "out partially overlaps ", what);
    ptrs.push_back(inputs[i].data_ptr());
  }
  void* out_ptr = out.data_ptr();
  const int64_t count = out.numel();
  const c10::ScalarType dtype = out.scalar_type();
  {
    pybind11::gil_scoped_release no_gil;
    reduce_cpu(dtype, op, out_ptr, ptrs.data(), static_cast<int>(ptrs.size()), count, divisor);
  }
}

// What the CUDA kernel computes for float32/float64 SUM and PRODUCT (then
// AVG's division), on the host: each step's IEEE result with a GPU's NaN
// (one canonical NaN for every NaN result), then nan_rule::like_x86, as
// reduce_cuda.cu does.  The tests compare it with the CPU kernel.
template <typename T, typename U>
void device_nan_rule(T* out, const std::vector<const T*>& in, int64_t count, bool product, int64_t divisor,
                     U canonical) {
  auto gpu = [&](T r) { return r == r ? r : nan_rule::bit_cast<T>(canonical); };
  for (int64_t e = 0; e < count; ++e) {
    T acc = in[0][e];
    for (size_t i = 1; i < in.size(); ++i) {
      const T x = in[i][e];
      acc = nan_rule::like_x86(acc, x, gpu(product ? acc * x : acc + x));
    }
    if (divisor > 0) {
      const T d = static_cast<T>(divisor);
      acc = nan_rule::like_x86(acc, d, gpu(acc / d));
    }
    out[e] = acc;
  }
}

at::Tensor device_nan_rule_for_test(const std::vector<at::Tensor>& inputs, const std::string& op_name,
                                    int64_t divisor) {
  TORCH_CHECK_VALUE(!inputs.empty(), "_device_nan_rule_for_test needs at least one input tensor");
  const RedOp op = parse_redop(op_name);
  TORCH_CHECK_VALUE(op == RedOp::kSum || op == RedOp::kProduct, "_device_nan_rule_for_test: sum or product");
  at::Tensor out = at::empty_like(inputs[0]);
  for (const auto& t : inputs) check_tensor(t, "input", out);
  const int64_t count = out.numel();
  const bool product = op == RedOp::kProduct;
  // `canonical`: a GPU's NaN, in the bits of T.
  auto run = [&](auto zero, auto canonical) {
    using T = decltype(zero);
    std::vector<const T*> in;
    for (const auto& t : inputs) in.push_back(t.data_ptr<T>());
    device_nan_rule(out.data_ptr<T>(), in, count, product, divisor, canonical);
  };
  if (out.scalar_type() == at::kFloat) {
    run(float{}, uint32_t{0x7FFFFFFFu});
  } else if (out.scalar_type() == at::kDouble) {
    run(double{}, uint64_t{0x7FFFFFFFFFFFFFFFull});
  } else {
    TORCH_CHECK_VALUE(false, "_device_nan_rule_for_test: float32 or float64");
  }
  return out;
}

at::Tensor wire_narrow_for_test(const at::Tensor& src, const std::string& fmt, int64_t scale_exp) {
  check_tensor(src, "src", src);
  const HalfFormat f = parse_half_format(fmt);
  at::Tensor out = at::empty({src.numel()}, src.options().dtype(at::kShort));
  pybind11::gil_scoped_release no_gil;
  narrow_cpu(src.scalar_type(), f, src.data_ptr(), reinterpret_cast<uint16_t*>(out.data_ptr()), src.numel(),
             static_cast<int>(scale_exp));
  return out;
}

at::Tensor wire_widen_for_test(const at::Tensor& src, const std::string& fmt, at::ScalarType dtype, int64_t scale_exp) {
  check_tensor(src, "src", src);
  TORCH_CHECK_VALUE(src.scalar_type() == at::kShort, "src must be int16 (the wire bits)");
  const HalfFormat f = parse_half_format(fmt);
  at::Tensor out = at::empty({src.numel()}, src.options().dtype(dtype));
  pybind11::gil_scoped_release no_gil;
  widen_cpu(dtype, f, reinterpret_cast<const uint16_t*>(src.data_ptr()), out.data_ptr(), src.numel(),
            static_cast<int>(scale_exp));
  return out;
}

// The whole message (prefix and elements) as WireCodec writes it for the
// rails, as bytes (uint8).
void check_float(at::ScalarType dtype, const char* what) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble, what, " must be float32 or float64, got ", dtype);
}

at::Tensor wire_encode_for_test(const at::Tensor& src, const std::string& fmt) {
  check_tensor(src, "src", src);
  check_float(src.scalar_type(), "src");
  parse_half_format(fmt);
  const WireCodec codec(wire_dtype_from_name(fmt));
  const auto bytes = static_cast<int64_t>(WireCodec::message_bytes(src.numel()));
  at::Tensor out = at::empty({bytes}, src.options().dtype(at::kByte));
  pybind11::gil_scoped_release no_gil;
  codec.encode(src.scalar_type(), src.data_ptr(), src.numel(), reinterpret_cast<char*>(out.data_ptr()));
  return out;
}

at::Tensor wire_decode_for_test(const at::Tensor& msg, const std::string& fmt, at::ScalarType dtype) {
  check_tensor(msg, "msg", msg);
  TORCH_CHECK_VALUE(msg.scalar_type() == at::kByte && msg.numel() >= WireCodec::kPrefixBytes &&
                        (msg.numel() - WireCodec::kPrefixBytes) % 2 == 0,
                    "msg must be the uint8 bytes of a message (8 + 2 x count)");
  check_float(dtype, "dtype");
  parse_half_format(fmt);
  const WireCodec codec(wire_dtype_from_name(fmt));
  at::Tensor out = at::empty({(msg.numel() - WireCodec::kPrefixBytes) / 2}, msg.options().dtype(dtype));
  pybind11::gil_scoped_release no_gil;
  codec.decode(dtype, reinterpret_cast<const char*>(msg.data_ptr()), out.numel(), out.data_ptr());
  return out;
}

}  // namespace

void register_kernel_bindings(pybind11::module& m) {
  m.def(
      "_advise_fresh_memory_for_test",
      [](const at::Tensor& t) { return advise_fresh_memory(t.data_ptr(), static_cast<int64_t>(t.nbytes())); },
      "advise_fresh_memory (kernels/first_touch.h) on a CPU tensor's bytes; returns the bytes advised.");
  m.def(
      "_thp_mode", [] { return std::string(thp_mode()); },
      "The machine's transparent-huge-page mode as Fairring read it: always, madvise, never or unknown.");
  m.def("_reduce_for_test", &reduce_for_test, pybind11::arg("out"), pybind11::arg("inputs"), pybind11::arg("op"),
        pybind11::arg("divisor") = 0,
        "Test hook: out = inputs[0] (op) inputs[1] (op) ... with the CPU reduction "
        "kernel, then divided by `divisor` if it is > 0 (floating types only). All "
        "tensors must be contiguous CPU tensors of one dtype and size; out may be "
        "one of the inputs.");
  m.def("_device_nan_rule_for_test", &device_nan_rule_for_test, pybind11::arg("inputs"), pybind11::arg("op"),
        pybind11::arg("divisor") = 0,
        "Test hook: the CUDA kernel's float32/float64 sum or product (then division by `divisor` if > 0) as "
        "computed on a GPU (canonical NaNs) and corrected by kernels/nan_rule.h, on the host.");
  m.def("_wire_narrow_for_test", &wire_narrow_for_test, pybind11::arg("src"), pybind11::arg("fmt"),
        pybind11::arg("scale_exp") = 0,
        "Test hook: the wire bits (int16) of a contiguous float32/float64 CPU tensor times 2^scale_exp, "
        "in 'bf16' or 'fp16', with the rails' conversion kernel.");
  m.def("_wire_widen_for_test", &wire_widen_for_test, pybind11::arg("src"), pybind11::arg("fmt"),
        pybind11::arg("dtype"), pybind11::arg("scale_exp") = 0,
        "Test hook: int16 wire bits in 'bf16' or 'fp16' widened to `dtype` (float32/float64), times 2^-scale_exp.");
  m.def("_wire_encode_for_test", &wire_encode_for_test, pybind11::arg("src"), pybind11::arg("fmt"),
        "Test hook: the compressed rail message (8-byte prefix, then the elements) of a contiguous "
        "float32/float64 CPU tensor in 'bf16' or 'fp16', as uint8 bytes.");
  m.def("_wire_decode_for_test", &wire_decode_for_test, pybind11::arg("msg"), pybind11::arg("fmt"),
        pybind11::arg("dtype"), "Test hook: a message's (uint8) elements widened to `dtype` (float32/float64).");
  m.def(
      "_reduce_isa_for_test",
      [](const std::string& isa) -> std::string {
        if (!isa.empty()) {
          reduce_cpu_set_isa(isa);
        }
        return reduce_cpu_isa();
      },
      pybind11::arg("isa") = std::string(),
      "Test hook: returns the instruction set the CPU reduction uses ('avx2' or "
      "'generic'); a non-empty argument ('auto', 'generic', 'avx2') forces it first.");
}

}  // namespace fairring
