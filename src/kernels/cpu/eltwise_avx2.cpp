// The AVX2 element-wise kernels: eltwise_simd.h over 8-lane ymm vectors (AVX2 + FMA). Only
// reached through the registry's Isa::kAvx2 element-wise row, on CPUs that have AVX2/FMA/F16C.
#include <immintrin.h>

#include "kernels/cpu/eltwise_simd.h"

namespace klein::kernels::avx2 {
namespace {

struct V8 {
  using F = __m256;
  using D = __m256d;
  using M = __m256i;  // lane mask for the partial step: all-ones in the lanes to touch
  static constexpr int W = 8;

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static M mask(int64_t k) {  // the first k (< 8) lanes
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // vmaskmov: masked-off lanes are neither read (no fault past the row end) nor written.
  static F load_n(const float* p, M m) { return _mm256_maskload_ps(p, m); }
  static void store_n(float* p, F v, M m) { _mm256_maskstore_ps(p, m, v); }

  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F swap_pairs(F a) { return _mm256_permute_ps(a, 0xB1); }  // lanes (1,0,3,2,...)
  static F flip_even(F a) {
    return _mm256_xor_ps(a, _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f));
  }
  // e · 2^n for integral n in [-150, 128] (exp_cephes's range). AVX2 has no vscalefps: build the
  // power of two from exponent bits, in two factors 2^(n/2) · 2^(n − n/2), each a normal float,
  // so results that overflow become inf and those in the subnormal range round once, correctly.
  static F scale2n(F e, F n) {
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const F p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const F p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(e, p1), p2);
  }
  static F exp(F x) { return exp_cephes<V8>(x); }

  static D dzero() { return _mm256_setzero_pd(); }
  static D dset1(double v) { return _mm256_set1_pd(v); }
  static D dadd(D a, D b) { return _mm256_add_pd(a, b); }
  static D dsub(D a, D b) { return _mm256_sub_pd(a, b); }
  static D dfma(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
  static D lo(F v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
  static D hi(F v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
  static double dhsum(D v) {
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  }
};

}  // namespace

// constexpr: the table is data in the binary. The registry takes every ISA's table on every CPU,
// and a run-time initialisation compiled in this file may use its ISA (GCC filled a
// function-local static table with zmm stores: SIGILL on AVX2-only CPUs).
constexpr EltwiseFns kFns = EltwiseSimd<V8>::table();
const EltwiseFns& eltwise() { return kFns; }

}  // namespace klein::kernels::avx2
