// Compressed rails (option wire_dtype): what a rail message of a floating
// SUM/AVG all-reduce or reduce-scatter looks like when it travels as bfloat16
// or float16 instead of its own dtype, and the conversions at either end.
//
// A compressed message is an 8-byte prefix (format tag, power-of-two scale
// exponent) followed by the elements in the wire format.  bf16: scale 0 (the
// range is float32's).  fp16: the sender picks the exponent e so that the
// largest finite |x| of the message times 2^e lies in [2^14, 2^15): nothing
// overflows, and small values keep their precision; the receiver multiplies
// by 2^-e.  (No fallback to bf16: a per-message scale always fits.)  The
// format's constants are in kernels/wire_format.h, shared with the CUDA
// codec (kernels/convert_cuda.h) of the NCCL rail.
//
// Which values are rounded (RailStage): each client's node-reduced piece,
// once, when it is sent; the server's own piece is not; the server sums the
// widened contributions in the input dtype, in node order, and rounds the
// sum once; everybody (the server too) widens those same bits.  A
// reduce-scatter's result stays with its server and is not rounded.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "plan/plan.h"
#include "kernels/wire_format.h"
#include "rails/rail_exchange.h"

namespace fairring {

enum class WireDtype : uint32_t { kNone = 0, kBf16 = 1, kFp16 = 2 };

// "none", "bf16", "fp16" (exactly these; options.py normalises); throws
// an Error of kind kInvalidArgument naming FAIRRING_WIRE_DTYPE otherwise.
WireDtype wire_dtype_from_name(const std::string& name);
const char* wire_dtype_name(WireDtype w);
// The 16-bit format of a wire dtype other than none.
HalfFormat half_format_of(WireDtype w);

// Host memory a RailStage allocates per slot for compressed rails (0 for
// "none"): to each node (and the server's result), from each other node's
// contribution and result.
int64_t wire_bytes_per_slot(const std::string& wire_dtype, int64_t max_shard_bytes, int num_nodes);

class WireCodec {
 public:
  static constexpr int64_t kPrefixBytes = wire::kPrefixBytes;

  explicit WireCodec(WireDtype w = WireDtype::kNone) : w_(w) {}
  WireDtype dtype() const { return w_; }

  // Whether this slice's rail messages are compressed: a wire dtype is set,
  // the tensor is float32 or float64, the op SUM or AVG, and the rail
  // pattern a reduction (an all-reduce's or a reduce-scatter's; shared
  // copies go exact).
  bool applies(const RailTask& t) const;

  // Bytes of the message for `count` elements.
  static uint64_t message_bytes(int64_t count) { return kPrefixBytes + 2 * static_cast<uint64_t>(count); }
  // A buffer that holds the message of any shard up to `max_shard_bytes` of
  // float32 (or float64).
  static int64_t buffer_bytes(int64_t max_shard_bytes) { return kPrefixBytes + max_shard_bytes / 2; }

  // Writes the message of `count` elements of `dtype` at `src` into `dst`
  // (message_bytes(count) bytes).
  void encode(c10::ScalarType dtype, const void* src, int64_t count, char* dst) const;
  // Widens the message at `src` into `count` elements of `dtype` at `dst`.
  // Throws if its prefix is not what this codec writes.
  void decode(c10::ScalarType dtype, const char* src, int64_t count, void* dst) const;

 private:
  WireDtype w_;
};

}  // namespace fairring
