"""The CUDA wire codec's per-element steps (csrc/kernels/wire_elem_cuda.cuh),
compiled for the host against stand-ins for the CUDA intrinsics that behave as
the GPU's do where it matters here: arithmetic on a NaN returns the canonical
NaN 0x7FFFFFFF (x86 keeps the NaN's sign and payload), and __double2float_rz
rounds toward zero.  Compared bit for bit with the CPU codec's kernels, so that
what must make the NCCL rail's messages the TCP rails' bytes is checked where
there is no GPU.  This is a model of the GPU, not the GPU:
tests/test_gpu_kernels.py checks the real kernels on one.  Skipped without a
host C++ compiler."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import test_wire_dtype
from fairring_py import _C

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
SCALES = [0, -7, 5, 20, 120, -120]

# Host stand-ins for what the header uses of CUDA (found as <cuda_runtime.h>).
CUDA_STANDINS = r"""
#pragma once
#include <cfenv>
#include <cstdint>
#include <cstring>
#define __device__
#define __host__
#define __forceinline__ inline
enum cudaError_t { cudaSuccess = 0 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = 1; return cudaSuccess; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline long long __double_as_longlong(double d) { long long u; std::memcpy(&u, &d, 8); return u; }
inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
// GPU arithmetic: any NaN result is the canonical NaN.
inline float gpu_nan(float r) { return r != r ? __uint_as_float(0x7FFFFFFFu) : r; }
inline double gpu_nan(double r) { return r != r ? __longlong_as_double(0x7FFFFFFFFFFFFFFFll) : r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return gpu_nan(r); }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return gpu_nan(r); }
inline double __dmul_rn(double a, double b) { volatile double r = a * b; return gpu_nan(r); }
inline float __uint2float_rn(uint32_t m) { return static_cast<float>(m); }
inline float __double2float_rz(double d) {
  if (d != d) return __uint_as_float(0x7FFFFFFFu);
  const int old = std::fegetround();
  std::fesetround(FE_TOWARDZERO);
  volatile double in = d;
  volatile float f = static_cast<float>(in);
  std::fesetround(old);
  return f;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
"""

# Reads float32 bit patterns; writes, per format and scale: the narrowed bits
# of them as float32, as float64 and as float64 between float32 values, then
# every 16-bit pattern widened to float32 and float64; last, fp16's exponent
# for each as a message maximum (float32, and float64 times 2^-1000).
DRIVER = r"""
#include <cmath>
#include <cstdio>
#include <vector>
#include "kernels/wire_elem_cuda.cuh"
using namespace fairring::cuda_bits;
int main(int, char** argv) {
  std::vector<uint32_t> xs;
  FILE* in = std::fopen(argv[1], "rb");
  for (uint32_t v; std::fread(&v, 4, 1, in) == 1;) xs.push_back(v);
  std::fclose(in);
  FILE* out = std::fopen(argv[2], "wb");
  const int scales[] = {SCALES};
  for (int fp16 = 0; fp16 < 2; ++fp16) {
    for (int e : scales) {
      for (uint32_t b : xs) { uint16_t h = narrow_one(__uint_as_float(b), pow2<float>(e), fp16); std::fwrite(&h, 2, 1, out); }
      for (uint32_t b : xs) { uint16_t h = narrow_one(double(__uint_as_float(b)), pow2<double>(e), fp16); std::fwrite(&h, 2, 1, out); }
      for (uint32_t b : xs) {
        uint16_t h = narrow_one(double(__uint_as_float(b)) * (1 + std::ldexp(1.0, -30)), pow2<double>(e), fp16);
        std::fwrite(&h, 2, 1, out);
      }
      for (uint32_t p = 0; p < 65536; ++p) { float f; widen_one(uint16_t(p), pow2<float>(-e), fp16, &f); std::fwrite(&f, 4, 1, out); }
      for (uint32_t p = 0; p < 65536; ++p) { double d; widen_one(uint16_t(p), pow2<double>(-e), fp16, &d); std::fwrite(&d, 8, 1, out); }
    }
  }
  for (uint32_t b : xs) {
    const uint32_t a = b & 0x7FFFFFFFu;
    int32_t e = fp16_scale_exp_of_bits(a < 0x7F800000u ? a : 0u);
    std::fwrite(&e, 4, 1, out);
    const double d = std::ldexp(double(__uint_as_float(a)), -1000);
    const u64 ad = static_cast<u64>(__double_as_longlong(d));
    e = fp16_scale_exp_of_bits(a < 0x7F800000u ? ad : u64(0));
    std::fwrite(&e, 4, 1, out);
  }
  std::fclose(out);
  return 0;
}
"""


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    if CXX is None:
        pytest.skip("no host C++ compiler (g++ / c++)")
    d = tmp_path_factory.mktemp("emulated_cuda")
    (d / "cuda_runtime.h").write_text(CUDA_STANDINS)
    (d / "driver.cpp").write_text(DRIVER.replace("SCALES", ", ".join(map(str, SCALES))))
    exe = d / "driver"
    # No contraction, and rounding-mode changes honoured (the rz stand-in).
    subprocess.run([CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-frounding-math", f"-I{d}", f"-I{CSRC}",
                    str(d / "driver.cpp"), "-o", str(exe)], check=True, capture_output=True, text=True)
    x = test_wire_dtype._special_f32()
    x.view(torch.int32).numpy().tofile(d / "in.bin")
    subprocess.run([str(exe), str(d / "in.bin"), str(d / "out.bin")], check=True)
    return x, np.fromfile(d / "out.bin", dtype=np.uint8)


class _Reader:
    def __init__(self, raw):
        self.raw, self.at = raw, 0

    def take(self, count, dtype):
        n = count * np.dtype(dtype).itemsize
        out = self.raw[self.at:self.at + n].view(dtype)
        self.at += n
        return out


def _first_differences(got, want, inputs):
    bad = np.nonzero(got != want)[0][:4]
    return f"{len(np.nonzero(got != want)[0])} differ, e.g. inputs {[hex(int(v)) for v in inputs[bad]]} " \
           f"got {[hex(int(v)) for v in got[bad]]} want {[hex(int(v)) for v in want[bad]]}"


def test_emulated_cuda_elements_match_cpu_kernels(emulated):
    x, raw = emulated
    r = _Reader(raw)
    n = x.numel()
    xbits = x.view(torch.int32).numpy().view(np.uint32)
    patterns = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)
    for fmt in ("bf16", "fp16"):
        for e in SCALES:
            for what, src in (("f32", x), ("f64", x.double()), ("f64 between", x.double() * (1 + 2.0**-30))):
                got = r.take(n, np.uint16)
                want = _C._wire_narrow_for_test(src, fmt, e).numpy().view(np.uint16)
                assert np.array_equal(got, want), f"narrow {what} {fmt} e={e}: " + _first_differences(got, want, xbits)
            for dtype, bits in ((torch.float32, np.uint32), (torch.float64, np.uint64)):
                got = r.take(65536, bits)
                want = _C._wire_widen_for_test(patterns, fmt, dtype, e).numpy().view(bits)
                assert np.array_equal(got, want), f"widen {fmt} -> {dtype} e={e}: " + _first_differences(
                    got, want, np.arange(65536))
    # fp16's exponent from the bits of a message's largest |x|: wire_format.h's
    # rule, as the CPU codec applies it (frexp of the maximum).
    exps = r.take(2 * n, np.int32).reshape(n, 2)
    assert r.at == raw.size
    mags = x.double().abs().numpy()
    for col, m in ((0, mags), (1, np.ldexp(mags, -1000))):
        ok = np.isfinite(m) & (m > 0)
        want = np.where(ok, np.clip(15 - np.frexp(np.where(ok, m, 1.0))[1], -120, 120), 0)
        assert np.array_equal(exps[:, col], want), f"fp16 exponent ({'float64' if col else 'float32'}): " + \
            _first_differences(exps[:, col], want, xbits)
