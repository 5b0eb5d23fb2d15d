// AVX512_VNNI W4A8 GEMM for Q4_G64 weights (Precision::kFast; arithmetic: ref::linear_w4a8).
//
// Driver: gemm_w4a8_common.h (x quantized per row, nibbles unpacked to bytes in NR-column
// panels; vpdpbusd takes them as its unsigned operand and the int8 activations as the signed
// one). Per group of 64 (16 units) a 6×32 tile sums int32 A_g exactly, then folds it into
// float32 accumulators: f += s_g · float(A_g) + o_g · X_g (per-column s_g, o_g). After the last
// K slice, y = f · s_x + bias. Registers: 12 int32 + 12 float accumulators, 2 panel vectors, 1 broadcast,
// 4 scale/offset vectors = 31 of 32 (hence 6 rows, not the W8A8 kernel's 12).
//
// Measured (bench_kernels, DiT shapes, 2 threads): this against the bf16-tile alternative
// (the slab unpacked to bf16, then vdpbf16ps) — see tools/bench_kernels.cpp's Q4_G64 rows.
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_w4a8_common.h"

namespace klein::kernels::avx512vnni {
namespace {

struct Vnni512 {
  static constexpr int kMR = 6, kNR = 32;
  static constexpr int64_t kKG = 8;    // groups per K slice: 512 k, a 32-column panel of 16 KB
  static constexpr int64_t kNC = 256;  // columns per slab

  static_assert(kNR == kZNR, "pack_panel_z builds kZNR-column panels");

  // The panel's units (gemm_w4a8_common.h's layout: dst[q][j] = elements 4q .. 4q + 3 of row j
  // as bytes 0..15, zero for j ≥ nr): per 16 rows × 16 units, each row's 32 nibble bytes spread
  // to 64 bytes in one zmm, then a 16×16 transpose of 4-byte lanes (pack_panel_z). The shared
  // scalar pack (a 4-byte store per unit, each row's loads behind the previous row's stores) was
  // ~16 % of this GEMM's time at M = 256 on Zen 4 under perf, most of it waiting on the loads.
  static void pack_panel(const Weight& W, int64_t n0, int nr, int64_t g0, int64_t ng, uint32_t* dst) {
    const int64_t K = W.cols();
    const uint8_t* base = static_cast<const uint8_t*>(W.data) + n0 * (K / 2) + g0 * 32;
    pack_panel_z(nr, ng * 16, dst, [&](int j, int64_t q, int) {  // ng · 16 is a multiple of 16
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + j * (K / 2) + q * 2)));
      const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi16(0x0f));
      return _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_srli_epi16(w, 4), 8));  // byte 2b = element 2b
    });
  }

static __mmask16 lanes(int n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1); }

// c[R×32] = (acc ? c : 0) + Σ_g (s[g] · A_g + o[g] · xs[r][g]) over ng groups; when `sx` is set
// (last slice) then c = c · sx[r] + bias. a: sliver-packed units [ng·16][kMR]; b: panel
// [ng·16][32]; s, o: [ng][32]; xs: row r's group sums at xs + r·ldxs.
template <int R>
__attribute__((noinline)) static void tile(const uint32_t* a, const uint32_t* b, int64_t ng, const float* s, const float* o,
                                    const float* xs, int64_t ldxs, float* c, int64_t ldc, bool acc, int cols,
                                    const float* sx, const float* bias) {
  const __mmask16 k0 = lanes(cols), k1 = lanes(cols - 16);
#define KW_DECL(r)                                                   \
  __m512 f##r##_0 = _mm512_setzero_ps(), f##r##_1 = _mm512_setzero_ps(); \
  if (R > r && acc) {                                                \
    f##r##_0 = _mm512_maskz_loadu_ps(k0, c + r * ldc);               \
    f##r##_1 = _mm512_maskz_loadu_ps(k1, c + r * ldc + 16);          \
  }
  KW_DECL(0) KW_DECL(1) KW_DECL(2) KW_DECL(3) KW_DECL(4) KW_DECL(5)
#undef KW_DECL
  for (int64_t g = 0; g < ng; ++g) {
#define KW_IDECL(r) __m512i i##r##_0 = _mm512_setzero_si512(), i##r##_1 = _mm512_setzero_si512();
    KW_IDECL(0) KW_IDECL(1) KW_IDECL(2) KW_IDECL(3) KW_IDECL(4) KW_IDECL(5)
#undef KW_IDECL
    // Fully unrolled: with GCC's default unroll by 2 the 12 accumulators rotated through
    // registers with a vmovdqa64 per vpdpbusd (seen in perf annotate), ~1/3 of the issue slots.
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {
      const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 16);
#define KW_ROW(r)                                                          \
  if constexpr (R > r) {                                                   \
    const __m512i av = _mm512_set1_epi32(static_cast<int>(a[q * kMR + r])); \
    i##r##_0 = _mm512_dpbusd_epi32(i##r##_0, b0, av);                      \
    i##r##_1 = _mm512_dpbusd_epi32(i##r##_1, b1, av);                      \
  }
      KW_ROW(0) KW_ROW(1) KW_ROW(2) KW_ROW(3) KW_ROW(4) KW_ROW(5)
#undef KW_ROW
      b += kNR;
    }
    a += 16 * kMR;
    const __m512 s0 = _mm512_loadu_ps(s + g * kNR), s1 = _mm512_loadu_ps(s + g * kNR + 16);
    const __m512 o0 = _mm512_loadu_ps(o + g * kNR), o1 = _mm512_loadu_ps(o + g * kNR + 16);
#define KW_FOLD(r)                                                    \
  if constexpr (R > r) {                                              \
    const __m512 xv = _mm512_set1_ps(xs[r * ldxs + g]);               \
    f##r##_0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r##_0), s0, f##r##_0); \
    f##r##_1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r##_1), s1, f##r##_1); \
    f##r##_0 = _mm512_fmadd_ps(xv, o0, f##r##_0);                     \
    f##r##_1 = _mm512_fmadd_ps(xv, o1, f##r##_1);                     \
  }
    KW_FOLD(0) KW_FOLD(1) KW_FOLD(2) KW_FOLD(3) KW_FOLD(4) KW_FOLD(5)
#undef KW_FOLD
  }
  const __m512 bb0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
  const __m512 bb1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
#define KW_STORE(r)                                                          \
  if constexpr (R > r) {                                                     \
    if (sx) {                                                                \
      const __m512 sv = _mm512_set1_ps(sx[r]);                               \
      f##r##_0 = _mm512_fmadd_ps(f##r##_0, sv, bb0);                         \
      f##r##_1 = _mm512_fmadd_ps(f##r##_1, sv, bb1);                         \
    }                                                                        \
    _mm512_mask_storeu_ps(c + r * ldc, k0, f##r##_0);                        \
    _mm512_mask_storeu_ps(c + r * ldc + 16, k1, f##r##_1);                   \
  }
  KW_STORE(0) KW_STORE(1) KW_STORE(2) KW_STORE(3) KW_STORE(4) KW_STORE(5)
#undef KW_STORE
}
};

}  // namespace

void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  w4a8_linear<Vnni512>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx512vnni
