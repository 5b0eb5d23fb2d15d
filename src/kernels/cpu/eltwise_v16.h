// The 16-lane zmm vector type of the AVX-512 element-wise kernels (eltwise_simd.h's V): the
// element-wise file instantiates EltwiseSimd over it, and the AMX GEMMs' fused SwiGLU store
// (amx_common.h's amx_store_swiglu) calls the same EltwiseSimd<V16>::silu_v, so that the fused
// result has the bits of the GEMM followed by the element-wise silu_mul.
//
// Include ONLY from *_avx512.cpp / *_amx.cpp files (internal linkage, AVX-512 F/BW/DQ/VL).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/eltwise_simd.h"

namespace klein::kernels {
namespace {

struct V16 {
  using F = __m512;
  using D = __m512d;
  using M = __mmask16;
  static constexpr int W = 16;

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static M mask(int64_t k) { return static_cast<M>((1u << k) - 1); }  // the first k (< 16) lanes
  // Masked-off lanes are neither read (fault suppression past the row end) nor written.
  static F load_n(const float* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_n(float* p, F v, M m) { _mm512_mask_storeu_ps(p, m, v); }

  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F neg(F a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F swap_pairs(F a) { return _mm512_permute_ps(a, 0xB1); }  // lanes (1,0,3,2,...)
  static F flip_even(F a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi64(0x80000000LL)));
  }
  // e · 2^n: vscalefps handles overflow to inf and rounds subnormal results once, correctly.
  static F scale2n(F e, F n) { return _mm512_scalef_ps(e, n); }
  static F exp(F x) { return exp_cephes<V16>(x); }

  static D dzero() { return _mm512_setzero_pd(); }
  static D dset1(double v) { return _mm512_set1_pd(v); }
  static D dadd(D a, D b) { return _mm512_add_pd(a, b); }
  static D dsub(D a, D b) { return _mm512_sub_pd(a, b); }
  static D dfma(D a, D b, D c) { return _mm512_fmadd_pd(a, b, c); }
  // 256-bit halves through the merge-masked extract with an explicit zero source: GCC 12's
  // plain _mm512_extractf64x4_pd (also behind _mm512_castpd512_pd256 and _mm512_reduce_add_pd)
  // seeds its result with _mm256_undefined_pd and warns (-Wuninitialized) wherever inlined.
  template <int kHalf>
  static __m256d half(D v) { return _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xF, v, kHalf); }
  static D lo(F v) { return _mm512_cvtps_pd(_mm256_castpd_ps(half<0>(_mm512_castps_pd(v)))); }
  static D hi(F v) { return _mm512_cvtps_pd(_mm256_castpd_ps(half<1>(_mm512_castps_pd(v)))); }
  static double dhsum(D v) {
    const __m256d q = _mm256_add_pd(half<0>(v), half<1>(v));
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(q), _mm256_extractf128_pd(q, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  }
};

}  // namespace
}  // namespace klein::kernels
