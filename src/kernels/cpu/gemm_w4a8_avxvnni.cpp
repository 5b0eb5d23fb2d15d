// AVX-VNNI W4A8 GEMM for Q4_G64 weights (Precision::kFast), for CPUs with AVX-VNNI but no
// AVX-512 (Alder Lake and later client cores), which otherwise run the AVX2 kernel's vpmaddubsw
// int16 chains: ~2 instructions per 32 multiply-adds where one vpdpbusd ymm does them.
// Arithmetic: ref::linear_w4a8 in the float32 steps of gemm_w4a8_common.h — per output and group
// g, f = fma(float(A_g), s_g, f), f = fma(X_g, o_g, f); y = fma(f, s_x, bias) — so the same bits
// as the AVX2, AVX512_VNNI and AMX kernels.
//
// The AVX512_VNNI kernel's design on ymm (gemm_w4a8_avx512vnni.cpp): the tile computes yᵀ, its
// lanes along M, broadcasting 4-byte units of weight rows whose nibbles are spread to bytes once
// per slab (rows read in order, no panel transpose). One difference: vpdpbusd takes its first
// operand unsigned and its second signed, so the broadcast nibbles (0..15) go first and the
// activations stay signed int8 — A_g comes out exact with no +128 bias and no −128 · Σ nibbles
// correction.
//
//   1. x is quantized per row as ref::quantize_row_int8 (quantize_row_avx2, signed) into blocks
//      of 16 rows stored [K/4][16] 4-byte units, with each row's group sums X_g = Σ q (exact as
//      float: |X_g| ≤ 64 · 127) stored [G][16] per block.
//   2. The driver (gemm_w4a8_direct.h, shared with the AVX512_VNNI kernel): threads take work
//      items of columns; per slab of weight rows (≤ a quarter of L2 once unpacked) the nibbles
//      → bytes (rows ldw apart), per group and row the scale and offset as float, group-major.
//   3. Per 16-row block of x, across the slab's 6-row tiles, over the whole K: per group the
//      int32 sums in registers, then the fold into float32 sums kept in L1.
//
// Registers: 12 int32 accumulators (16 rows × 6 columns), 2 activation vectors and one broadcast
// = 15 of 16, as the W8A8 AVX-VNNI tile; the float32 sums are folded into L1 per group.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/avxvnni_common.h"
#include "kernels/cpu/gemm_direct.h"
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_w4a8_direct.h"
#include "kernels/cpu/gemm_units.h"
#include "kernels/cpu/q4_unpack.h"

namespace klein::kernels::avxvnni {
namespace {

constexpr int kMR = 16;           // rows of x per tile (two ymm of lanes)
constexpr int kNC = 6;            // weight rows (columns of y) per tile
constexpr int64_t kSlabMax = 96;  // most weight rows per slab (a multiple of kNC)
constexpr int64_t kItem = 384;    // columns per thread work item (a few slabs: each prefetches the next)
// (Prefetching the activations 32 units ahead into L1, as the W8A8 tile does, measured the same.)

// x → qa [blocks][K/4][16] signed int8 units, xs [blocks][G][16] group sums, sx [blocks · 16] row
// scales (pad rows: zero units, sums and scales). K % 64 == 0.
void quantize_blocks(const float* x, int64_t M, int64_t K, int64_t ldx, ThreadPool& pool, uint32_t* qa, float* xs,
                     float* sx) {
  const int64_t KU = K / 4, G = K / 64, blocks = (M + kMR - 1) / kMR;
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    static thread_local UnitScratch rows_buf;
    uint8_t* rows = rows_buf.get<uint8_t>(kMR * K);
    // Σ q over 64 bytes = Σ (q + 128) − 64 · 128, the biased bytes summed by vpsadbw.
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80)), zero = _mm256_setzero_si256();
    for (int64_t b = b0; b < b1; ++b) {
      const int n = static_cast<int>(std::min<int64_t>(kMR, M - b * kMR));
      float* xb = xs + b * G * kMR;
      for (int r = 0; r < kMR; ++r) {
        uint8_t* q = rows + r * K;
        if (r >= n) {
          sx[b * kMR + r] = 0.0f;
          std::memset(q, 0, K);
          for (int64_t g = 0; g < G; ++g) xb[g * kMR + r] = 0.0f;
          continue;
        }
        quantize_row_avx2(x + (b * kMR + r) * ldx, K, K, 0, q, &sx[b * kMR + r]);
        for (int64_t g = 0; g < G; ++g) {
          const auto* p = reinterpret_cast<const __m256i*>(q + g * 64);
          const __m256i s = _mm256_add_epi64(_mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256(p), bias), zero),
                                             _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256(p + 1), bias), zero));
          const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
          const int64_t t = _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1);
          xb[g * kMR + r] = static_cast<float>(t - 64 * 128);
        }
      }
      // Units of 8 rows × 8 units at a time by an 8 × 8 transpose (KU % 16 == 0).
      uint32_t* d = qa + b * KU * kMR;
      for (int r0 = 0; r0 < kMR; r0 += 8)
        for (int64_t u = 0; u < KU; u += 8) {
          __m256i v[8];
          for (int r = 0; r < 8; ++r)
            v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + (r0 + r) * K + u * 4));
          transpose8x8(v);
          for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + (u + i) * kMR + r0), v[i]);
        }
    }
  });
}

// y[rows × NC] (rows ldy apart) for a 16-row block a [K/4][16] and NC unpacked weight rows at
// w + j·ldw. Per group g and row j: s, o at s[g·lds + j], o[g·lds + j] (group-major, as the
// AVX512_VNNI kernel's; no int32 start: the driver's nsum is unused); the block's group sums
// xs [G][16] and row scales sx [16]. The float32 sums live in f [kNC][16] (the driver's scratch, L1): in registers with the int32 ones only 8 rows × 6 columns fit,
// which needs a broadcast per vpdpbusd (one per two here) and ran at ~60 % of the vpdpbusd peak.
// noinline: inlined into the driver, GCC kept stack copies of accumulators in the int8 kernels.
template <int NC>
__attribute__((noinline)) void tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t G, int64_t lds,
                                    const float* s, const float* o, const int32_t*, const float* xs,
                                    SlicePrefetch* pf, const float* sx, const float* bias, float* f, float* y,
                                    int64_t ldy, int rows) {
  // Two row pointers and the strides 1·ldw, 2·ldw reach the 6 rows by addressing modes.
  const uint8_t* w0 = w;
  const uint8_t* w3 = w + 3 * ldw;
  const int64_t l2 = 2 * ldw;
  for (int i = 0; i < NC * kMR; i += 8) _mm256_store_ps(f + i, _mm256_setzero_ps());
  for (int64_t g = 0; g < G; ++g) {
    pf->step();
#define KV_DECL(j) __m256i c##j##_0 = _mm256_setzero_si256(), c##j##_1 = c##j##_0;
    KV_DECL(0) KV_DECL(1) KV_DECL(2) KV_DECL(3) KV_DECL(4) KV_DECL(5)
#undef KV_DECL
#define KV_COL(j, p, off)                                               \
  if constexpr (NC > j) {                                               \
    int32_t u;                                                          \
    std::memcpy(&u, p + off, 4);                                        \
    const __m256i bv = _mm256_set1_epi32(u);                            \
    c##j##_0 = _mm256_dpbusd_avx_epi32(c##j##_0, bv, a0);               \
    c##j##_1 = _mm256_dpbusd_avx_epi32(c##j##_1, bv, a1);               \
  }
    // Fully unrolled, as the AVX512_VNNI kernel's (a partial unroll rotated the accumulators
    // through registers with a move per vpdpbusd).
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {
      const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
      const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 8));
      KV_COL(0, w0, 0) KV_COL(1, w0, ldw) KV_COL(2, w0, l2)
      KV_COL(3, w3, 0) KV_COL(4, w3, ldw) KV_COL(5, w3, l2)
      a += kMR;
      w0 += 4, w3 += 4;
    }
#undef KV_COL
    const __m256 x0 = _mm256_loadu_ps(xs + g * kMR), x1 = _mm256_loadu_ps(xs + g * kMR + 8);
#define KV_FOLD(j)                                                                                      \
  if constexpr (NC > j) {                                                                               \
    const __m256 sv = _mm256_set1_ps(s[j]), ov = _mm256_set1_ps(o[j]);                                  \
    float* fj = f + j * kMR;                                                                            \
    const __m256 t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c##j##_0), sv, _mm256_load_ps(fj));            \
    const __m256 t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c##j##_1), sv, _mm256_load_ps(fj + 8));        \
    _mm256_store_ps(fj, _mm256_fmadd_ps(x0, ov, t0));                                                   \
    _mm256_store_ps(fj + 8, _mm256_fmadd_ps(x1, ov, t1));                                               \
  }
    KV_FOLD(0) KV_FOLD(1) KV_FOLD(2) KV_FOLD(3) KV_FOLD(4) KV_FOLD(5)
#undef KV_FOLD
    s += lds, o += lds;
  }
  // y = fma(f, s_x, bias) per column (lanes = rows), then per 8 rows an 8 × 8 transpose into
  // rows of y.
  const __m256i cm = first_lanes(NC);
  for (int h = 0; h < 2 && h * 8 < rows; ++h) {
    const __m256 sxh = _mm256_loadu_ps(sx + h * 8);
    __m256i r[8];
    for (int j = 0; j < 8; ++j)
      r[j] = j < NC ? _mm256_castps_si256(_mm256_fmadd_ps(_mm256_load_ps(f + j * kMR + h * 8), sxh,
                                                          _mm256_set1_ps(bias ? bias[j] : 0.0f)))
                    : _mm256_setzero_si256();
    transpose8x8(r);
    const int n = std::min(8, rows - h * 8);
    for (int i = 0; i < n; ++i) _mm256_maskstore_ps(y + (h * 8 + i) * ldy, cm, _mm256_castsi256_ps(r[i]));
  }
}

// Rows [r0, r0 + n) of W unpacked: nibbles → bytes wu[j·ldw + k] in element order, s and o as
// float [g][lds] (row scratch t: 2·G floats).
void unpack_slab(const Weight& W, int64_t r0, int64_t n, uint8_t* wu, int64_t ldw, int64_t lds, int32_t*, float* s,
                 float* o, float* t) {
  const int64_t K = W.cols(), G = K / 64;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* src = static_cast<const uint8_t*>(W.data) + (r0 + j) * (K / 2);
    for (int64_t h = 0; h < 2 * G; ++h)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wu + j * ldw + h * 32), q4_spread16(src + h * 16));
    scales_to_f32(W.scales, W.scale_dtype, (r0 + j) * G, G, t);
    scales_to_f32(W.offsets, W.scale_dtype, (r0 + j) * G, G, t + G);
    for (int64_t g = 0; g < G; ++g) s[g * lds + j] = t[g], o[g * lds + j] = t[G + g];
  }
}

// The micro-kernel set for the direct driver (gemm_w4a8_direct.h).
struct Vnni256 {
  static constexpr int kMR = avxvnni::kMR, kNC = avxvnni::kNC, kScratch = kNC * kMR;
  static constexpr int64_t kSlabMax = avxvnni::kSlabMax, kItem = avxvnni::kItem;
  static constexpr auto quantize = quantize_blocks;
  static constexpr auto unpack_slab = avxvnni::unpack_slab;
  template <int NC>
  static constexpr auto tile = avxvnni::tile<NC>;
};

}  // namespace

void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  w4a8_direct_linear<Vnni256>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

bool linear_q4_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul) {
  w4a8_direct_linear<Vnni256>(x, M, K, W, bias_f32, out, pool, ldx, ldo, silu_mul);
  return true;
}

}  // namespace klein::kernels::avxvnni
