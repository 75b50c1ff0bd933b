// Internals of the CPU reduction: the per-instruction-set entry points and the
// runtime choice between them.  Not for use outside csrc/kernels (and tests).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "common/reduce_op.h"

// The AVX2 translation unit is only built for x86-64 with GCC or clang.
#if (defined(__x86_64__) || defined(__amd64__)) && (defined(__GNUC__) || defined(__clang__))
#define FAIRRING_HAVE_AVX2_KERNELS 1
#else
#define FAIRRING_HAVE_AVX2_KERNELS 0
#endif

namespace fairring {

// The entry points of one build of the kernels (reduce_impl.h, convert_impl.h),
// declared alike in each instruction set's namespace.
#define FAIRRING_CPU_KERNEL_ENTRY_POINTS                                                                            \
  void reduce_impl(c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int num_inputs,           \
                   int64_t count, int64_t divisor);                                                                 \
  void narrow_impl(c10::ScalarType src_dtype, bool fp16, const void* src, uint16_t* dst, int64_t n, int scale_exp); \
  void widen_impl(c10::ScalarType dst_dtype, bool fp16, const uint16_t* src, void* dst, int64_t n, int scale_exp);  \
  double max_abs_impl(c10::ScalarType dtype, const void* src, int64_t n);

// Baseline build (whatever the compiler targets by default: SSE2 on x86-64).
namespace kernels_generic {
FAIRRING_CPU_KERNEL_ENTRY_POINTS
}  // namespace kernels_generic

#if FAIRRING_HAVE_AVX2_KERNELS
// Built with AVX2+FMA+F16C enabled; call only where the CPU has them.
namespace kernels_avx2 {
FAIRRING_CPU_KERNEL_ENTRY_POINTS
}  // namespace kernels_avx2
#endif

// The instruction set reduce_cpu currently uses: "avx2" or "generic".
const char* reduce_cpu_isa();

// Overrides the automatic choice (for tests and benchmarks): "generic",
// "avx2", or "auto" to go back to detection.  Throws if the name is unknown
// or the CPU / build lacks it.  All variants give bit-identical results.
void reduce_cpu_set_isa(const std::string& name);

}  // namespace fairring
