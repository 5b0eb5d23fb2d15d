// AVX512_VNNI W4A8 GEMM for Q4_G64 weights (Precision::kFast). Arithmetic: ref::linear_w4a8 in
// the float32 steps of gemm_w4a8_common.h — per output and group g, f = fma(float(A_g), s_g, f),
// f = fma(X_g, o_g, f); y = fma(f, s_x, bias) — so the same bits as the AVX2 and AMX kernels.
//
// Why this form: the packing driver (gemm_w4a8_common.h, still the AVX2 kernel's) transposes each
// K slice of the weights into 32-column panels, reading 256-byte row segments at a stride of K/2
// that the hardware prefetchers follow poorly. On Zen 4 at M = 256 that pack was ~13-16 % of the
// GEMM's time under perf, most of it waiting on those loads, and in the pipeline (weights cold
// from the mapped file) ~15 %. Here, as in the W8A8 kernel (gemm_direct.h), the tile
// computes yᵀ: its vector lanes run along M and it broadcasts one 4-byte unit of a weight row —
// 4 consecutive k of one output column — so the weights need no transpose, only their nibbles
// spread to bytes, row after row (sequential reads), once per slab of rows that stays in L2.
// Zen 4, 2 threads, the DiT's ten shapes at M = 256 and 1024 (klein-bench_kernels, three
// interleaved runs): 613-666 ms → 561-570 ms (one run 651), 55-75 % → 72-79 % of the vpdpbusd
// peak; with the weights evicted before each call (--cold) 62-76 % → 72-85 %. The packing form
// with a zmm-transposing pack (not kept) was in between. Scattering y's columns instead of the
// epilogue's transposes halved the epilogue on hot operands but was 7 % slower in the GEMM;
// 8 × 16 transposes (the 6 columns, not 16) instead of 16 × 16 ones: 2-3 % faster on one thread.
//
//   1. x is quantized per row as u8 = q + 128 (quantize_row_int8_z: the bytes of
//      ref::quantize_row_int8, shifted) into blocks of 32 rows stored [K/4][32] 4-byte units, with
//      each row's group sums X_g = Σ q (exact as float: |X_g| ≤ 64 · 127) stored [G][32] per block.
//   2. The driver (gemm_w4a8_direct.h, shared with the AVX-VNNI kernel): threads take work items
//      of columns; per slab of weight rows (≤ a quarter of L2 once unpacked) the nibbles spread
//      to bytes 0..15 (rows ldw apart), and per group and row the scale, the offset (float) and
//      −128 · Σ nibbles, group-major.
//   3. Per 32-row block of x, across the slab's 6-row tiles, over the whole K in registers: per
//      group the int32 sums start at −128 · Σ nibbles, so that 16 vpdpbusd of (q + 128) · nibble
//      leave exactly A_g = Σ q · nibble; then the fold. The epilogue transposes the tile into
//      rows of y.
//
// Registers: 12 int32 + 12 float accumulators, 2 activation vectors, 1 broadcast, and the fold's
// X_g vectors and scale / offset broadcasts: 31 of 32 — hence 6 weight rows per tile.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_direct.h"
#include "kernels/cpu/gemm_w4a8_direct.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels::avx512vnni {
namespace {

constexpr int kMR = 32;           // rows of x per tile (two zmm of lanes)
constexpr int kNC = 6;            // weight rows (columns of y) per tile
constexpr int64_t kSlabMax = 96;  // most weight rows per slab (a multiple of kNC)
constexpr int64_t kItem = 384;    // columns per thread work item (a few slabs: each prefetches the next)
// (Prefetching the activations 32 units ahead into L1, as the W8A8 tile does, made no difference
// here: 3 + 3 interleaved rounds, warm and --cold, one thread.)

// y[rows × NC] (rows ldy apart) for a 32-row block a [K/4][32] and NC unpacked weight rows at
// w + j·ldw. Per group g and row j: s, o at s[g·lds + j], o[g·lds + j], the int32 start at
// nsum[g·lds + j] (group-major: one pointer per array reaches the tile's rows by constant
// offsets; row-major took 18 addresses, and GCC's tile had 75 stack accesses against 56, ~1 %
// slower); the block's group sums xs [G][32] and row scales sx [32].
// noinline: inlined into the driver, GCC kept stack copies of accumulators in the int8 kernels.
template <int NC>
__attribute__((noinline)) void tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t G, int64_t lds,
                                    const float* s, const float* o, const int32_t* nsum, const float* xs, SlicePrefetch* pf,
                                    const float* sx, const float* bias, float* /*scratch: unused*/, float* y,
                                    int64_t ldy, int rows) {
  // Two row pointers and the strides 1·ldw, 2·ldw reach the 6 rows by addressing modes.
  const uint8_t* w0 = w;
  const uint8_t* w3 = w + 3 * ldw;
  const int64_t l2 = 2 * ldw;
#define KW_DECL(j) __m512 f##j##_0 = _mm512_setzero_ps(), f##j##_1 = _mm512_setzero_ps();
  KW_DECL(0) KW_DECL(1) KW_DECL(2) KW_DECL(3) KW_DECL(4) KW_DECL(5)
#undef KW_DECL
  for (int64_t g = 0; g < G; ++g) {
    pf->step();
#define KW_INIT(j) \
  __m512i c##j##_0 = _mm512_setzero_si512(), c##j##_1 = c##j##_0; \
  if constexpr (NC > j) c##j##_0 = c##j##_1 = _mm512_set1_epi32(nsum[j]);
    KW_INIT(0) KW_INIT(1) KW_INIT(2) KW_INIT(3) KW_INIT(4) KW_INIT(5)
#undef KW_INIT
#define KW_COL(j, p, off) \
  if constexpr (NC > j) dpbusd_unit2(c##j##_0, c##j##_1, a0, a1, p + off);
    // Fully unrolled (as the packing kernel's: with GCC's unroll by 2 the accumulators rotated
    // through registers with a move per vpdpbusd).
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {
      const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 16);
      KW_COL(0, w0, 0) KW_COL(1, w0, ldw) KW_COL(2, w0, l2)
      KW_COL(3, w3, 0) KW_COL(4, w3, ldw) KW_COL(5, w3, l2)
      a += kMR;
      w0 += 4, w3 += 4;
    }
#undef KW_COL
    const __m512 x0 = _mm512_loadu_ps(xs + g * kMR), x1 = _mm512_loadu_ps(xs + g * kMR + 16);
#define KW_FOLD(j)                                                               \
  if constexpr (NC > j) {                                                        \
    const __m512 sv = _mm512_set1_ps(s[j]), ov = _mm512_set1_ps(o[j]);           \
    f##j##_0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c##j##_0), sv, f##j##_0);      \
    f##j##_1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c##j##_1), sv, f##j##_1);      \
    f##j##_0 = _mm512_fmadd_ps(x0, ov, f##j##_0);                                \
    f##j##_1 = _mm512_fmadd_ps(x1, ov, f##j##_1);                                \
  }
    KW_FOLD(0) KW_FOLD(1) KW_FOLD(2) KW_FOLD(3) KW_FOLD(4) KW_FOLD(5)
#undef KW_FOLD
    s += lds, o += lds, nsum += lds;
  }
  // y = fma(f, s_x, bias) per column (lanes = rows), then per 16 rows an 8 × 16 transpose (the
  // 6 columns and 2 empty ones) into rows of y: r[j] holds row j in its low 8 lanes and row j + 8
  // in its high 8, each stored under a mask.
  const __m512 sx0 = _mm512_loadu_ps(sx), sx1 = _mm512_loadu_ps(sx + 16);
  __m512i r[2][8];
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 8; ++j) r[h][j] = _mm512_setzero_si512();
#define KW_OUT(j)                                                                           \
  if constexpr (NC > j) {                                                                   \
    const __m512 bv = _mm512_set1_ps(bias ? bias[j] : 0.0f);                                \
    r[0][j] = _mm512_castps_si512(_mm512_fmadd_ps(f##j##_0, sx0, bv));                      \
    r[1][j] = _mm512_castps_si512(_mm512_fmadd_ps(f##j##_1, sx1, bv));                      \
  }
  KW_OUT(0) KW_OUT(1) KW_OUT(2) KW_OUT(3) KW_OUT(4) KW_OUT(5)
#undef KW_OUT
  const __mmask16 lo = col_mask(NC), hi = static_cast<__mmask16>(lo << 8);
  for (int h = 0; h < 2 && h * 16 < rows; ++h) {
    transpose_epi32<8>(r[h]);
    float* yh = y + h * 16 * ldy;
    for (int j = 0; j < 8; ++j) {
      if (h * 16 + j < rows) _mm512_mask_storeu_ps(yh + j * ldy, lo, _mm512_castsi512_ps(r[h][j]));
      // Lanes 8.. are row j + 8: stored from 8 floats before its start, only the masked lanes.
      if (h * 16 + j + 8 < rows) _mm512_mask_storeu_ps(yh + (j + 8) * ldy - 8, hi, _mm512_castsi512_ps(r[h][j]));
    }
  }
}

// Rows [r0, r0 + n) of W unpacked: nibbles → bytes wu[j·ldw + k] in element order, and per group
// and row nsum[g·lds + j] = −128 · Σ of its 64 nibbles, s and o as float [g][lds] (row scratch
// t: 2·G floats).
void unpack_slab(const Weight& W, int64_t r0, int64_t n, uint8_t* wu, int64_t ldw, int64_t lds, int32_t* nsum,
                 float* s, float* o, float* t) {
  const int64_t K = W.cols(), G = K / 64;
  const __m512i lo_mask = _mm512_set1_epi16(0x0f), zero = _mm512_setzero_si512();
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* src = static_cast<const uint8_t*>(W.data) + (r0 + j) * (K / 2);
    for (int64_t g = 0; g < G; ++g) {
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + g * 32)));
      // u16 lane b holds element 2b in its low byte and 2b + 1 in its high byte.
      const __m512i e = _mm512_or_si512(_mm512_and_si512(v, lo_mask), _mm512_slli_epi16(_mm512_srli_epi16(v, 4), 8));
      _mm512_storeu_si512(wu + j * ldw + g * 64, e);
      nsum[g * lds + j] = -128 * static_cast<int32_t>(_mm512_reduce_add_epi64(_mm512_sad_epu8(e, zero)));
    }
    scales_to_f32(W.scales, W.scale_dtype, (r0 + j) * G, G, t);
    scales_to_f32(W.offsets, W.scale_dtype, (r0 + j) * G, G, t + G);
    for (int64_t g = 0; g < G; ++g) s[g * lds + j] = t[g], o[g * lds + j] = t[G + g];
  }
}

// The micro-kernel set for the direct driver (gemm_w4a8_direct.h).
void quantize(const float* x, int64_t M, int64_t K, int64_t ldx, ThreadPool& pool, uint32_t* qa, float* xs, float* sx) {
  quantize_w4a8_blocks_z(x, M, K, ldx, 0x80, pool, qa, xs, sx);  // u8 = q + 128
}
struct Vnni512 {
  static constexpr int kMR = avx512vnni::kMR, kNC = avx512vnni::kNC, kScratch = 1;
  static constexpr int64_t kSlabMax = avx512vnni::kSlabMax, kItem = avx512vnni::kItem;
  static constexpr auto quantize = avx512vnni::quantize;
  static constexpr auto unpack_slab = avx512vnni::unpack_slab;
  template <int NC>
  static constexpr auto tile = avx512vnni::tile<NC>;
};

}  // namespace

void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  w4a8_direct_linear<Vnni512>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

bool linear_q4_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul) {
  w4a8_direct_linear<Vnni512>(x, M, K, W, bias_f32, out, pool, ldx, ldo, silu_mul);
  return true;
}

}  // namespace klein::kernels::avx512vnni
