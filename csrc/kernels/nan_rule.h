// Which NaN a floating-point sum, product or division returns: the rule of
// x86's SSE/AVX arithmetic, which the CPU kernels get from the hardware and
// the CUDA kernels apply by hand (a GPU returns one canonical NaN, 0x7FFFFFFF,
// for every NaN result), so that both give the same bits:
//   - an operand that is a NaN: that NaN made quiet, sign and payload kept;
//     the second operand's if both are (the CPU kernels combine in input
//     order, acc = acc op in[i], and the compiled code has in[i] as the
//     instruction's first source; tests/test_kernels.py pins it);
//   - an invalid operation on numbers (inf - inf, 0 x inf): x86's "default
//     NaN", which is negative: 0xFFC00000 / 0xFFF8000000000000.
// Half-precision results are computed in float32 and then rounded, which
// keeps the NaN's sign (0x7E00 or 0xFE00).  Header-only, for host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace fairring {
namespace nan_rule {

// The same bits as another type of the same width (memcpy: host and device).
template <typename To, typename From>
FAIRRING_HOST_DEVICE inline To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different widths");
  To to;
  memcpy(&to, &from, sizeof(to));
  return to;
}

FAIRRING_HOST_DEVICE inline float quiet(float f) { return bit_cast<float>(bit_cast<uint32_t>(f) | 0x00400000u); }
FAIRRING_HOST_DEVICE inline double quiet(double d) {
  return bit_cast<double>(bit_cast<uint64_t>(d) | 0x0008000000000000ull);
}
FAIRRING_HOST_DEVICE inline float default_nan(float) { return bit_cast<float>(0xFFC00000u); }
FAIRRING_HOST_DEVICE inline double default_nan(double) { return bit_cast<double>(0xFFF8000000000000ull); }

// `r`: the IEEE result of `a` op `b` as some hardware computed it (its NaN
// may be anything).  Returns `r`, or, if it is a NaN, the NaN x86 returns.
template <typename T>
FAIRRING_HOST_DEVICE inline T like_x86(T a, T b, T r) {
  if (r == r) return r;
  if (b != b) return quiet(b);
  if (a != a) return quiet(a);
  return default_nan(a);
}

}  // namespace nan_rule
}  // namespace fairring
