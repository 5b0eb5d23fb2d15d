// AVX-VNNI W8A8 GEMM for Q8_ROW weights (Precision::kFast): the VEX-encoded vpdpbusd on ymm
// (CPUs with AVX-VNNI but no AVX-512, e.g. Alder Lake), 6×16 int32 tiles (12 accumulators + 2
// panel vectors + 1 broadcast of the 16 registers). Driver, quantization and exact rescale:
// gemm_int8_common.h; activations are u8 = q + 128.
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avxvnni {
namespace {

struct Vnni256 {
  static constexpr int kMR = 6, kNR = 16;
  static constexpr bool kShift = true;

  static void colsum(const uint32_t* panel, int64_t nq, int32_t* sum) {
    const __m256i ones = _mm256_set1_epi8(1);
    __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum));
    __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum + 8));
    for (int64_t q = 0; q < nq; ++q) {
      s0 = _mm256_dpbusd_avx_epi32(s0, ones, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + q * kNR)));
      s1 = _mm256_dpbusd_avx_epi32(s1, ones,
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + q * kNR + 8)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sum), s0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sum + 8), s1);
  }

  // noinline: inlined into the driver, GCC kept a stack copy of every accumulator in the loop.
  template <int R>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c, int64_t ldc, bool acc) {
#define KLEIN_V_DECL(r)                                                                        \
  __m256i c##r##_0 = _mm256_setzero_si256(), c##r##_1 = _mm256_setzero_si256();                \
  if (R > r && acc) {                                                                          \
    c##r##_0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc));              \
    c##r##_1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc + 8));          \
  }
    KLEIN_V_DECL(0) KLEIN_V_DECL(1) KLEIN_V_DECL(2) KLEIN_V_DECL(3) KLEIN_V_DECL(4) KLEIN_V_DECL(5)
#undef KLEIN_V_DECL
#define KLEIN_V_ROW(r)                                          \
  if constexpr (R > r) {                                        \
    const __m256i av = _mm256_set1_epi32(static_cast<int>(a[q * kMR + r]));                    \
    c##r##_0 = _mm256_dpbusd_avx_epi32(c##r##_0, av, b0);       \
    c##r##_1 = _mm256_dpbusd_avx_epi32(c##r##_1, av, b1);       \
  }
    for (int64_t q = 0; q < nq; ++q) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8));
      KLEIN_V_ROW(0) KLEIN_V_ROW(1) KLEIN_V_ROW(2) KLEIN_V_ROW(3) KLEIN_V_ROW(4) KLEIN_V_ROW(5)
      b += kNR;
    }
#undef KLEIN_V_ROW
#define KLEIN_V_STORE(r)                                                          \
  if constexpr (R > r) {                                                          \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), c##r##_0);       \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), c##r##_1);   \
  }
    KLEIN_V_STORE(0) KLEIN_V_STORE(1) KLEIN_V_STORE(2) KLEIN_V_STORE(3) KLEIN_V_STORE(4) KLEIN_V_STORE(5)
#undef KLEIN_V_STORE
  }

  static void tile_rows(int rows, const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c,
                        int64_t ldc, bool acc) {
    switch (rows) {
      case 6: tile<6>(a, b, nq, c, ldc, acc); break;
      case 5: tile<5>(a, b, nq, c, ldc, acc); break;
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
  int8_linear<Vnni256>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avxvnni
