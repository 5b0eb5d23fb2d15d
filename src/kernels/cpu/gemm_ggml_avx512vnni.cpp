// AVX512_VNNI fast linear for ggml block weights (GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K;
// Precision::kFast). Arithmetic: ref::linear_ggml (kernels/ggml_dot.h), the same bits. Driver:
// gemm_ggml_direct.h.
//
// The activations are stored as u8 = q + 128 (vpdpbusd's unsigned operand) and the broadcast
// weight codes as s8, so each sub-block's int32 sums start at −128 · Σ w (prep_row) and 4 or 8
// vpdpbusd leave exactly c_j = Σ q · w. Then, per 16 lanes, the float steps of ggml_dot.h:
// t = dx_j · fw_j, f = fma(float(c_j), t, f) (and f = fma(xs_j, o_j, f) for the mins formats).
// Registers as the W4A8 tile (gemm_w4a8_avx512vnni.cpp): 12 int32 + 12 float accumulators of
// 6 weight rows × 32 activation rows, 2 activation vectors, a broadcast and the fold's vectors.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_ggml_direct.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels::avx512vnni {
namespace {

// The codes stay signed; the int32 start per sub-block is −128 · Σ w.
void ggml_prep_row(int8_t* w, int64_t K, const ggml_dot::Form& f, int32_t* nsum) {
  for (int64_t s = 0; s < K / f.sub; ++s) {
    int32_t t = 0;
    for (int k = 0; k < f.sub; ++k) t += w[s * f.sub + k];
    nsum[s] = -128 * t;
  }
}

template <int NC, int SUBU, bool MINS>
__attribute__((noinline)) void ggml_tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t S, int64_t lds,
                                         const float* fw, const float* o, const int32_t* nsum, const float* dx,
                                         const float* xs, SlicePrefetch* pf, const float* bias, float* y, int64_t ldy,
                                         int rows) {
  constexpr int MR = 32;
  const uint8_t* w0 = w;
  const uint8_t* w3 = w + 3 * ldw;
  const int64_t l2 = 2 * ldw;
#define KG_DECL(j) __m512 f##j##_0 = _mm512_setzero_ps(), f##j##_1 = _mm512_setzero_ps();
  KG_DECL(0) KG_DECL(1) KG_DECL(2) KG_DECL(3) KG_DECL(4) KG_DECL(5)
#undef KG_DECL
  for (int64_t s = 0; s < S; ++s) {
    pf->step();
#define KG_INIT(j) \
  __m512i c##j##_0 = _mm512_setzero_si512(), c##j##_1 = c##j##_0; \
  if constexpr (NC > j) c##j##_0 = c##j##_1 = _mm512_set1_epi32(nsum[j]);
    KG_INIT(0) KG_INIT(1) KG_INIT(2) KG_INIT(3) KG_INIT(4) KG_INIT(5)
#undef KG_INIT
#define KG_COL(j, p, off) \
  if constexpr (NC > j) dpbusd_unit2(c##j##_0, c##j##_1, a0, a1, p + off);
#pragma GCC unroll 8
    for (int q = 0; q < SUBU; ++q) {
      const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 16);
      KG_COL(0, w0, 0) KG_COL(1, w0, ldw) KG_COL(2, w0, l2)
      KG_COL(3, w3, 0) KG_COL(4, w3, ldw) KG_COL(5, w3, l2)
      a += MR;
      w0 += 4, w3 += 4;
    }
#undef KG_COL
    const __m512 d0 = _mm512_loadu_ps(dx), d1 = _mm512_loadu_ps(dx + 16);
#define KG_FOLD(j)                                                                                 \
  if constexpr (NC > j) {                                                                          \
    const __m512 sv = _mm512_set1_ps(fw[j]);                                                       \
    f##j##_0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c##j##_0), _mm512_mul_ps(d0, sv), f##j##_0);     \
    f##j##_1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c##j##_1), _mm512_mul_ps(d1, sv), f##j##_1);     \
  }
    KG_FOLD(0) KG_FOLD(1) KG_FOLD(2) KG_FOLD(3) KG_FOLD(4) KG_FOLD(5)
#undef KG_FOLD
    if constexpr (MINS) {
      const __m512 x0 = _mm512_loadu_ps(xs), x1 = _mm512_loadu_ps(xs + 16);
#define KG_MIN(j)                                                  \
  if constexpr (NC > j) {                                          \
    const __m512 ov = _mm512_set1_ps(o[j]);                        \
    f##j##_0 = _mm512_fmadd_ps(x0, ov, f##j##_0);                  \
    f##j##_1 = _mm512_fmadd_ps(x1, ov, f##j##_1);                  \
  }
      KG_MIN(0) KG_MIN(1) KG_MIN(2) KG_MIN(3) KG_MIN(4) KG_MIN(5)
#undef KG_MIN
    }
    fw += lds, o += lds, nsum += lds, dx += MR, xs += MR;
  }
  // y = f + bias per column (lanes = rows), then per 16 rows an 8 × 16 transpose (the 6 columns
  // and 2 empty ones) into rows of y, as the W4A8 tile's epilogue.
  __m512i r[2][8];
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 8; ++j) r[h][j] = _mm512_setzero_si512();
#define KG_OUT(j)                                                          \
  if constexpr (NC > j) {                                                  \
    const __m512 bv = _mm512_set1_ps(bias ? bias[j] : 0.0f);               \
    r[0][j] = _mm512_castps_si512(_mm512_add_ps(f##j##_0, bv));            \
    r[1][j] = _mm512_castps_si512(_mm512_add_ps(f##j##_1, bv));            \
  }
  KG_OUT(0) KG_OUT(1) KG_OUT(2) KG_OUT(3) KG_OUT(4) KG_OUT(5)
#undef KG_OUT
  const __mmask16 lo = col_mask(NC), hi = static_cast<__mmask16>(lo << 8);
  for (int h = 0; h < 2 && h * 16 < rows; ++h) {
    transpose_epi32<8>(r[h]);
    float* yh = y + h * 16 * ldy;
    for (int j = 0; j < 8; ++j) {
      if (h * 16 + j < rows) _mm512_mask_storeu_ps(yh + j * ldy, lo, _mm512_castsi512_ps(r[h][j]));
      if (h * 16 + j + 8 < rows) _mm512_mask_storeu_ps(yh + (j + 8) * ldy - 8, hi, _mm512_castsi512_ps(r[h][j]));
    }
  }
}

struct GgmlVnni512 {
  static constexpr int kMR = 32, kNC = 6;
  static constexpr uint32_t kActXor = 0x80;  // u8 = q + 128
  static constexpr int64_t kSlabMax = 96, kItem = 384;
  static constexpr auto prep_row = ggml_prep_row;
  template <int NC>
  static void run(const ggml_dot::Form& f, const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t S, int64_t lds,
                  const float* fw, const float* o, const int32_t* nsum, const float* dx, const float* xs,
                  const int32_t* /*ioff: the start values correct exactly*/, SlicePrefetch* pf, const float* bias,
                  float* y, int64_t ldy, int rows) {
    if (f.sub == 16) {
      if (f.mins()) ggml_tile<NC, 4, true>(a, w, ldw, S, lds, fw, o, nsum, dx, xs, pf, bias, y, ldy, rows);
      else ggml_tile<NC, 4, false>(a, w, ldw, S, lds, fw, o, nsum, dx, xs, pf, bias, y, ldy, rows);
    } else {
      if (f.mins()) ggml_tile<NC, 8, true>(a, w, ldw, S, lds, fw, o, nsum, dx, xs, pf, bias, y, ldy, rows);
      else ggml_tile<NC, 8, false>(a, w, ldw, S, lds, fw, o, nsum, dx, xs, pf, bias, y, ldy, rows);
    }
  }
};

}  // namespace

void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  ggml_direct_linear<GgmlVnni512>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx512vnni
