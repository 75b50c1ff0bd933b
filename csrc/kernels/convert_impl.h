// The wire conversions of compressed rails (rails/wire_codec): float32 /
// float64 <-> bfloat16 / float16, with a power-of-two scale for float16.
//
// NOT a normal header, like reduce_impl.h: a translation unit includes it
// inside its own namespace right after reduce_impl.h (whose detail::
// conversions it reuses), so that the baseline and the AVX2 builds each get
// their own copy.  It defines, in the enclosing namespace, narrow_impl,
// widen_impl and max_abs_impl (see kernels/convert_cpu.h for what they do).
//
// Every variant gives the same bits: float32 -> half rounds to nearest even
// (detail::f32_to_bf16 / f32_to_f16, or F16C through detail::f16c_store,
// which canonicalises NaNs the same way); the scale is a power of two, so
// multiplying by it is exact wherever it matters (see convert_cpu.h).

namespace convert_detail {

// float64 -> float32 rounded to odd (truncate, then set the last bit if
// anything was dropped).  Rounding that to a format with at least two fewer
// significand bits to nearest even gives the correctly rounded result: no
// double rounding.
inline float f64_to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (!(f == f)) return f;  // NaN
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) {
    f = std::nextafter(f, 0.0f);
  }
  if (static_cast<double>(f) != d) {
    uint32_t u = detail::f32_bits(f);
    u |= 1u;
    f = detail::f32_from_bits(u);
  }
  return f;
}

}  // namespace convert_detail

// dst[i] = round(src[i] * scale) in the wire format (fp16: float16, else bfloat16).
inline void narrow_f32_impl(uint16_t* dst, const float* src, int64_t n, bool fp16, float scale) {
  if (!fp16) {
    for (int64_t j = 0; j < n; ++j) dst[j] = detail::f32_to_bf16(src[j] * scale);
    return;
  }
  int64_t j = 0;
#if defined(FAIRRING_REDUCE_IMPL_F16C)
  const __m256 vs = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8) detail::f16c_store(dst + j, _mm256_mul_ps(_mm256_loadu_ps(src + j), vs));
#endif
  for (; j < n; ++j) dst[j] = detail::f32_to_f16(src[j] * scale);
}

// dst[i] = widen(src[i]) * inv_scale.
inline void widen_f32_impl(float* dst, const uint16_t* src, int64_t n, bool fp16, float inv_scale) {
  if (!fp16) {
    for (int64_t j = 0; j < n; ++j) dst[j] = detail::bf16_to_f32(src[j]) * inv_scale;
    return;
  }
  int64_t j = 0;
#if defined(FAIRRING_REDUCE_IMPL_F16C)
  const __m256 vs = _mm256_set1_ps(inv_scale);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dst + j, _mm256_mul_ps(detail::f16c_load(src + j), vs));
#endif
  for (; j < n; ++j) dst[j] = detail::f16_to_f32(src[j]) * inv_scale;
}

inline void narrow_f64_impl(uint16_t* dst, const double* src, int64_t n, bool fp16, double scale) {
  for (int64_t j = 0; j < n; ++j) {
    const float f = convert_detail::f64_to_f32_odd(src[j] * scale);
    dst[j] = fp16 ? detail::f32_to_f16(f) : detail::f32_to_bf16(f);
  }
}

inline void widen_f64_impl(double* dst, const uint16_t* src, int64_t n, bool fp16, double inv_scale) {
  for (int64_t j = 0; j < n; ++j) {
    dst[j] = static_cast<double>(fp16 ? detail::f16_to_f32(src[j]) : detail::bf16_to_f32(src[j])) * inv_scale;
  }
}

// The largest |x| over the finite elements (0 if none).  On the bits: for
// non-negative floats the integer order is the numeric order, and an integer
// max reduction vectorises without -ffast-math (a float one does not).
inline double max_abs_f32_impl(const float* src, int64_t n) {
  uint32_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t a = detail::f32_bits(src[j]) & 0x7FFFFFFFu;
    const uint32_t finite = a < 0x7F800000u ? a : 0u;
    m = finite > m ? finite : m;
  }
  return detail::f32_from_bits(m);
}

inline double max_abs_f64_impl(const double* src, int64_t n) {
  uint64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint64_t a;
    __builtin_memcpy(&a, src + j, sizeof(a));
    a &= 0x7FFFFFFFFFFFFFFFull;
    const uint64_t finite = a < 0x7FF0000000000000ull ? a : 0u;
    m = finite > m ? finite : m;
  }
  double d;
  __builtin_memcpy(&d, &m, sizeof(d));
  return d;
}

// The entry points (not inline: kernels/convert_cpu's dispatch calls them).
void narrow_impl(c10::ScalarType src_dtype, bool fp16, const void* src, uint16_t* dst, int64_t n, int scale_exp) {
  if (src_dtype == c10::ScalarType::Double) {
    narrow_f64_impl(dst, static_cast<const double*>(src), n, fp16, std::ldexp(1.0, scale_exp));
  } else {
    narrow_f32_impl(dst, static_cast<const float*>(src), n, fp16, std::ldexp(1.0f, scale_exp));
  }
}

void widen_impl(c10::ScalarType dst_dtype, bool fp16, const uint16_t* src, void* dst, int64_t n, int scale_exp) {
  if (dst_dtype == c10::ScalarType::Double) {
    widen_f64_impl(static_cast<double*>(dst), src, n, fp16, std::ldexp(1.0, -scale_exp));
  } else {
    widen_f32_impl(static_cast<float*>(dst), src, n, fp16, std::ldexp(1.0f, -scale_exp));
  }
}

double max_abs_impl(c10::ScalarType dtype, const void* src, int64_t n) {
  return dtype == c10::ScalarType::Double ? max_abs_f64_impl(static_cast<const double*>(src), n)
                                          : max_abs_f32_impl(static_cast<const float*>(src), n);
}
