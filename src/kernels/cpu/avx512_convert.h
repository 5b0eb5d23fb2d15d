// Format conversions for the AVX-512 GEMMs: rows of f32 / bf16 / f16 weights to float32, and
// float32 to bf16 with round-to-nearest-even exactly as f32_to_bf16 (core/dtype.h) and torch's
// .to(torch.bfloat16) do — integer arithmetic, no denormal flushing, NaN kept NaN. At the end, the
// flushing forms (vcvtne(2)ps2bf16, which take a denormal input as zero) for the operands that only
// a bf16 dot product reads. Include only from *_avx512*.cpp / *_amx.cpp files.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/f8_unpack.h"
#include "kernels/cpu/q4_unpack.h"
#include "kernels/cpu/q8_unpack.h"

namespace klein::kernels {
namespace {

// 16 bf16 → 16 floats (exact: the bf16 bits are the float's high half).
inline __m512 bf16x16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// 16 floats → 16 bf16 (RNE), as f32_to_bf16, each in the low half of its 32-bit lane.
inline __m512i f32x16_to_bf16_lanes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

// 16 floats → 16 bf16 (RNE), as f32_to_bf16.
inline __m256i f32x16_to_bf16(__m512 v) { return _mm512_cvtepi32_epi16(f32x16_to_bf16_lanes(v)); }

// Two rows of 16 floats → 16 bf16 pairs (lo[j] in the low half of lane j, hi[j] in the high half).
inline __m512i f32x16x2_to_bf16_pairs(__m512 lo, __m512 hi) {
  return _mm512_or_si512(f32x16_to_bf16_lanes(lo), _mm512_slli_epi32(f32x16_to_bf16_lanes(hi), 16));
}

// 16 floats of row `src` from column c (zeros at and past n) → 16 bf16, as f32_to_bf16.
inline __m256i bf16x16_at(const float* src, int64_t c, int64_t n) {
  const __mmask16 m = col_mask(static_cast<int>(std::clamp<int64_t>(n - c, 0, 16)));
  return f32x16_to_bf16(_mm512_maskz_loadu_ps(m, src + c));
}

// 32 floats of row `src` from column c (zeros at and past n) → 16 bf16 pairs in element order:
// 16 units of (k, k + 1) as the bf16 GEMMs' and attention's packed operands hold them.
inline __m512i bf16_units16_at(const float* src, int64_t c, int64_t n) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(bf16x16_at(src, c, n)), bf16x16_at(src, c + 16, n), 1);
}

// The flushing forms, for operands of vdpbf16ps / tdpbf16ps only: vcvtne(2)ps2bf16 round to
// nearest even as f32_to_bf16 and keep NaN NaN, but take a denormal input as ±0 (SDM). The dot
// products treat a denormal bf16 input as zero anyway, so the sums are the same except for an
// input in the top 1/256 of the denormal range, which f32_to_bf16 rounds up to ±2^-126: there the
// difference is one product term below 2^-126 · |w|. One instruction per 16 or 32 floats where
// the exact rounding takes ~11 per 16 (the AMX GEMM's activation pack was 3 % of a 256² bf16 +
// fast image). Templates, so that the AVX-512F files including this header never compile them.
template <class = void>
inline __m256i bf16x16_ftz(__m512 v) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

// bf16_units16_at, flushing: 32 floats of row src from column c (zeros at and past n) → 16 bf16
// pairs in element order (vcvtne2ps2bf16(hi, lo) puts lo's 16 in elements 0-15, hi's in 16-31).
template <class = void>
inline __m512i bf16_units16_ftz_at(const float* src, int64_t c, int64_t n) {
  const __mmask16 m0 = col_mask(static_cast<int>(std::clamp<int64_t>(n - c, 0, 16)));
  const __mmask16 m1 = col_mask(static_cast<int>(std::clamp<int64_t>(n - c - 16, 0, 16)));
  return reinterpret_cast<__m512i>(
      _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, src + c + 16), _mm512_maskz_loadu_ps(m0, src + c)));
}

// f32x16x2_to_bf16_pairs, flushing: two rows of 16 floats → 16 bf16 pairs (lo[j] in the low
// half of lane j, hi[j] in the high half): converted in one step, then interleaved.
template <class = void>
inline __m512i bf16_pairs_ftz(__m512 lo, __m512 hi) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// f32_to_bf16_row, flushing: n float32 → n bf16.
template <class = void>
inline void f32_to_bf16_row_ftz(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) _mm512_storeu_si512(dst + i, bf16_units16_ftz_at(src, i, n));
  for (; i < n; i += 16) {
    const __mmask16 m = col_mask(static_cast<int>(std::min<int64_t>(16, n - i)));
    _mm256_mask_storeu_epi16(dst + i, m, bf16x16_ftz(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

// n float32 → n bf16 (RNE).
inline void f32_to_bf16_row(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), f32x16_to_bf16(_mm512_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

// Row r of a weight as float32 [K]: vectorised for F32 / BF16 / F16 / Q4_G64 / F8_E4M3_SCALED, weight_row_to_f32 else.
inline void weight_row_f32(const Weight& W, int64_t r, int64_t K, float* out) {
  const uint8_t* base = static_cast<const uint8_t*>(W.data);
  int64_t i = 0;
  if (W.dtype == DType::kBF16) {
    const uint8_t* s = base + r * K * 2;
    for (; i + 16 <= K; i += 16)
      _mm512_storeu_ps(out + i, bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * 2))));
    for (; i < K; ++i) {
      uint16_t h;
      std::memcpy(&h, s + i * 2, 2);
      out[i] = bf16_to_f32(h);
    }
  } else if (W.dtype == DType::kF16) {
    const uint8_t* s = base + r * K * 2;
    for (; i + 16 <= K; i += 16)
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * 2))));
    for (; i < K; ++i) {
      uint16_t h;
      std::memcpy(&h, s + i * 2, 2);
      out[i] = f16_to_f32(h);
    }
  } else if (W.dtype == DType::kF32) {
    std::memcpy(out, base + r * K * 4, K * 4);
  } else if (W.dtype == DType::kQ4G64) {
    q4g64_row_avx2(W, r, 0, K, out);
  } else if (W.dtype == DType::kF8E4M3Scaled) {
    f8scaled_row_avx2(W, r, 0, K, out);
  } else if (W.dtype == DType::kQ8G64) {
    q8g64_row_avx2(W, r, 0, K, out);
  } else {
    weight_row_to_f32(W, r, out);
  }
}

}  // namespace
}  // namespace klein::kernels
