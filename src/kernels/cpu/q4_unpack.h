// Q4_G64 rows → float32 with AVX2 (used by the AVX2 GEMM and, through weight_row_f32, by the
// AVX-512 fp32 and bf16 GEMMs when they expand a slab): per group of 64, the 32 bytes of nibbles
// are spread to 64 bytes in element order, widened to int32, converted and mapped to
// offset + scale · q — a multiply then an add, each rounded to float32, exactly as the format
// table's row → f32 (q4g64_row) computes, so the expanded weights are the same bits. The unpack
// is paid once per slab and amortised over the M rows of x; the scalar loop it replaces cost
// 25–50 % of a bf16 GEMM at M = 512 (bench_kernels).
//
// Include ONLY from SIMD files built with at least AVX2 (everything has internal linkage).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/format.h"
#include "core/weight.h"

namespace klein::kernels {
namespace {

// 16 packed bytes (32 nibbles, low first) → 32 bytes, one element each, in element order.
inline __m256i q4_spread16(const uint8_t* p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i lo = _mm256_and_si256(w, _mm256_set1_epi16(0x0f));
  const __m256i hi = _mm256_slli_epi16(_mm256_srli_epi16(w, 4), 8);
  return _mm256_or_si256(lo, hi);  // u16 lane b = element 2b (low byte), 2b+1 (high byte)
}

// Elements [c0, c0 + n) of row r (c0, n multiples of 64) as float32.
inline void q4g64_row_avx2(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols(), groups = cols / 64;
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
  for (int64_t g = c0 / 64; g < (c0 + n) / 64; ++g) {
    const __m256 s = _mm256_set1_ps(scale_at(w.scales, w.scale_dtype, r * groups + g));
    const __m256 m = _mm256_set1_ps(scale_at(w.offsets, w.scale_dtype, r * groups + g));
    float* o = out + (g * 64 - c0);
    for (int h = 0; h < 2; ++h) {
      const __m256i e = q4_spread16(q + g * 32 + h * 16);
      const __m128i e0 = _mm256_castsi256_si128(e), e1 = _mm256_extracti128_si256(e, 1);
      const __m128i parts[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
      for (int i = 0; i < 4; ++i) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
        _mm256_storeu_ps(o + h * 32 + i * 8, _mm256_add_ps(_mm256_mul_ps(s, v), m));
      }
    }
  }
}

}  // namespace
}  // namespace klein::kernels
