// AVX512_VNNI W8A8 GEMM for Q8_ROW weights (Precision::kFast), on gemm_direct.h's driver:
// the weights are read in place, the tile is yᵀ. A tile is 32 rows × 12 columns: per 4-byte unit
// of K, two zmm of activations (32 rows) and 12 broadcast weight units, 24 vpdpbusd into 24
// accumulators (+ 2 activation vectors + 1 broadcast = 27 of the 32 registers); 14 loads per 24
// vpdpbusd, within the two-per-cycle load ports. The epilogue rescales each column's two vectors
// exactly as ref::linear_w8a8 and transposes them into rows of y.
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_direct.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx512vnni {
namespace {

struct Vnni512 {
  static constexpr int kMR = 32, kNC = 12;
  static constexpr int kElemBytes = 1;  // int8 weights (row sums and scales)
  // Activation units are prefetched into L1 this many units ahead: the block (32 · K bytes)
  // streams from L2 or L3 and its loads were the tile's main stall (perf). GEMM alone: 8 units
  // ~3 % faster than none, 16 or 32 ~4 %; 512² q8 denoise 2-4 % faster with 32 than with 16.
  static constexpr int kAPf = 32;

  // ref::quantize_row_int8 into K bytes of u8 = q + 128 (and Kp − K pad bytes of 0x80).
  static void quantize_row(const float* x, int64_t K, int64_t Kp, uint8_t* q, float* s_out) {
    quantize_row_int8_z(x, K, Kp, q, s_out, 0x80);
  }

  // Σ of the n int8 (n a multiple of 4): vpdpbusd with all-ones u8, four chains (one chain was
  // bound by vpdpbusd's latency: ~6 % of a GEMM at M = 256).
  static int32_t rowsum(const uint8_t* w, int64_t n) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = 0;
    for (; k + 256 <= n; k += 256) {
      s0 = _mm512_dpbusd_epi32(s0, ones, _mm512_loadu_si512(w + k));
      s1 = _mm512_dpbusd_epi32(s1, ones, _mm512_loadu_si512(w + k + 64));
      s2 = _mm512_dpbusd_epi32(s2, ones, _mm512_loadu_si512(w + k + 128));
      s3 = _mm512_dpbusd_epi32(s3, ones, _mm512_loadu_si512(w + k + 192));
    }
    for (; k + 64 <= n; k += 64) s0 = _mm512_dpbusd_epi32(s0, ones, _mm512_loadu_si512(w + k));
    if (k < n) s1 = _mm512_dpbusd_epi32(s1, ones, _mm512_maskz_loadu_epi8((~0ULL) >> (64 - (n - k)), w + k));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3)));
  }

  // qa[q][j] = unit q of row j of the rows' bytes (ld apart), for j < rows; 0 above.
  static void pack_rows(const uint8_t* rows_, int64_t ld, int rows, int64_t nq, uint32_t* qa) {
    pack_units_z(rows_, ld, rows, 0, nq, qa);
  }

  // y[rows × NC] for 32 packed activation rows a[nq][32] and the weight rows w + j·ldw;
  // pf->step() once per 16 units (the driver's prefetch of the next columns' rows).
  // noinline: inlined into the driver, GCC kept a stack copy of every accumulator in the loop.
  template <int NC>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t nq,
                                             SlicePrefetch* pf, const int32_t* corr, const float* sx, const float* sw,
                                             const float* bias, float* y, int64_t ldy, int rows) {
    KLEIN_YT_ROW_POINTERS(w)
    KLEIN_YT_ACCUMULATORS(__m512i, _mm512_setzero_si512())
#define KLEIN_V_COL(j, p, off) \
  if constexpr (NC > j) dpbusd_unit2(c##j##_0, c##j##_1, a0, a1, p + off);
    auto step = [&] {
      _mm_prefetch(reinterpret_cast<const char*>(a + kAPf * kMR), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a + kAPf * kMR + 16), _MM_HINT_T0);
      const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 16);
      KLEIN_YT_COLUMNS(KLEIN_V_COL)
      a += kMR;
      w0 += 4, w3 += 4, w6 += 4, w9 += 4;
    };
#undef KLEIN_V_COL
    yt_units(nq, pf, step);
    // Rescale column by column (lanes = rows), then transpose into y.
    __m512i r[2][16];
#define KLEIN_V_OUT(j) \
  r[0][j] = NC > j ? c##j##_0 : _mm512_setzero_si512(); r[1][j] = NC > j ? c##j##_1 : _mm512_setzero_si512();
    KLEIN_V_OUT(0) KLEIN_V_OUT(1) KLEIN_V_OUT(2) KLEIN_V_OUT(3) KLEIN_V_OUT(4) KLEIN_V_OUT(5)
    KLEIN_V_OUT(6) KLEIN_V_OUT(7) KLEIN_V_OUT(8) KLEIN_V_OUT(9) KLEIN_V_OUT(10) KLEIN_V_OUT(11)
#undef KLEIN_V_OUT
    for (int h = 0; h < 2 && h * 16 < rows; ++h) {
      const __m512 vs = _mm512_loadu_ps(sx + h * 16);
      for (int j = 0; j < NC; ++j) {
        const __m512i k = _mm512_set1_epi32(corr[j] * 128);
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(r[h][j], k)), vs);
        __m512 v = _mm512_mul_ps(t, _mm512_set1_ps(sw[j]));
        v = _mm512_add_ps(v, _mm512_set1_ps(bias ? bias[j] : 0.0f));
        r[h][j] = _mm512_castps_si512(v);
      }
    }
    yt_store(r, rows, NC, y, ldy);
  }

};

}  // namespace

void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  direct_linear<Vnni512>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

bool linear_q8_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul) {
  direct_linear<Vnni512>(x, M, K, W, bias_f32, out, pool, ldx, ldo, silu_mul);
  return true;
}

}  // namespace klein::kernels::avx512vnni
