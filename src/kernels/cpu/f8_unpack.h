// F8_E4M3_SCALED rows → float32 with AVX2 (used by the AVX2 GEMM and, through weight_row_f32, by
// the AVX-512 fp32, bf16 and AMX GEMMs when they expand a slab): the GEMMs expand W one slab of
// rows at a time, so an fp8 model stays 1 byte per weight in memory and no dequantized copy of a
// whole tensor is ever made.
//
// An e4m3fn byte's 7 magnitude bits shifted left by 20 are a float32 whose exponent field is the
// e4m3 exponent and whose top mantissa bits are its mantissa: 2^(e-127)·(1 + m/8), or for e = 0
// the float32 subnormal 2^-126·m/8. Multiplying by 2^120 rebias it exactly (a power of two, and
// every result is a normal float32): the e4m3 value 2^(e-7)·(1 + m/8), or m·2^-9 for the e4m3
// subnormals. The sign bit is or-ed in and 0x7f (e4m3fn's only NaN magnitude: it has no inf)
// becomes NaN. The scale multiply is then the same single rounding as the format table's
// f8scaled_row, so the expanded weights are the same bits as the scalar reference.
//
// The subnormal step needs MXCSR's DAZ clear (the default; klein never sets it).
//
// Include ONLY from SIMD files built with at least AVX2 (everything has internal linkage).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/format.h"
#include "core/weight.h"

namespace klein::kernels {
namespace {

// 8 e4m3fn bytes → 8 floats, times `scale`.
inline __m256 f8e4m3x8_to_f32(const uint8_t* p, __m256 scale) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  const __m256 two120 = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 120) << 23));
  __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), two120);
  const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
  v = _mm256_or_ps(v, nan);  // all ones: a NaN
  v = _mm256_or_ps(v, _mm256_castsi256_ps(sign));
  return _mm256_mul_ps(v, scale);
}

// Elements [c0, c0 + n) of row r as float32.
inline void f8scaled_row_avx2(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * w.cols() + c0;
  const float s = scale_at(w.scales, w.scale_dtype, 0);
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f8e4m3x8_to_f32(q + i, vs));
  for (; i < n; ++i) out[i] = f8e4m3_to_f32(q[i]) * s;
}

}  // namespace
}  // namespace klein::kernels
