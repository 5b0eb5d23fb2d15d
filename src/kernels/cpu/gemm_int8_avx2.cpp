// AVX2 W8A8 GEMM for Q8_ROW weights (Precision::kFast), without dot-product instructions: int8
// activations and weights widened to int16, multiplied as pairs by vpmaddwd (int16 × int16, pair
// sums to int32) and summed with vpaddd. Exact: a pair sum is at most 2 · 127 · 128 = 32512 in
// magnitude and the int32 sums over K are the reference's.
//
// Why not vpmaddubsw (u8 × s8, 32 products per instruction, pair sums saturated to int16): its
// operands must be unsigned × signed, and u8 = q + 128 saturates (255 · 127 · 2 > 32767), so the
// kernel this one replaced moved the signs with a vpsignb per product vector and widened with
// vpmaddwd(·, ones): 2 multiplies + vpsignb + vpaddd per 32 products. vpmaddwd alone is 2
// multiplies + 2 vpaddd per 32 products — the same multiplies, and no vpsignb, which competes
// with them for the vector-multiply pipes. Register-only loops of the two micro-kernels on a Zen 3
// (2 multiply pipes) ran at 73 % and 85 % of the vpmaddubsw + vpmaddwd peak. By port counts on
// Skylake-class cores (vpmaddwd, vpmaddubsw and vpsignb on ports 0 and 1, vpaddd on 0, 1 and 5)
// the old sequence is bound at 67 % of that peak and this one at 75 %; on cores with a single
// multiply pipe (Zen 2, Haswell) both are bound by the multiplies alike (not measured here).
// In the GEMM (DiT shapes, 2 threads, Zen 3) 265-270 → 275-285 GOP/s, 70-73 % of that peak; the
// micro-kernel alone on hot operands 79 %. Cost: the weight panel is int16 (twice the bytes in L1).
//
// 6×16 int32 tiles: 12 accumulators + 2 panel vectors + the broadcast row pair + a product = 16
// ymm registers. Driver: gemm_int8_common.h.
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx2 {
namespace {

struct MaddWd {
  static constexpr int kMR = 6, kNR = 16;

  // a: [nq][kMR] int16 pairs (one per row), b: [nq][kNR] int16 pairs (one per column).
  // noinline: inlined into the driver, GCC kept a stack copy of every accumulator in the loop.
  template <int R>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint32_t* b, int64_t nq, int32_t* c, int64_t ldc, bool acc) {
#define KLEIN_M_DECL(r)                                                                        \
  __m256i c##r##_0 = _mm256_setzero_si256(), c##r##_1 = _mm256_setzero_si256();                \
  if (R > r && acc) {                                                                          \
    c##r##_0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc));              \
    c##r##_1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc + 8));          \
  }
    KLEIN_M_DECL(0) KLEIN_M_DECL(1) KLEIN_M_DECL(2) KLEIN_M_DECL(3) KLEIN_M_DECL(4) KLEIN_M_DECL(5)
#undef KLEIN_M_DECL
#define KLEIN_M_ROW(r)                                                                \
  if constexpr (R > r) {                                                              \
    const __m256i av = _mm256_set1_epi32(static_cast<int>(a[q * kMR + r]));          \
    c##r##_0 = _mm256_add_epi32(c##r##_0, _mm256_madd_epi16(av, b0));                 \
    c##r##_1 = _mm256_add_epi32(c##r##_1, _mm256_madd_epi16(av, b1));                 \
  }
    for (int64_t q = 0; q < nq; ++q) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8));
      KLEIN_M_ROW(0) KLEIN_M_ROW(1) KLEIN_M_ROW(2) KLEIN_M_ROW(3) KLEIN_M_ROW(4) KLEIN_M_ROW(5)
      b += kNR;
    }
#undef KLEIN_M_ROW
#define KLEIN_M_STORE(r)                                                          \
  if constexpr (R > r) {                                                          \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), c##r##_0);       \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), c##r##_1);   \
  }
    KLEIN_M_STORE(0) KLEIN_M_STORE(1) KLEIN_M_STORE(2) KLEIN_M_STORE(3) KLEIN_M_STORE(4) KLEIN_M_STORE(5)
#undef KLEIN_M_STORE
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

  // dst[q * kNR + j] = the int16 pair (q0 + q) of int8 row j (bytes 2 (q0 + q), +1, widened), for
  // j < nr; zero for the padded columns. Eight rows × eight pairs at a time: the rows' bytes
  // widened (vpmovsxbw), then an 8 × 8 transpose of 4-byte units (avx2_common.h's).
  static void pack(const uint8_t* src, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst) {
    for (int g = 0; g < kNR; g += 8) {
      for (int64_t q = 0; q < nq; q += 8) {
        const int64_t n = std::min<int64_t>(8, nq - q);
        __m256i r[8];
        for (int i = 0; i < 8; ++i) {
          if (g + i >= nr) {
            r[i] = _mm256_setzero_si256();
            continue;
          }
          const uint8_t* s = src + (g + i) * ld + (q0 + q) * 2;
          __m128i bytes;
          if (n == 8) {
            bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
          } else {  // the slice's last pairs: never read past them (the row may end there)
            alignas(16) uint8_t t[16] = {};
            std::memcpy(t, s, n * 2);
            bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
          }
          r[i] = _mm256_cvtepi8_epi16(bytes);  // row g + i: pairs q .. q + 7
        }
        // 4-byte units move as floats through the shared transpose (bit moves only).
        __m256 f[8];
        for (int i = 0; i < 8; ++i) f[i] = _mm256_castsi256_ps(r[i]);
        transpose8(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);  // f[i] = pair q + i of rows g .. g + 7
        for (int64_t i = 0; i < n; ++i) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (q + i) * kNR + g), f[i]);
      }
    }
  }
};

}  // namespace

void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  int8_linear<MaddWd>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx2
