// AMX W4A8 GEMM for Q4_G64 weights (Precision::kFast): ref::linear_w4a8's arithmetic in the same
// float32 steps as the VNNI and AVX2 W4A8 kernels (gemm_w4a8_common.h), so the same bits:
// per output and group g, f = fma(float(A_g), s_g, f), f = fma(X_g, o_g, f); y = fma(f, s_x, bias).
//
// A group is 64 values of K = 64 bytes, exactly one tile step, and A_g = Σ nibble · q is what one
// tdpbusd (unsigned × signed) sums. As the other AMX GEMMs (gemm_amx.cpp) the tiles compute yᵀ:
//   A tiles = 16 weight rows × one group of unpacked nibbles (bytes 0..15; a slab of ≤ L2/4 rows
//             is unpacked once per call into a scratch, row stride K),
//   B tiles = one group of 16 activation rows' int8 (packed [blocks of 32][K/4][32] units),
// 2 × 2 tiles per 32 weight rows × 32 activation rows. After each group the four int32 tiles
// are stored and folded into float32 sums f[32 n][32 m] (in L1) with that group's per-row scale
// and offset and the activation rows' group sums X_g; the fold, not the tile product, bounds
// this kernel (~6 vector operations per 16 outputs per group against a quarter tdpbusd).
// The epilogue transposes f into rows of y (amx_store_transposed).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_common.h"
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_units.h"
#include "kernels/cpu/q4_unpack.h"

namespace klein::kernels::amx {
namespace {

constexpr int kMR = 32, kNR = 32;
constexpr int64_t kSlabMax = 256;  // weight rows per slab (a multiple of kNR)
constexpr int64_t kItem = 512;     // columns per thread work item (split_gemm; 2 slabs)

// Groups per chunk of a slab: its kSlabMax rows unpacked take 3/8 of the L2 (all of K = 3072 with
// 2 MB). As for gemm_amx.cpp's W8A8 slabs, each activation block
// streams from L3 once per slab; 2 threads, 2 MB L2, ms against 128-row slabs (chunks of a
// quarter of the L2): M = 1536, K = 3072, N = 9216 36.5-44.5 → 32.9-36.4 (512 rows: 34.9-36.4);
// M = 768, N = 3072 6.29-6.88 → 5.99-6.41; M = 1536, K = 9216, N = 3072 38.3-43.0 → 35.0-38.6;
// M = 768, K = 12288 26.3-27.5 → 25.5-25.9.
inline int64_t groups_per_chunk(int64_t K) {
  return std::clamp<int64_t>(l2_cache_bytes() * 3 / 8 / (kSlabMax * 64), 1, K / 64);
}

// A slab's rows as the tiles take them: weight rows [r0, r0 + n), or with kSwiglu (W = [gate;
// up], F rows each) output columns [r0, r0 + n) as groups of 32 rows — 16 gate rows, then the
// same columns' up rows. slab_row(j) is W's row for the tiles' row j, or -1 (a zero pad row,
// up to whole 32-row groups).
template <bool kSwiglu>
int64_t slab_row(const Weight& W, int64_t r0, int64_t n, int64_t j) {
  if constexpr (kSwiglu) {
    const int64_t col = j / kNR * 16 + j % 16;
    return col < n ? (j % kNR < 16 ? r0 + col : W.rows() / 2 + r0 + col) : -1;
  } else {
    return j < n ? r0 + j : -1;
  }
}
template <bool kSwiglu>
int64_t slab_padded(int64_t n) {
  return kSwiglu ? (n + 15) / 16 * kNR : (n + kNR - 1) / kNR * kNR;
}

// The slab's rows (slab_row), groups [g0, g0 + gc): nibbles → bytes wu[row][gc · 64] (rows ldw
// apart); pad rows zero.
template <bool kSwiglu>
void unpack_rows(const Weight& W, int64_t r0, int64_t n, int64_t g0, int64_t gc, uint8_t* wu, int64_t ldw) {
  const int64_t K = W.cols();
  for (int64_t j = 0; j < slab_padded<kSwiglu>(n); ++j) {
    const int64_t r = slab_row<kSwiglu>(W, r0, n, j);
    if (r < 0) {
      std::memset(wu + j * ldw, 0, gc * 64);
      continue;
    }
    const uint8_t* src = static_cast<const uint8_t*>(W.data) + r * (K / 2) + g0 * 32;
    for (int64_t h = 0; h < gc * 2; ++h)
      _mm256_store_si256(reinterpret_cast<__m256i*>(wu + j * ldw + h * 32), q4_spread16(src + h * 16));
  }
}

// scales_to_f32 (core/format.h) with zmm conversions for the 16-bit scale types: the scalar loop
// held ~1 % of a q4 generate's samples (two values per 64 weights, every call).
void scales_f32(const void* p, DType t, int64_t i0, int64_t n, float* out) {
  if (t != DType::kBF16 && t != DType::kF16) {
    scales_to_f32(p, t, i0, n, out);
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(p) + i0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = col_mask(static_cast<int>(std::min<int64_t>(16, n - i)));
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    const __m512 f = t == DType::kBF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                                       : _mm512_cvtph_ps(h);  // exact, as f16_to_f32
    _mm512_mask_storeu_ps(out + i, m, f);
  }
}

// The scales and offsets of the slab's rows (slab_row) as float [row][G]; zero for pad rows.
template <bool kSwiglu>
void unpack_scales(const Weight& W, int64_t r0, int64_t n, float* s, float* o) {
  const int64_t G = W.cols() / 64, padded = slab_padded<kSwiglu>(n);
  if constexpr (!kSwiglu) {
    scales_f32(W.scales, W.scale_dtype, r0 * G, n * G, s);  // rows r0.. lie contiguously
    scales_f32(W.offsets, W.scale_dtype, r0 * G, n * G, o);
    std::fill(s + n * G, s + padded * G, 0.0f);
    std::fill(o + n * G, o + padded * G, 0.0f);
    return;
  }
  for (int64_t j = 0; j < padded; ++j) {
    const int64_t r = slab_row<kSwiglu>(W, r0, n, j);
    if (r < 0) {
      std::fill(s + j * G, s + (j + 1) * G, 0.0f);
      std::fill(o + j * G, o + (j + 1) * G, 0.0f);
      continue;
    }
    scales_f32(W.scales, W.scale_dtype, r * G, G, s + j * G);
    scales_f32(W.offsets, W.scale_dtype, r * G, G, o + j * G);
  }
}

// f[n0 .. n0 + 15][32 m] += group g's sums c[16][32] with the rows' scale s, offset o and the
// block's group sums xt (rows 32 floats / ints apart).
inline void fold_half(const int32_t* c, int n0, int64_t g, int64_t G, const float* s, const float* o, const float* xt,
                      float* f) {
  const __m512 x0 = _mm512_loadu_ps(xt + g * kMR), x1 = _mm512_loadu_ps(xt + g * kMR + 16);
  for (int n = n0; n < n0 + 16; ++n) {
    const __m512 sv = _mm512_set1_ps(s[n * G + g]), ov = _mm512_set1_ps(o[n * G + g]);
    float* fr = f + n * kMR;
    const int32_t* cr = c + (n - n0) * kMR;
    const __m512 f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cr)), sv, _mm512_load_ps(fr));
    const __m512 f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cr + 16)), sv, _mm512_load_ps(fr + 16));
    _mm512_store_ps(fr, _mm512_fmadd_ps(x0, ov, f0));
    _mm512_store_ps(fr + 16, _mm512_fmadd_ps(x1, ov, f1));
  }
}

// f[32 n][32 m] (zeroed first when g0 = 0) += groups [g0, g1) for 32 weight rows (wu: those
// groups unpacked, rows ldw apart) × one 32-row activation block a ([K/4][32] units), with
// per-row s, o ([32][G]) and the block's group sums xt ([G][32]).
// Each group's sums must leave the tiles before the next group can use them, and tiles are not
// renamed, so done in one piece (zero, 4 products, 4 stores) the groups ran one after another at
// the tiles' latency (~380 cycles per group and block, for 64 cycles of products). Staggered by
// half a block instead: the upper 16 weight rows of group g − 1 are stored while the lower rows
// of g compute, and the lower rows of g while the upper ones compute; each half is folded as soon
// as it is stored. c holds [2 halves][16][32] int32.
__attribute__((noinline)) void tile_fold(const uint8_t* wu, int64_t ldw, int64_t g0, int64_t g1, int64_t G,
                                         const uint32_t* a, const float* s, const float* o, const float* xt, float* f,
                                         int32_t* c) {
  int32_t* lo = c;
  int32_t* hi = c + 16 * kMR;
  if (g0 == 0) std::memset(f, 0, kNR * kMR * sizeof(float));
  for (int64_t g = g0; g < g1; ++g) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(4, wu + (g - g0) * 64, ldw);
    _tile_loadd(6, a + g * 16 * kMR, kMR * 4);
    _tile_loadd(7, a + g * 16 * kMR + 16, kMR * 4);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    if (g > g0) {
      _tile_stored(2, hi, kMR * 4);
      _tile_stored(3, hi + 16, kMR * 4);
      fold_half(hi, 16, g - 1, G, s, o, xt, f);
    }
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(5, wu + 16 * ldw + (g - g0) * 64, ldw);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
    _tile_stored(0, lo, kMR * 4);
    _tile_stored(1, lo + 16, kMR * 4);
    fold_half(lo, 0, g, G, s, o, xt, f);
  }
  _tile_stored(2, hi, kMR * 4);
  _tile_stored(3, hi + 16, kMR * 4);
  fold_half(hi, 16, g1 - 1, G, s, o, xt, f);
}

// The fused SwiGLU's epilogue (amx_store_swiglu) from a group's float sums f[n][m]: each value
// fma(f, s_x, bias) as the plain epilogue's (bias_g for the gate columns, bias_u for the up ones).
void epilogue_swiglu(const float* f, int rows, int cols, const float* sx, const float* bias_g, const float* bias_u,
                     float* out, int64_t ldo) {
  const __mmask16 cm = col_mask(cols);
  const __m512 vb[2] = {bias_g ? _mm512_maskz_loadu_ps(cm, bias_g) : _mm512_setzero_ps(),
                        bias_u ? _mm512_maskz_loadu_ps(cm, bias_u) : _mm512_setzero_ps()};
  amx_store_swiglu(reinterpret_cast<const uint32_t*>(f), rows, cols, out, ldo, [&](__m512i v, int m, int half) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(sx[m]), vb[half]);
  });
}

// y[m0:m1, n0:n1] (m0 % kMR == 0), blocked as the AMX GEMMs (gemm_amx.cpp): slabs of kSlabMax
// weight rows, their groups in chunks of GC (groups_per_chunk), every activation block across the
// slab's 32-row groups per chunk, the float sums f of each (block, group) kept between chunks
// (with one chunk, one f is reused). kSwiglu: W = [gate; up], y = out [M, F] and [n0, n1) its
// columns; a slab is kSlabMax / 2 columns, a 32-row group 16 columns' gate and up rows.
template <bool kSwiglu>
void w4a8_block(const uint32_t* qa, const float* sx, const float* xt, int64_t m0, int64_t m1, int64_t K,
                const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, int64_t GC) {
  amx_configure_tiles();
  const int64_t G = K / 64, KU = K / 4, F = W.rows() / 2;
  const int64_t SL = kSwiglu ? kSlabMax / 2 : kSlabMax, per_group = kSwiglu ? 16 : kNR;  // in columns of y
  const int64_t nblk = (m1 - m0 + kMR - 1) / kMR;
  static thread_local UnitScratch wu_buf, so_buf, f_buf;
  uint8_t* wu = wu_buf.get<uint8_t>(kSlabMax * GC * 64);
  float* s = so_buf.get<float>(2 * kSlabMax * G);
  float* o = s + kSlabMax * G;
  alignas(64) int32_t c[kNR * kMR];
  alignas(64) float f_one[kNR * kMR];
  for (int64_t sb = n0; sb < n1; sb += SL) {
    const int64_t sn = std::min(SL, n1 - sb), ng = (sn + per_group - 1) / per_group;
    float* fall = GC < G ? f_buf.get<float>(nblk * ng * kNR * kMR) : nullptr;  // [block][group][32][32]
    unpack_scales<kSwiglu>(W, sb, sn, s, o);
    for (int64_t g0 = 0; g0 < G; g0 += GC) {
      const int64_t g1 = std::min(G, g0 + GC);
      unpack_rows<kSwiglu>(W, sb, sn, g0, g1 - g0, wu, GC * 64);
      for (int64_t m = m0; m < m1; m += kMR) {
        const int64_t mb = (m - m0) / kMR;
        const int rows = static_cast<int>(std::min<int64_t>(kMR, m1 - m));
        for (int64_t gi = 0; gi < ng; ++gi) {
          const int64_t nb = gi * per_group, wr = gi * kNR;  // first column of y / tile row of the group
          float* f = fall ? fall + (mb * ng + gi) * kNR * kMR : f_one;
          tile_fold(wu + wr * GC * 64, GC * 64, g0, g1, G, qa + (m / kMR) * KU * kMR, s + wr * G, o + wr * G,
                    xt + (m / kMR) * G * kMR, f, c);
          if (g1 < G) continue;
          const int cols = static_cast<int>(std::min<int64_t>(per_group, sn - nb));
          if constexpr (kSwiglu) {
            epilogue_swiglu(f, rows, cols, sx + m, bias ? bias + sb + nb : nullptr, bias ? bias + F + sb + nb : nullptr,
                            y + m * ldy + sb + nb, ldy);
            continue;
          }
          __m512 vb[2];
          for (int q = 0; q < 2; ++q)
            vb[q] = bias ? _mm512_maskz_loadu_ps(col_mask(std::max(0, cols - q * 16)), bias + sb + nb + q * 16)
                         : _mm512_setzero_ps();
          amx_store_transposed(reinterpret_cast<const uint32_t*>(f), rows, cols, y + m * ldy + sb + nb, ldy,
                               [&](__m512i v, int r, int q) {
                                 return _mm512_fmadd_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(sx[m + r]), vb[q]);
                               });
        }
      }
    }
  }
}

// The whole W4A8 linear; kSwiglu: out [M, W.rows() / 2] of W = [gate; up] (registry.h).
template <bool kSwiglu>
void w4a8_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t KU = K / 4, G = K / 64, blocks = (M + kMR - 1) / kMR;
  static thread_local UnitScratch qa_buf, sx_buf, xt_buf;
  uint32_t* qa = qa_buf.get<uint32_t>(blocks * KU * kMR);  // [blocks][KU][32] int8 units
  float* sx = sx_buf.get<float>(blocks * kMR);              // row scales (0 for pad rows)
  float* xt = xt_buf.get<float>(blocks * G * kMR);          // [blocks][G][32] group sums of q
  static_assert(kMR == 32, "quantize_w4a8_blocks_z writes 32-row blocks");
  quantize_w4a8_blocks_z(x, M, K, ldx, 0, pool, qa, xt, sx);
  const int64_t N = kSwiglu ? W.rows() / 2 : W.rows();
  const int64_t GC = groups_per_chunk(K);
  split_gemm(M, N, kMR, kSwiglu ? 16 : kNR, kSwiglu ? kItem / 2 : kItem, pool,
             [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
               w4a8_block<kSwiglu>(qa, sx, xt, m0, m1, K, W, n0, n1, bias_f32, y, ldy, GC);
             });
}

}  // namespace

void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  w4a8_linear<false>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

bool linear_q4_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn) {  // silu_v inline, as gemm_amx.cpp
  w4a8_linear<true>(x, M, K, W, bias_f32, out, pool, ldx, ldo);
  return true;
}

}  // namespace klein::kernels::amx
