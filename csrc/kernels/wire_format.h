// The format of a compressed rail message (option wire_dtype), shared by the
// host codec (rails/wire_codec.*, CPU kernels) and the CUDA one
// (kernels/convert_cuda.*), so that both write and read the same bytes:
//
//   [uint32 tag][int32 scale exponent e][count x uint16 elements]
//
// The elements are round_to_nearest_even(x * 2^e) in bfloat16 or float16.
// bf16: e = 0.  fp16: e is chosen from the message's largest finite |x| so
// that it lands in [2^14, 2^15) (fp16_scale_exp_for_exp2).  Plain C++ with
// host/device qualifiers under nvcc: no torch, no CUDA headers.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace fairring {

enum class HalfFormat { kBFloat16, kFloat16 };

namespace wire {

struct Prefix {
  uint32_t tag;
  int32_t scale_exp;
};
constexpr int64_t kPrefixBytes = 8;
static_assert(sizeof(Prefix) == kPrefixBytes, "the prefix is 8 bytes on the wire");

// "WIR" + the format (1 bf16, 2 fp16: WireDtype's values).
constexpr uint32_t kTagBase = 0x57495200;
FAIRRING_HOST_DEVICE constexpr uint32_t tag_of(HalfFormat f) {
  return kTagBase | (f == HalfFormat::kFloat16 ? 2u : 1u);
}

// |e| <= 120 keeps 2^e and 2^-e normal float32 numbers (exact scaling).
constexpr int kMaxScaleExp = 120;
// fp16: the largest finite |x| times 2^e lies in [2^(kFp16Top-1), 2^kFp16Top);
// fp16's largest finite value is 65504 < 2^16, so neither it nor its
// rounding overflows.
constexpr int kFp16Top = 15;

// The exponent e for a message whose largest finite |x| lies in
// [2^(exp2-1), 2^exp2) (frexp's exponent; the caller uses 0 when there is no
// nonzero finite value).
FAIRRING_HOST_DEVICE constexpr int fp16_scale_exp_for_exp2(int exp2) {
  return kFp16Top - exp2 < -kMaxScaleExp ? -kMaxScaleExp
                                         : (kFp16Top - exp2 > kMaxScaleExp ? kMaxScaleExp : kFp16Top - exp2);
}

// Whether a received prefix is one the codec of format `f` writes.
FAIRRING_HOST_DEVICE constexpr bool prefix_ok(Prefix p, HalfFormat f) {
  return p.tag == tag_of(f) && p.scale_exp >= -kMaxScaleExp && p.scale_exp <= kMaxScaleExp;
}

}  // namespace wire
}  // namespace fairring
