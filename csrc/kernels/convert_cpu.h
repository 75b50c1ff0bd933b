// Conversions between the input dtype and a 16-bit wire format, for
// compressed rails (rails/wire_codec).  Vectorised, chosen at run time
// with the reduction kernels' instruction set (reduce_cpu_isa); every variant
// gives the same bits.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "kernels/wire_format.h"  // HalfFormat

namespace fairring {

// dst[i] = round_to_nearest_even(src[i] * 2^scale_exp) in `fmt`.  `src` is
// float32 or float64 (float64 is rounded once, correctly: no double
// rounding).  NaN stays NaN (canonical quiet NaN with its sign, as c10 does:
// bfloat16 0x7FC0, float16 0x7E00|sign), infinities stay infinities, values
// beyond the format's range become infinities.
void narrow_cpu(c10::ScalarType src_dtype, HalfFormat fmt, const void* src, uint16_t* dst, int64_t n, int scale_exp);

// dst[i] = src[i] * 2^-scale_exp, exact (the widening is exact, and so is the
// power-of-two scale unless the result leaves the destination's range).
void widen_cpu(c10::ScalarType dst_dtype, HalfFormat fmt, const uint16_t* src, void* dst, int64_t n, int scale_exp);

// max |src[i]| over the finite elements, 0 if there are none.
double max_abs_finite_cpu(c10::ScalarType dtype, const void* src, int64_t n);

}  // namespace fairring
