// The AVX2 (+FMA+F16C) build of the reduction kernels, chosen at run time by
// reduce_cpu when the CPU supports it.  The kernels are the same plain C++
// loops as the baseline build (reduce_impl.h), compiled here for 256-bit
// vectors; they give bit-identical results.

#include "kernels/reduce_cpu_internal.h"

#if FAIRRING_HAVE_AVX2_KERNELS

// Everything the kernel code needs is included *before* the target switch, so
// that only the functions defined below are compiled for AVX2.
#include <c10/core/ScalarType.h>
#include <immintrin.h>

#include <cmath>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/reduce_op.h"
#include "kernels/host_device.h"
#include "kernels/nan_rule.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

// Lets float16 use the F16C conversion instructions (see HalfCvt).
#define FAIRRING_REDUCE_IMPL_F16C 1
namespace fairring {
namespace kernels_avx2 {
#include "kernels/reduce_impl.h"
#include "kernels/convert_impl.h"
}  // namespace kernels_avx2
}  // namespace fairring
#undef FAIRRING_REDUCE_IMPL_F16C

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // FAIRRING_HAVE_AVX2_KERNELS
