// AVX-VNNI W8A8 GEMM for Q8_ROW weights (Precision::kFast): the VEX-encoded vpdpbusd on ymm
// (CPUs with AVX-VNNI but no AVX-512, e.g. Alder Lake), on gemm_direct.h's driver — the
// weights are read in place and the tile is yᵀ, as in the AVX512_VNNI kernel. A tile is 16 rows
// × 6 columns: per 4-byte unit of K, two ymm of activations and 6 broadcast weight units, 12
// vpdpbusd into 12 accumulators (+ 2 activation vectors + 1 broadcast = 15 of the 16 registers).
// Quantization is quantize_row_avx2 (gemm_int8_common.h); the epilogue rescales each column as
// ref::linear_w8a8 and transposes 8 × 8 blocks into rows of y.
#include "kernels/cpu/avxvnni_common.h"
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_direct.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avxvnni {
namespace {

struct Vnni256 {
  static constexpr int kMR = 16, kNC = 6;
  static constexpr int kElemBytes = 1;  // int8 weights (row sums and scales)
  // Activation units prefetched into L1 this far ahead (as the AVX512_VNNI kernel).
  static constexpr int kAPf = 32;

  static void quantize_row(const float* x, int64_t K, int64_t Kp, uint8_t* q, float* s) {
    quantize_row_avx2(x, K, Kp, 0x80, q, s);
  }

  // Σ of the n int8 (n a multiple of 4): vpdpbusd with all-ones u8, four chains.
  static int32_t rowsum(const uint8_t* w, int64_t n) {
    const __m256i ones = _mm256_set1_epi8(1);
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = 0;
    auto ld = [&](int64_t i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)); };
    for (; k + 128 <= n; k += 128) {
      s0 = _mm256_dpbusd_avx_epi32(s0, ones, ld(k));
      s1 = _mm256_dpbusd_avx_epi32(s1, ones, ld(k + 32));
      s2 = _mm256_dpbusd_avx_epi32(s2, ones, ld(k + 64));
      s3 = _mm256_dpbusd_avx_epi32(s3, ones, ld(k + 96));
    }
    for (; k + 32 <= n; k += 32) s0 = _mm256_dpbusd_avx_epi32(s0, ones, ld(k));
    if (k < n)
      s1 = _mm256_dpbusd_avx_epi32(s1, ones, _mm256_maskload_epi32(reinterpret_cast<const int*>(w + k),
                                                                   first_lanes(static_cast<int>((n - k) / 4))));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
  }

  // qa[q][j] = unit q of row j (rows ld bytes apart), j < rows; 0 for rows ≤ j < 16. 8 rows ×
  // 8 units per 8×8 transpose.
  static void pack_rows(const uint8_t* src, int64_t ld, int rows, int64_t nq, uint32_t* qa) {
    for (int j0 = 0; j0 < kMR; j0 += 8)
      for (int64_t q = 0; q < nq; q += 8) {
        const int nu = static_cast<int>(std::min<int64_t>(8, nq - q));
        const __m256i um = first_lanes(nu);
        __m256i r[8];
        for (int i = 0; i < 8; ++i)
          r[i] = j0 + i < rows ? _mm256_maskload_epi32(reinterpret_cast<const int*>(src + (j0 + i) * ld + q * 4), um)
                               : _mm256_setzero_si256();
        transpose8x8(r);
        for (int u = 0; u < nu; ++u) _mm256_storeu_si256(reinterpret_cast<__m256i*>(qa + (q + u) * kMR + j0), r[u]);
      }
  }

  // y[rows × NC] for 16 packed activation rows a[nq][16] and the weight rows w + j·ldw;
  // pf->step() once per 16 units (the driver's prefetch of the next slab).
  // noinline: inlined into the driver, GCC kept a stack copy of every accumulator in the loop.
  template <int NC>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t nq,
                                             SlicePrefetch* pf, const int32_t* corr, const float* sx, const float* sw,
                                             const float* bias, float* y, int64_t ldy, int rows) {
    const uint8_t* w0 = w;
    const uint8_t* w3 = w + 3 * ldw;
    const int64_t l2 = 2 * ldw;
#define KLEIN_V_DECL(j) __m256i c##j##_0 = _mm256_setzero_si256(), c##j##_1 = _mm256_setzero_si256();
    KLEIN_V_DECL(0) KLEIN_V_DECL(1) KLEIN_V_DECL(2) KLEIN_V_DECL(3) KLEIN_V_DECL(4) KLEIN_V_DECL(5)
#undef KLEIN_V_DECL
#define KLEIN_V_COL(j, p, off)                                      \
  if constexpr (NC > j) {                                           \
    int32_t u;                                                      \
    std::memcpy(&u, p + off, 4);                                    \
    const __m256i bv = _mm256_set1_epi32(u);                        \
    c##j##_0 = _mm256_dpbusd_avx_epi32(c##j##_0, a0, bv);           \
    c##j##_1 = _mm256_dpbusd_avx_epi32(c##j##_1, a1, bv);           \
  }
    auto step = [&] {
      _mm_prefetch(reinterpret_cast<const char*>(a + kAPf * kMR), _MM_HINT_T0);
      const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
      const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 8));
      KLEIN_V_COL(0, w0, 0) KLEIN_V_COL(1, w0, ldw) KLEIN_V_COL(2, w0, l2)
      KLEIN_V_COL(3, w3, 0) KLEIN_V_COL(4, w3, ldw) KLEIN_V_COL(5, w3, l2)
      a += kMR;
      w0 += 4, w3 += 4;
    };
#undef KLEIN_V_COL
    int64_t q = 0;
    for (; q + 16 <= nq; q += 16) {
      pf->step();
      // Unrolled: as a loop (3 pointer adds and a branch per 12 vpdpbusd) the tile ran ~3 % slower
      // on the AMX Xeon (family 6 model 167, --only int8_avxvnni, three interleaved rounds).
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) step();
    }
    for (; q < nq; ++q) step();
    // Rescale column by column (lanes = rows), then transpose 8 rows at a time into y.
    __m256i r[2][8];
#define KLEIN_V_OUT(j) \
  r[0][j] = NC > j ? c##j##_0 : _mm256_setzero_si256(); r[1][j] = NC > j ? c##j##_1 : _mm256_setzero_si256();
    KLEIN_V_OUT(0) KLEIN_V_OUT(1) KLEIN_V_OUT(2) KLEIN_V_OUT(3) KLEIN_V_OUT(4) KLEIN_V_OUT(5)
#undef KLEIN_V_OUT
    const __m256i cm = first_lanes(NC);
    for (int h = 0; h < 2 && h * 8 < rows; ++h) {
      const __m256 vs = _mm256_loadu_ps(sx + h * 8);
      for (int j = 0; j < 8; ++j) {
        if (j >= NC) {
          r[h][j] = _mm256_setzero_si256();
          continue;
        }
        const __m256i k = _mm256_set1_epi32(corr[j] * 128);
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(r[h][j], k)), vs);
        __m256 v = _mm256_mul_ps(t, _mm256_set1_ps(sw[j]));
        v = _mm256_add_ps(v, _mm256_set1_ps(bias ? bias[j] : 0.0f));
        r[h][j] = _mm256_castps_si256(v);
      }
      transpose8x8(r[h]);
      const int n = std::min(8, rows - h * 8);
      for (int i = 0; i < n; ++i) _mm256_maskstore_ps(y + (h * 8 + i) * ldy, cm, _mm256_castsi256_ps(r[h][i]));
    }
  }

};

}  // namespace

void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  direct_linear<Vnni256>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

bool linear_q8_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul) {
  direct_linear<Vnni256>(x, M, K, W, bias_f32, out, pool, ldx, ldo, silu_mul);
  return true;
}

}  // namespace klein::kernels::avxvnni
