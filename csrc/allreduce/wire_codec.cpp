#include "allreduce/wire_codec.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "common/op_key.h"
#include "common/reduce_op.h"
#include "kernels/convert_cpu.h"

namespace fairring {

namespace {
constexpr uint32_t kTagBase = 0x57495200;  // "WIR" + the format

HalfFormat format_of(WireDtype w) { return w == WireDtype::kFp16 ? HalfFormat::kFloat16 : HalfFormat::kBFloat16; }

// fp16: e such that max * 2^e is in [2^14, 2^15) (largest finite half is
// 65504 < 2^16, so the rounded value cannot overflow either); clamped so
// that 2^e and 2^-e are normal float32 numbers.
int fp16_scale_exp(double max_abs) {
  if (!(max_abs > 0.0)) return 0;
  int exp2 = 0;
  std::frexp(max_abs, &exp2);  // max = m * 2^exp2, m in [0.5, 1): max in [2^(exp2-1), 2^exp2)
  const int e = 15 - exp2;
  return e < -120 ? -120 : (e > 120 ? 120 : e);
}
}  // namespace

WireDtype wire_dtype_from_name(const std::string& name) {
  if (name == "none") return WireDtype::kNone;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "fp16") return WireDtype::kFp16;
  throw std::invalid_argument("FAIRRING_WIRE_DTYPE must be none, bf16 or fp16, got " + name);
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
  const Collective c = static_cast<Collective>(t.key.collective);
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}

void WireCodec::encode(c10::ScalarType dtype, const void* src, int64_t count, char* dst) const {
  const int32_t e = w_ == WireDtype::kFp16 ? fp16_scale_exp(max_abs_finite_cpu(dtype, src, count)) : 0;
  const uint32_t tag = kTagBase | static_cast<uint32_t>(w_);
  std::memcpy(dst, &tag, 4);
  std::memcpy(dst + 4, &e, 4);
  narrow_cpu(dtype, format_of(w_), src, reinterpret_cast<uint16_t*>(dst + kPrefixBytes), count, e);
}

void WireCodec::decode(c10::ScalarType dtype, const char* src, int64_t count, void* dst) const {
  uint32_t tag;
  int32_t e;
  std::memcpy(&tag, src, 4);
  std::memcpy(&e, src + 4, 4);
  if (tag != (kTagBase | static_cast<uint32_t>(w_)) || e < -120 || e > 120) {
    throw std::runtime_error(std::string("fairring: malformed compressed rail message (expected FAIRRING_WIRE_DTYPE=") +
                             wire_dtype_name(w_) + ")");
  }
  widen_cpu(dtype, format_of(w_), reinterpret_cast<const uint16_t*>(src + kPrefixBytes), dst, count, e);
}

}  // namespace fairring
