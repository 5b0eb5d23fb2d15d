// AVX2 W4A8 GEMM for Q4_G64 weights (Precision::kFast; arithmetic: ref::linear_w4a8), for CPUs
// without VNNI. Driver: gemm_w4a8_common.h; per output the same float32 steps as the AVX-512
// VNNI kernel, so both give the same bits.
//
// vpmaddubsw multiplies the unsigned nibble bytes (0..15) by the signed int8 activations
// (|q| ≤ 127) and adds pairs into int16: |pair| ≤ 2 · 15 · 127 = 3810, so neither the pair sum
// (which vpmaddubsw saturates at ±32767) nor a chain of 8 of them added with vpaddw
// (≤ 30480) can overflow. The int16 chains cover 8 units (32 k) each and only then are widened
// by vpmaddwd with ones — one widening per 8 products instead of one per product as int8 × int8
// needs (gemm_int8_avx2.cpp), which is why this kernel does more multiply-adds per cycle than
// the W8A8 one on the same CPU.
// 4×8 tiles: per row an int16 chain, an int32 group sum and a float accumulator (12), plus the
// panel vector, the broadcast and the ones = 15 of the 16 ymm registers.
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_w4a8_common.h"

namespace klein::kernels::avx2 {
namespace {

struct Madd4 {
  static constexpr int kMR = 4, kNR = 8;
  static constexpr int64_t kKG = 8;    // groups per K slice: 512 k, an 8-column panel of 4 KB
  static constexpr int64_t kNC = 256;  // columns per slab
  static constexpr int64_t kMB = 48;   // rows per pass over a panel (gemm_w4a8_common.h)

  // c[R×8] = (acc ? c : 0) + Σ_g (s[g] · A_g + o[g] · xs[r][g]) over ng groups; when `sx` is set
  // (last slice) then c = c · sx[r] + bias. a: sliver-packed units [ng·16][kMR]; b: panel
  // [ng·16][8]; s, o: [ng][8]; xs: row r's group sums at xs + r·ldxs.
  template <int R>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint32_t* b, int64_t ng, const float* s,
                                             const float* o, const float* xs, int64_t ldxs, float* c, int64_t ldc,
                                             bool acc, int cols, const float* sx, const float* bias) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i ones = _mm256_set1_epi16(1);
#define KW_DECL(r) \
  __m256 f##r = _mm256_setzero_ps(); \
  if (R > r && acc) f##r = _mm256_maskload_ps(c + r * ldc, mask);
    KW_DECL(0) KW_DECL(1) KW_DECL(2) KW_DECL(3)
#undef KW_DECL
    for (int64_t g = 0; g < ng; ++g) {
      __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) {
          const __m256i bv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
// The empty asm keeps each chain a chain: GCC's reassociation otherwise turned the 8 integer
// adds into a tree, computed all 32 products first and spilled them to the stack.
#define KW_ROW(r)                                                                       \
  if constexpr (R > r) {                                                                \
    h##r = _mm256_add_epi16(                                                            \
        h##r, _mm256_maddubs_epi16(bv, _mm256_set1_epi32(static_cast<int>(a[q * kMR + r])))); \
    asm("" : "+x"(h##r));                                                               \
  }
          KW_ROW(0) KW_ROW(1) KW_ROW(2) KW_ROW(3)
#undef KW_ROW
          b += kNR;
        }
        a += 8 * kMR;
#define KW_WIDEN(r)                                                      \
  if constexpr (R > r) {                                                 \
    const __m256i w = _mm256_madd_epi16(h##r, ones);                     \
    i##r = h == 0 ? w : _mm256_add_epi32(i##r, w);                       \
  }
        KW_WIDEN(0) KW_WIDEN(1) KW_WIDEN(2) KW_WIDEN(3)
#undef KW_WIDEN
      }
      const __m256 sv = _mm256_loadu_ps(s + g * kNR), ov = _mm256_loadu_ps(o + g * kNR);
#define KW_FOLD(r)                                                  \
  if constexpr (R > r) {                                            \
    f##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i##r), sv, f##r);     \
    f##r = _mm256_fmadd_ps(_mm256_set1_ps(xs[r * ldxs + g]), ov, f##r); \
  }
      KW_FOLD(0) KW_FOLD(1) KW_FOLD(2) KW_FOLD(3)
#undef KW_FOLD
    }
    const __m256 bb = bias ? _mm256_maskload_ps(bias, mask) : _mm256_setzero_ps();
#define KW_STORE(r)                                                   \
  if constexpr (R > r) {                                              \
    if (sx) f##r = _mm256_fmadd_ps(f##r, _mm256_set1_ps(sx[r]), bb);  \
    _mm256_maskstore_ps(c + r * ldc, mask, f##r);                     \
  }
    KW_STORE(0) KW_STORE(1) KW_STORE(2) KW_STORE(3)
#undef KW_STORE
  }
};

}  // namespace

void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  w4a8_linear<Madd4>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

}  // namespace klein::kernels::avx2
