// AVX2 fast linear for ggml block weights (GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K;
// Precision::kFast), for CPUs without VNNI. Arithmetic: ref::linear_ggml (kernels/ggml_dot.h),
// the same bits as the AVX512_VNNI kernel. Driver: gemm_ggml_direct.h (yᵀ tiles: 8 activation
// rows per ymm, 4 weight rows broadcast a unit at a time).
//
// vpmaddubsw multiplies an unsigned operand by a signed one and adds pairs into int16, saturating.
// The activations are signed (|q| ≤ 127), so the broadcast weight codes must be the unsigned
// operand: the mins formats' codes are unsigned already (≤ 31); the kOffset ones (Q4_0, Q5_0,
// Q3_K, Q6_K: ≥ −32) become w + off ≤ 63 and the activation side's off · Σq is subtracted from
// the int32 sum — pairs ≤ 2 · 63 · 127 = 16002, no saturation. Q8_0's codes span int8: as
// ggml's mul_sum_i8_pairs, |w| times q with w's sign moved onto q (|pair| ≤ 2 · 128 · 127).
// The int16 pairs of up to 8 units are summed before vpmaddwd widens them (exact while
// chain · 2 · max code · 127 ≤ 32767: 8 units for 4-bit codes, 4 for 5-bit, 2 for Q6_K's, 1 for Q8_0).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm_ggml_direct.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx2 {
namespace {

// kOffset codes become unsigned bytes w + off; the others stay as they are. No start values.
void ggml_prep_row(int8_t* w, int64_t K, const ggml_dot::Form& f, int32_t* nsum) {
  if (f.kind == ggml_dot::Kind::kOffset)
    for (int64_t k = 0; k < K; ++k) w[k] = static_cast<int8_t>(static_cast<uint8_t>(w[k] + f.off));
  std::fill(nsum, nsum + K / f.sub, 0);
}

// KIND: ggml_dot::Kind as int (0 signed, 1 offset, 2 mins). CH units' int16 pairs are summed
// (vpaddw) before one vpmaddwd widens them: CH · 2 · max code · 127 ≤ 32767 (ggml_chain).
template <int NC, int SUBU, int KIND, int CH>
__attribute__((noinline)) void ggml_tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t S, int64_t lds,
                                         const float* fw, const float* o, const float* dx, const float* xs,
                                         const int32_t* ioff, SlicePrefetch* pf, const float* bias, float* y,
                                         int64_t ldy, int rows) {
  static_assert(SUBU % CH == 0);
  constexpr int MR = 8;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
  for (int64_t s = 0; s < S; ++s) {
    pf->step();
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
#pragma GCC unroll 8
    for (int q0 = 0; q0 < SUBU; q0 += CH) {
      __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
#pragma GCC unroll 8
      for (int q = q0; q < q0 + CH; ++q) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + q * MR));
// The empty asm keeps each chain a chain (as gemm_w4a8_avx2.cpp's: GCC otherwise reassociates
// the adds into a tree and spills the products).
#define KG_COL(j)                                                                    \
  if constexpr (NC > j) {                                                            \
    int32_t u;                                                                       \
    std::memcpy(&u, w + j * ldw + q * 4, 4);                                         \
    const __m256i wb = _mm256_set1_epi32(u);                                         \
    __m256i p;                                                                       \
    if constexpr (KIND == 0) p = _mm256_maddubs_epi16(_mm256_abs_epi8(wb), _mm256_sign_epi8(av, wb)); \
    else p = _mm256_maddubs_epi16(wb, av);                                           \
    h##j = CH == 1 ? p : _mm256_add_epi16(h##j, p);                                  \
    asm("" : "+x"(h##j));                                                            \
  }
        KG_COL(0) KG_COL(1) KG_COL(2) KG_COL(3)
#undef KG_COL
      }
#define KG_WIDEN(j) \
  if constexpr (NC > j) c##j = _mm256_add_epi32(c##j, _mm256_madd_epi16(h##j, ones));
      KG_WIDEN(0) KG_WIDEN(1) KG_WIDEN(2) KG_WIDEN(3)
#undef KG_WIDEN
    }
    a += SUBU * MR;
    w += SUBU * 4;
    if constexpr (KIND == 1) {
      const __m256i io = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ioff));
      c0 = _mm256_sub_epi32(c0, io), c1 = _mm256_sub_epi32(c1, io);
      c2 = _mm256_sub_epi32(c2, io), c3 = _mm256_sub_epi32(c3, io);
    }
    const __m256 dv = _mm256_loadu_ps(dx);
#define KG_FOLD(j) \
  if constexpr (NC > j) f##j = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c##j), _mm256_mul_ps(dv, _mm256_set1_ps(fw[j])), f##j);
    KG_FOLD(0) KG_FOLD(1) KG_FOLD(2) KG_FOLD(3)
#undef KG_FOLD
    if constexpr (KIND == 2) {
      const __m256 xv = _mm256_loadu_ps(xs);
#define KG_MIN(j) \
  if constexpr (NC > j) f##j = _mm256_fmadd_ps(xv, _mm256_set1_ps(o[j]), f##j);
      KG_MIN(0) KG_MIN(1) KG_MIN(2) KG_MIN(3)
#undef KG_MIN
    }
    fw += lds, o += lds, dx += MR, xs += MR, ioff += MR;
  }
  // y = f + bias, column j's 8 rows scattered into y (a tile does S sub-blocks of work per store).
  alignas(32) float t[4][8];
#define KG_OUT(j) \
  if constexpr (NC > j) _mm256_store_ps(t[j], _mm256_add_ps(f##j, _mm256_set1_ps(bias ? bias[j] : 0.0f)));
  KG_OUT(0) KG_OUT(1) KG_OUT(2) KG_OUT(3)
#undef KG_OUT
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < NC; ++j) y[r * ldy + j] = t[j][r];
}

struct GgmlMadd {
  static constexpr int kMR = 8, kNC = 4;
  static constexpr uint32_t kActXor = 0;  // signed q
  static constexpr int64_t kSlabMax = 96, kItem = 384;
  static constexpr auto prep_row = ggml_prep_row;
  template <int NC, int SUBU, int KIND>
  static void chained(const ggml_dot::Form& f, const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t S,
                      int64_t lds, const float* fw, const float* o, const float* dx, const float* xs,
                      const int32_t* ioff, SlicePrefetch* pf, const float* bias, float* y, int64_t ldy, int rows) {
    // The longest chain the codes allow (KIND 0: |w| ≤ 128, one unit).
    const int most = KIND == 0 ? 1 : 32767 / (2 * 127 * f.umax);
    if constexpr (SUBU >= 8)
      if (most >= 8) return ggml_tile<NC, SUBU, KIND, 8>(a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    if (most >= 4) ggml_tile<NC, SUBU, KIND, 4>(a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    else if (most >= 2) ggml_tile<NC, SUBU, KIND, 2>(a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    else ggml_tile<NC, SUBU, KIND, 1>(a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
  }
  template <int NC>
  static void run(const ggml_dot::Form& f, const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t S, int64_t lds,
                  const float* fw, const float* o, const int32_t* /*nsum*/, const float* dx, const float* xs,
                  const int32_t* ioff, SlicePrefetch* pf, const float* bias, float* y, int64_t ldy, int rows) {
    using ggml_dot::Kind;
    if (f.sub == 16) {
      if (f.kind == Kind::kMins) chained<NC, 4, 2>(f, a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
      else chained<NC, 4, 1>(f, a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    } else if (f.kind == Kind::kSigned) {
      ggml_tile<NC, 8, 0, 1>(a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    } else if (f.kind == Kind::kOffset) {
      chained<NC, 8, 1>(f, a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    } else {
      chained<NC, 8, 2>(f, a, w, ldw, S, lds, fw, o, dx, xs, ioff, pf, bias, y, ldy, rows);
    }
  }
};

}  // namespace

void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  ggml_direct_linear<GgmlMadd>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx2
