// AVX512_VNNI W8A8 GEMM for Q8_ROW weights (Precision::kFast): vpdpbusd on zmm, 12×32 int32
// tiles (24 accumulators + 2 panel vectors + 1 broadcast of the 32 registers; the macros go to
// 14 rows: 14×32 measured the same within the noise of a shared machine, 66-75 % vs 67-80 % of
// the vpdpbusd peak, so the smaller tile that leaves the compiler registers). The driver,
// quantization and exact rescale are gemm_int8_common.h's; activations are u8 = q + 128.
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx512vnni {
namespace {

struct Vnni512 {
  static constexpr int kMR = 12, kNR = 32;
  static constexpr bool kShift = true;

  // Panels by zmm transposes (gemm_avx512_common.h), not a scalar move per unit.
  static void pack(const uint8_t* src, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst) {
    pack_units_z(src, ld, nr, q0, nq, dst);
  }

  // sum[j] += Σ_q Σ_i panel[q][j].byte[i] for the NR columns: vpdpbusd with all-ones u8.
  static void colsum(const uint32_t* panel, int64_t nq, int32_t* sum) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_loadu_si512(sum), s1 = _mm512_loadu_si512(sum + 16);
    for (int64_t q = 0; q < nq; ++q) {
      s0 = _mm512_dpbusd_epi32(s0, ones, _mm512_loadu_si512(panel + q * kNR));
      s1 = _mm512_dpbusd_epi32(s1, ones, _mm512_loadu_si512(panel + q * kNR + 16));
    }
    _mm512_storeu_si512(sum, s0);
    _mm512_storeu_si512(sum + 16, s1);
  }

  // c[R×32] (+)= Σ_q a[q][r] · panel[q] over nq units (a: the sliver-packed activations).
  // noinline: inlined into the driver, GCC kept a stack copy of every accumulator in the loop.
  template <int R>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c, int64_t ldc, bool acc) {
#define KLEIN_V_DECL(r)                                                                        \
  __m512i c##r##_0 = _mm512_setzero_si512(), c##r##_1 = _mm512_setzero_si512();                \
  if (R > r && acc) {                                                                          \
    c##r##_0 = _mm512_loadu_si512(c + r * ldc);                                                \
    c##r##_1 = _mm512_loadu_si512(c + r * ldc + 16);                                           \
  }
    KLEIN_V_DECL(0) KLEIN_V_DECL(1) KLEIN_V_DECL(2) KLEIN_V_DECL(3) KLEIN_V_DECL(4) KLEIN_V_DECL(5) KLEIN_V_DECL(6)
    KLEIN_V_DECL(7) KLEIN_V_DECL(8) KLEIN_V_DECL(9) KLEIN_V_DECL(10) KLEIN_V_DECL(11) KLEIN_V_DECL(12)
    KLEIN_V_DECL(13)
#undef KLEIN_V_DECL
#define KLEIN_V_ROW(r)                                          \
  if constexpr (R > r) {                                        \
    const __m512i av = _mm512_set1_epi32(static_cast<int>(a[q * kMR + r]));                    \
    c##r##_0 = _mm512_dpbusd_epi32(c##r##_0, av, b0);           \
    c##r##_1 = _mm512_dpbusd_epi32(c##r##_1, av, b1);           \
  }
    for (int64_t q = 0; q < nq; ++q) {
      const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 16);
      KLEIN_V_ROW(0) KLEIN_V_ROW(1) KLEIN_V_ROW(2) KLEIN_V_ROW(3) KLEIN_V_ROW(4) KLEIN_V_ROW(5) KLEIN_V_ROW(6)
      KLEIN_V_ROW(7) KLEIN_V_ROW(8) KLEIN_V_ROW(9) KLEIN_V_ROW(10) KLEIN_V_ROW(11) KLEIN_V_ROW(12) KLEIN_V_ROW(13)
      b += kNR;
    }
#undef KLEIN_V_ROW
#define KLEIN_V_STORE(r)                                \
  if constexpr (R > r) {                                \
    _mm512_storeu_si512(c + r * ldc, c##r##_0);         \
    _mm512_storeu_si512(c + r * ldc + 16, c##r##_1);    \
  }
    KLEIN_V_STORE(0) KLEIN_V_STORE(1) KLEIN_V_STORE(2) KLEIN_V_STORE(3) KLEIN_V_STORE(4) KLEIN_V_STORE(5)
    KLEIN_V_STORE(6) KLEIN_V_STORE(7) KLEIN_V_STORE(8) KLEIN_V_STORE(9) KLEIN_V_STORE(10) KLEIN_V_STORE(11)
    KLEIN_V_STORE(12) KLEIN_V_STORE(13)
#undef KLEIN_V_STORE
  }

  static void tile_rows(int rows, const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c,
                        int64_t ldc, bool acc) {
    switch (rows) {
#define KLEIN_V_CASE(n) \
  case n: tile<n>(a, b, nq, c, ldc, acc); break;
      KLEIN_V_CASE(14) KLEIN_V_CASE(13) KLEIN_V_CASE(12) KLEIN_V_CASE(11) KLEIN_V_CASE(10) KLEIN_V_CASE(9)
      KLEIN_V_CASE(8) KLEIN_V_CASE(7) KLEIN_V_CASE(6) KLEIN_V_CASE(5) KLEIN_V_CASE(4) KLEIN_V_CASE(3)
      KLEIN_V_CASE(2)
#undef KLEIN_V_CASE
      default: tile<1>(a, b, nq, c, ldc, acc); break;
    }
  }
};

}  // namespace

void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  int8_linear<Vnni512>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx512vnni
