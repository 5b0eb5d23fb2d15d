// Q8_G64 rows → float32 with AVX2 (the AVX2 GEMM's slab expansion and, through
// weight_row_f32, the AVX-512 GEMMs'): per group of 64 bytes, each 8 widened to int32, converted
// and mapped to offset + scale · q — a multiply then an add, each rounded to float32, exactly as
// the format table's row → f32 (q8g64_row) computes, so the expanded weights are the same bits.
//
// Include ONLY from SIMD files built with at least AVX2 (everything has internal linkage).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/format.h"
#include "core/weight.h"

namespace klein::kernels {
namespace {

// Elements [c0, c0 + n) of row r (c0, n multiples of 64) as float32.
inline void q8g64_row_avx2(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols(), groups = cols / 64;
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
  for (int64_t g = c0 / 64; g < (c0 + n) / 64; ++g) {
    const __m256 s = _mm256_set1_ps(scale_at(w.scales, w.scale_dtype, r * groups + g));
    const __m256 m = _mm256_set1_ps(scale_at(w.offsets, w.scale_dtype, r * groups + g));
    float* o = out + (g * 64 - c0);
    for (int i = 0; i < 64; i += 8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + g * 64 + i));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
      _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(s, v), m));
    }
  }
}

}  // namespace
}  // namespace klein::kernels
