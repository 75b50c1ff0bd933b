#include "rails/wire_codec.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "common/op_key.h"
#include "common/reduce_op.h"
#include "kernels/convert_cpu.h"
#include "common/error.h"

namespace fairring {

namespace {
// fp16's scale (kernels/wire_format.h; the CUDA codec finds the same exponent
// from the bits of the maximum).
int fp16_scale_exp(double max_abs) {
  if (!(max_abs > 0.0)) return 0;
  int exp2 = 0;
  std::frexp(max_abs, &exp2);  // max = m * 2^exp2, m in [0.5, 1): max in [2^(exp2-1), 2^exp2)
  return wire::fp16_scale_exp_for_exp2(exp2);
}
}  // namespace

HalfFormat half_format_of(WireDtype w) { return w == WireDtype::kFp16 ? HalfFormat::kFloat16 : HalfFormat::kBFloat16; }

WireDtype wire_dtype_from_name(const std::string& name) {
  if (name == "none") return WireDtype::kNone;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "fp16") return WireDtype::kFp16;
  throw Error(ErrorKind::kInvalidArgument, "FAIRRING_WIRE_DTYPE must be none, bf16 or fp16, got " + name);
}

const char* wire_dtype_name(WireDtype w) {
  switch (w) {
    case WireDtype::kBf16:
      return "bf16";
    case WireDtype::kFp16:
      return "fp16";
    case WireDtype::kNone:
      break;
  }
  return "none";
}

int64_t wire_bytes_per_slot(const std::string& wire_dtype, int64_t max_shard_bytes, int num_nodes) {
  if (wire_dtype == "none" || num_nodes < 2) return 0;
  return (3 * static_cast<int64_t>(num_nodes) - 2) * WireCodec::buffer_bytes(max_shard_bytes);
}

bool WireCodec::applies(const RailTask& t) const {
  if (w_ == WireDtype::kNone) return false;
  const c10::ScalarType d = t.dtype();
  if (d != c10::ScalarType::Float && d != c10::ScalarType::Double) return false;
  if (t.op() != RedOp::kSum && t.op() != RedOp::kAvg) return false;
  return t.pattern == RailPattern::kReduce;  // values that are summed, not copies
}

void WireCodec::encode(c10::ScalarType dtype, const void* src, int64_t count, char* dst) const {
  const wire::Prefix p{wire::tag_of(half_format_of(w_)),
                       w_ == WireDtype::kFp16 ? fp16_scale_exp(max_abs_finite_cpu(dtype, src, count)) : 0};
  std::memcpy(dst, &p, sizeof(p));
  narrow_cpu(dtype, half_format_of(w_), src, reinterpret_cast<uint16_t*>(dst + kPrefixBytes), count, p.scale_exp);
}

void WireCodec::decode(c10::ScalarType dtype, const char* src, int64_t count, void* dst) const {
  wire::Prefix p;
  std::memcpy(&p, src, sizeof(p));
  if (!wire::prefix_ok(p, half_format_of(w_))) {
    throw Error(ErrorKind::kBackend,
                std::string("fairring: malformed compressed rail message (expected FAIRRING_WIRE_DTYPE=") +
                    wire_dtype_name(w_) + ")");
  }
  widen_cpu(dtype, half_format_of(w_), reinterpret_cast<const uint16_t*>(src + kPrefixBytes), dst, count, p.scale_exp);
}

}  // namespace fairring
