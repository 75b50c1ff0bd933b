// CPU multi-input reduction: validation, the dtype/op support matrix, the
// runtime choice of instruction set, and the baseline build of the kernels.

#include "kernels/reduce_cpu.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "common/dtype_name.h"
#include "common/reduce_op.h"
#include "kernels/host_device.h"
#include "kernels/nan_rule.h"
#include "kernels/convert_cpu.h"
#include "kernels/reduce_cpu_internal.h"

// The baseline instantiation of the kernels (see reduce_impl.h).
namespace fairring {
namespace kernels_generic {
#include "kernels/reduce_impl.h"
#include "kernels/convert_impl.h"
}  // namespace kernels_generic
}  // namespace fairring

namespace fairring {
namespace {

enum class Kind { kUnsupported, kFloating, kInteger, kBool };

Kind kind_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16:
      return Kind::kFloating;
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Short:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
      return Kind::kInteger;
    case c10::ScalarType::Bool:
      return Kind::kBool;
    default:
      return Kind::kUnsupported;
  }
}

bool op_known(RedOp op) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
    case RedOp::kProduct:
    case RedOp::kMin:
    case RedOp::kMax:
    case RedOp::kBand:
    case RedOp::kBor:
    case RedOp::kBxor:
      return true;
  }
  return false;
}

enum class Isa : int { kAuto = 0, kGeneric = 1, kAvx2 = 2 };

bool cpu_has_avx2() {
#if FAIRRING_HAVE_AVX2_KERNELS
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return has;
#else
  return false;
#endif
}

std::atomic<int> g_forced_isa{static_cast<int>(Isa::kAuto)};

Isa current_isa() {
  const Isa forced = static_cast<Isa>(g_forced_isa.load(std::memory_order_relaxed));
  if (forced != Isa::kAuto) {
    return forced;
  }
  return cpu_has_avx2() ? Isa::kAvx2 : Isa::kGeneric;
}

}  // namespace

std::string reduce_unsupported_reason(c10::ScalarType dtype, RedOp op) {
  if (!op_known(op)) {
    return "unknown reduction op " + std::to_string(static_cast<int32_t>(op));
  }
  const Kind kind = kind_of(dtype);
  if (kind == Kind::kUnsupported) {
    return std::string("dtype ") + dtype_name(dtype) + " is not supported by " + redop_name(op) +
           " (supported: float32, float64, float16, bfloat16, "
           "int8, uint8, int16, int32, int64, bool)";
  }
  if (op == RedOp::kAvg && kind != Kind::kFloating) {
    return "AVG is only defined for floating-point tensors, got " + dtype_name(dtype);
  }
  if ((op == RedOp::kBand || op == RedOp::kBor || op == RedOp::kBxor) && kind == Kind::kFloating) {
    return std::string(redop_name(op)) + " needs an integer or bool tensor, got " + dtype_name(dtype);
  }
  return std::string();
}

// The build of kernel entry point `fn` for the instruction set in use.
#if FAIRRING_HAVE_AVX2_KERNELS
#define FAIRRING_CALL_ISA(fn, ...) \
  (current_isa() == Isa::kAvx2 ? kernels_avx2::fn(__VA_ARGS__) : kernels_generic::fn(__VA_ARGS__))
#else
#define FAIRRING_CALL_ISA(fn, ...) kernels_generic::fn(__VA_ARGS__)
#endif

void reduce_cpu(c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int num_inputs, int64_t count,
                int64_t divisor) {
  const std::string reason = reduce_unsupported_reason(dtype, op);
  TORCH_CHECK(reason.empty(), reason);
  TORCH_CHECK(num_inputs >= 1, "reduce_cpu needs at least one input, got ", num_inputs);
  TORCH_CHECK(count >= 0, "reduce_cpu: negative element count ", count);
  TORCH_CHECK(divisor <= 0 || kind_of(dtype) == Kind::kFloating, "a divisor (", divisor,
              ") can only be applied to floating-point tensors, got ", dtype_name(dtype), " for ", redop_name(op));
  if (count == 0) {
    return;
  }
  TORCH_CHECK(out != nullptr && inputs != nullptr, "reduce_cpu: null buffer");
  for (int i = 0; i < num_inputs; ++i) {
    TORCH_CHECK(inputs[i] != nullptr, "reduce_cpu: input ", i, " is null");
  }

  // A single input without a divisor is a copy; keep its bits exactly (a
  // convert-and-round-back would canonicalise half-precision NaNs).
  if (num_inputs == 1 && divisor <= 0) {
    if (out != inputs[0]) {
      std::memmove(out, inputs[0], static_cast<size_t>(count) * c10::elementSize(dtype));
    }
    return;
  }

  FAIRRING_CALL_ISA(reduce_impl, dtype, op, out, inputs, num_inputs, count, divisor);
}

namespace {
void check_wire_dtype(c10::ScalarType t) {
  TORCH_CHECK(t == c10::ScalarType::Float || t == c10::ScalarType::Double,
              "wire conversion: float32 or float64 only, got ", dtype_name(t));
}
}  // namespace

void narrow_cpu(c10::ScalarType src_dtype, HalfFormat fmt, const void* src, uint16_t* dst, int64_t n, int scale_exp) {
  check_wire_dtype(src_dtype);
  const bool fp16 = fmt == HalfFormat::kFloat16;
  FAIRRING_CALL_ISA(narrow_impl, src_dtype, fp16, src, dst, n, scale_exp);
}

void widen_cpu(c10::ScalarType dst_dtype, HalfFormat fmt, const uint16_t* src, void* dst, int64_t n, int scale_exp) {
  check_wire_dtype(dst_dtype);
  const bool fp16 = fmt == HalfFormat::kFloat16;
  FAIRRING_CALL_ISA(widen_impl, dst_dtype, fp16, src, dst, n, scale_exp);
}

double max_abs_finite_cpu(c10::ScalarType dtype, const void* src, int64_t n) {
  check_wire_dtype(dtype);
  return FAIRRING_CALL_ISA(max_abs_impl, dtype, src, n);
}

const char* reduce_cpu_isa() { return current_isa() == Isa::kAvx2 ? "avx2" : "generic"; }

void reduce_cpu_set_isa(const std::string& name) {
  Isa isa;
  if (name == "auto") {
    isa = Isa::kAuto;
  } else if (name == "generic") {
    isa = Isa::kGeneric;
  } else if (name == "avx2") {
    TORCH_CHECK(FAIRRING_HAVE_AVX2_KERNELS && cpu_has_avx2(), "the AVX2 reduction kernels are not available on this ",
                FAIRRING_HAVE_AVX2_KERNELS ? "CPU" : "build");
    isa = Isa::kAvx2;
  } else {
    TORCH_CHECK(false, "unknown reduction ISA '", name, "' (expected auto, generic or avx2)");
  }
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace fairring
