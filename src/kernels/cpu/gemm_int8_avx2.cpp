// AVX2 W8A8 GEMM for Q8_ROW weights (Precision::kFast), without dot-product instructions:
// vpmaddubsw (u8 × s8 → pairwise sums saturated to int16) + vpmaddwd with ones (→ int32 quads).
//
// Why not the VNNI kernels' u8 = q + 128 activations: vpmaddubsw saturates each pair sum at
// ±32767, and 255 · 127 + 255 · 127 = 64770 does saturate. Instead the signs move onto the
// activations: u8 operand |w| (≤ 128, -128 included), s8 operand q · sign(w) (vpsignb; |q| ≤ 127
// by the quantization's clamp). A pair sum is then at most 2 · 128 · 127 = 32512 < 32767: never
// saturated, so the quads are exact for every int8 weight, and no column-sum correction is
// needed. Cost: one vpsignb per (row, panel vector) and one vpabsb per panel vector.
// 4×16 int32 tiles: 8 accumulators + 2 panel vectors + their 2 absolute values + broadcast +
// ones + a temporary = 15 of the 16 ymm registers. Driver: gemm_int8_common.h.
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx2 {
namespace {

struct MaddInt8 {
  static constexpr int kMR = 4, kNR = 16;

  // noinline: inlined into the driver, GCC kept a stack copy of every accumulator in the loop.
  template <int R>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c, int64_t ldc, bool acc) {
    const __m256i ones = _mm256_set1_epi16(1);
#define KLEIN_M_DECL(r)                                                                        \
  __m256i c##r##_0 = _mm256_setzero_si256(), c##r##_1 = _mm256_setzero_si256();                \
  if (R > r && acc) {                                                                          \
    c##r##_0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc));              \
    c##r##_1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc + 8));          \
  }
    KLEIN_M_DECL(0) KLEIN_M_DECL(1) KLEIN_M_DECL(2) KLEIN_M_DECL(3)
#undef KLEIN_M_DECL
#define KLEIN_M_ROW(r)                                                                               \
  if constexpr (R > r) {                                                                             \
    const __m256i av = _mm256_set1_epi32(static_cast<int>(a[q * kMR + r]));                                                         \
    c##r##_0 = _mm256_add_epi32(                                                                     \
        c##r##_0, _mm256_madd_epi16(_mm256_maddubs_epi16(w0, _mm256_sign_epi8(av, b0)), ones));      \
    c##r##_1 = _mm256_add_epi32(                                                                     \
        c##r##_1, _mm256_madd_epi16(_mm256_maddubs_epi16(w1, _mm256_sign_epi8(av, b1)), ones));      \
  }
    for (int64_t q = 0; q < nq; ++q) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8));
      const __m256i w0 = _mm256_abs_epi8(b0), w1 = _mm256_abs_epi8(b1);  // |-128| = 0x80 = 128 as u8
      KLEIN_M_ROW(0) KLEIN_M_ROW(1) KLEIN_M_ROW(2) KLEIN_M_ROW(3)
      b += kNR;
    }
#undef KLEIN_M_ROW
#define KLEIN_M_STORE(r)                                                          \
  if constexpr (R > r) {                                                          \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), c##r##_0);       \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), c##r##_1);   \
  }
    KLEIN_M_STORE(0) KLEIN_M_STORE(1) KLEIN_M_STORE(2) KLEIN_M_STORE(3)
#undef KLEIN_M_STORE
  }

  static void tile_rows(int rows, const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c,
                        int64_t ldc, bool acc) {
    switch (rows) {
      case 4: tile<4>(a, b, nq, c, ldc, acc); break;
      case 3: tile<3>(a, b, nq, c, ldc, acc); break;
      case 2: tile<2>(a, b, nq, c, ldc, acc); break;
      default: tile<1>(a, b, nq, c, ldc, acc); break;
    }
  }
};

}  // namespace

void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  int8_linear<MaddInt8>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx2
