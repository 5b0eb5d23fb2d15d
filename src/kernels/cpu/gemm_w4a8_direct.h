// The W4A8 GEMM driver that reads the weight rows in order, shared by the VNNI kernels for Q4_G64
// weights (gemm_w4a8_avx512vnni.cpp on zmm, gemm_w4a8_avxvnni.cpp on ymm); the AVX2 kernel keeps
// the packing driver (gemm_w4a8_common.h). As the W8A8 direct driver (gemm_direct.h) the tile
// computes yᵀ: its lanes run along M and it broadcasts 4-byte units of weight rows, so the
// weights need no transpose, only their nibbles spread to bytes, row after row, once per slab.
//
//   1. x is quantized per row as ref::quantize_row_int8 into blocks of UK::kMR rows stored
//      [K/4][kMR] 4-byte units, with each row's group sums X_g = Σ q ([G][kMR] per block) and
//      scales (UK::quantize).
//   2. Threads take work items of columns (split_gemm). Per slab of weight rows (≤ a quarter of
//      L2 once unpacked, rows at spread_stride(K)): the nibbles spread to bytes and, per group
//      and row, the scale, the offset and (where the tile needs it) an int32 start, group-major
//      (UK::unpack_slab); the next slab's nibbles are prefetched into L2 over this one's tiles.
//   3. Per kMR-row block of x, across the slab's kNC-row tiles, over the whole K: UK::tile<NC>.
//
// UK supplies kMR, kNC, kSlabMax (a multiple of kNC), kItem (columns per work item), kScratch
// (floats of per-thread L1 scratch a tile may use, ≥ 1),
//   quantize(x, M, K, ldx, pool, qa, xs, sx),
//   unpack_slab(W, r0, n, wu, ldw, lds, nsum, s, o, t)   (t: 2·G floats of row scratch),
//   tile<NC>(a, w, ldw, G, lds, s, o, nsum, xs, pf, sx, bias, scratch, y, ldy, rows)   1 ≤ NC ≤ kNC.
//
// Include ONLY from the VNNI W4A8 files: everything has internal linkage.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_direct.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

struct W4a8Act {
  const uint32_t* qa;  // [blocks][K/4][kMR] int8 units (as UK::quantize stores them)
  const float* xs;     // [blocks][G][kMR] group sums of q (0 for pad rows)
  const float* sx;     // [blocks · kMR] row scales (0 for pad rows)
};

// y[m0:m1, n0:n1] (m0 % UK::kMR == 0). With silu_mul the fused SwiGLU as the W8A8 direct
// driver's (gemm_direct.h): W = [gate; up], [n0, n1) columns of out = y [M, F], each slab a gate
// half and an up half unpacked apart, each block's tiles of both into an L1 scratch that silu_mul
// combines into y.
template <class UK>
void w4a8_direct_block(const W4a8Act& act, int64_t m0, int64_t m1, int64_t K, const Weight& W, int64_t n0,
                       int64_t n1, const float* bias, float* y, int64_t ldy,
                       void (*silu_mul)(const float*, const float*, float*, int64_t) = nullptr) {
  constexpr int MR = UK::kMR, NC = UK::kNC;
  const int64_t G = K / 64, KQ = K / 4, F = W.rows() / 2;
  const int64_t ldw = spread_stride(K);  // the tile streams NC rows at once
  const int64_t SL0 = std::clamp<int64_t>(direct_slab_bytes() / ldw / NC * NC, NC, UK::kSlabMax);
  const int64_t SL = silu_mul ? std::max<int64_t>(NC, SL0 / 2 / NC * NC) : SL0;  // SwiGLU: two halves
  const int halves = silu_mul ? 2 : 1;
  static thread_local UnitScratch wu_buf[2], nsum_buf[2], so_buf[2], ys_buf;
  alignas(64) float scratch[UK::kScratch];
  uint8_t* wu[2];
  int32_t* nsum[2];
  float *s[2], *o[2], *t[2];
  for (int h = 0; h < halves; ++h) {
    wu[h] = wu_buf[h].get<uint8_t>(SL * ldw);
    nsum[h] = nsum_buf[h].get<int32_t>(SL * G);  // [G][SL], as s and o
    s[h] = so_buf[h].get<float>(2 * SL * G + 2 * G);
    o[h] = s[h] + SL * G;
    t[h] = o[h] + SL * G;
  }
  const SwigluOut out{silu_mul, silu_mul ? ys_buf.get<float>(MR * 2 * SL) : nullptr, SL, y, ldy};
  for (int64_t sb = n0; sb < n1; sb += SL) {
    const int64_t sn = std::min(SL, n1 - sb);
    for (int h = 0; h < halves; ++h) UK::unpack_slab(W, sb + h * F, sn, wu[h], ldw, SL, nsum[h], s[h], o[h], t[h]);
    // The next slab's nibbles are prefetched into L2 over this slab's tiles, a few lines per group
    // (SwiGLU: each half's next rows over its own tiles).
    const int64_t next = std::clamp<int64_t>(n1 - sb - SL, 0, SL);
    const int64_t tiles = ((m1 - m0 + MR - 1) / MR) * ((sn + NC - 1) / NC);
    const auto* base = static_cast<const uint8_t*>(W.data);
    SlicePrefetch pf[2] = {SlicePrefetch(base + (next > 0 ? (sb + SL) * (K / 2) : 0), K / 2, next, K / 2, tiles * G),
                           SlicePrefetch(base + (next > 0 && silu_mul ? (F + sb + SL) * (K / 2) : 0), K / 2,
                                         silu_mul ? next : 0, K / 2, tiles * G)};
    for (int64_t m = m0; m < m1; m += MR) {
      const int64_t b = m / MR;
      const int rows = static_cast<int>(std::min<int64_t>(MR, m1 - m));
      out.block<NC>(m, sb, sn, rows, [&](int h, int64_t nb, auto nc, float* yt, int64_t ldt) {
        const int64_t col0 = sb + h * F;  // the half's first row of W (bias index)
        UK::template tile<nc()>(act.qa + b * KQ * MR, wu[h] + nb * ldw, ldw, G, SL, s[h] + nb, o[h] + nb, nsum[h] + nb,
                                act.xs + b * G * MR, &pf[h], act.sx + m, bias ? bias + col0 + nb : nullptr, scratch, yt,
                                ldt, rows);
      });
    }
  }
}

// The whole W4A8 linear (kernels.h semantics; K % 64 == 0 as Q4_G64 requires) with UK; with
// silu_mul the fused SwiGLU (registry.h's LinearSwigluFn).
template <class UK>
void w4a8_direct_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                        ThreadPool& pool, int64_t ldx, int64_t ldy,
                        void (*silu_mul)(const float*, const float*, float*, int64_t) = nullptr) {
  constexpr int MR = UK::kMR;
  static_assert(UK::kSlabMax % UK::kNC == 0);
  const int64_t KQ = K / 4, G = K / 64, blocks = (M + MR - 1) / MR;
  // Reused between calls (grow-only, as the W8A8 kernels' scratch).
  static thread_local UnitScratch qa_buf, xs_buf, sx_buf;
  uint32_t* qa = qa_buf.get<uint32_t>(blocks * KQ * MR);
  float* xs = xs_buf.get<float>(blocks * G * MR);
  float* sx = sx_buf.get<float>(blocks * MR);
  UK::quantize(x, M, K, ldx, pool, qa, xs, sx);
  const W4a8Act act{qa, xs, sx};
  const int64_t N = silu_mul ? W.rows() / 2 : W.rows(), item = silu_mul ? UK::kItem / 2 : UK::kItem;
  split_gemm(M, N, MR, UK::kNC, item, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    w4a8_direct_block<UK>(act, m0, m1, K, W, n0, n1, bias, y, ldy, silu_mul);  // m0 % MR == 0
  });
}

}  // namespace
}  // namespace klein::kernels
