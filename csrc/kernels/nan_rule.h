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

FAIRRING_HOST_DEVICE inline uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
FAIRRING_HOST_DEVICE inline uint64_t bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof(u));
  return u;
}
FAIRRING_HOST_DEVICE inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}
FAIRRING_HOST_DEVICE inline double double_of(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof(d));
  return d;
}

FAIRRING_HOST_DEVICE inline float quiet(float f) { return float_of(bits(f) | 0x00400000u); }
FAIRRING_HOST_DEVICE inline double quiet(double d) { return double_of(bits(d) | 0x0008000000000000ull); }
FAIRRING_HOST_DEVICE inline float default_nan(float) { return float_of(0xFFC00000u); }
FAIRRING_HOST_DEVICE inline double default_nan(double) { return double_of(0xFFF8000000000000ull); }

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
