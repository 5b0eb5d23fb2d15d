// The GEMM driver that reads the weights where they lie (the mapped file), with no panel
// packing: the W8A8 kernels on Q8_ROW weights (AVX512_VNNI, AVX-VNNI) and the AVX512_BF16 one on
// BF16 weights; gemm_int8_common.h has the packing driver of the AVX2 W8A8 kernel.
//
// Why: a packed-panel GEMM transposes every weight into 4-byte column units for each call, which
// took ~14 % of a W8A8 GEMM at M = 256 on a Xeon (the weights are read cold, at a stride of K,
// and the micro-kernel itself ran at ~97 % of the vpdpbusd peak on hot operands), and 6.7 % of a
// bf16 + fast image's samples on Zen 4. Here the micro-kernel computes yᵀ instead: its vector
// lanes run along M (the activations, packed once per call) and it broadcasts one 4-byte unit of
// a weight row — 4 consecutive int8 k or 2 bf16 k of one output column, which is how [N, K]
// row-major weights already lie in memory. vpdpbusd wants the broadcast operand signed and the
// vector one unsigned, so int8 activations are stored as u8 = q + 128 and corr[n] = 128 ·
// Σ_k W[n, k] is subtracted, summed per slab from the same rows (that pass also brings them into
// L1/L2 ahead of the tiles).
//
//   1. x is quantized per row exactly as ref::quantize_row_int8 (or rounded to bf16), into blocks
//      of MR rows stored [M / MR][KQ][MR] 4-byte units (Kp bytes per row: int8 K rounded up to 4,
//      zero padded; bf16 2K; pad rows hold 0).
//   2. The threads take work items of a few slabs of columns (all rows each).
//   3. Per slab of columns (int8: corr and the weight scales), for each MR-row block, across the
//      slab, the micro-kernel sums the MR × NC tile over the whole K in registers and stores it:
//      int8 y = (float(acc − corr[n]) · s_x[m]) · s_w[n] + bias[n], each step rounded to float32
//      as in ref::linear_w8a8 (bit for bit; these files are compiled with -ffp-contract=off);
//      bf16 y = acc + bias[n].
//
// UK supplies kMR, kNC, kElemBytes (bytes per stored weight: 1 int8, 2 bf16),
// quantize_row(x, K, Kp, q, &s) (Kp bytes of activation units and the row's scale),
// rowsum(w, K) → Σ of K int8 (int8 only), pack_rows(rows, ld, n, KQ, qa) (units of n rows, zero
// above), and tile<NC>(a, w, ldw, nq, pf, corr, sx, sw, bias, y, ldy, rows) for 1 ≤ NC ≤ kNC.
//
// Include ONLY from SIMD files whose micro-kernel it drives: everything has internal linkage.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

// The weight rows of a slab of columns take up to a quarter of this core's L2 (the rest holds
// the prefetched next slab, the activation stream and y).
inline int64_t direct_slab_bytes() {
  static const int64_t bytes = l2_cache_bytes() / 4;
  return bytes;
}

// Where an MR-row block's tiles write (this driver's and gemm_w4a8_direct.h's): with silu_mul
// (the fused SwiGLU) half h (0 gate, 1 up) into the scratch ys [MR][gate SL | up SL], which
// block() then combines by silu_mul into y's columns; without, straight into y.
struct SwigluOut {
  void (*silu_mul)(const float*, const float*, float*, int64_t);
  float* ys;
  int64_t SL;
  float* y;
  int64_t ldy;
  float* half(int h, int64_t m, int64_t sb) const { return silu_mul ? ys + h * SL : y + m * ldy + sb; }
  int64_t ld() const { return silu_mul ? 2 * SL : ldy; }

  // The tiles of the MR-row block at m across the slab's sn columns from sb, for each half:
  // tile(h, nb, nc, yt, ldt) for columns [nb, nb + nc) (nc ≤ NC as a template constant) into yt
  // (rows ldt apart); then, fused, silu_mul over the block's rows.
  template <int NC, class Tile>
  void block(int64_t m, int64_t sb, int64_t sn, int rows, const Tile& tile) const {
    for (int h = 0; h < (silu_mul ? 2 : 1); ++h)
      for (int64_t nb = 0; nb < sn; nb += NC)
        with_cols<NC>(static_cast<int>(std::min<int64_t>(NC, sn - nb)),
                      [&](auto nc) { tile(h, nb, nc, half(h, m, sb) + nb, ld()); });
    if (silu_mul)
      for (int r = 0; r < rows; ++r) silu_mul(ys + r * 2 * SL, ys + r * 2 * SL + SL, y + (m + r) * ldy + sb, sn);
  }
};

constexpr int64_t kDirectSlab = 96;   // most columns per slab (a multiple of every kNC)
constexpr int64_t kDirectItem = 384;  // columns per thread work item: a few slabs, so that each
                                      // slab but the first is prefetched by the one before

// y[m0:m1, n0:n1] (m0 % MR == 0) in slabs of columns: per slab (int8) the row sums and weight
// scales, then each MR-row block runs across the slab's tiles — the slab's rows stay in L2 and each row
// segment of y is written whole by consecutive tiles (tiles down a column instead, each writing
// 48 B of a y line, measured 5-10 % slower at K = 3072 and the same at K = 9216).
// With silu_mul (the fused SwiGLU, W = [gate; up], F rows each): [n0, n1) are columns of
// out = y [M, F]; a slab is a gate half (rows sb ..) and an up half (rows F + sb ..), each MR-row
// block's tiles write both halves into an L1 scratch and silu_mul combines them into y — the
// [M, 2F] hidden never goes to memory.
template <class UK>
void direct_block(const uint32_t* qa, int64_t KQ, const float* sx, int64_t m0, int64_t m1, int64_t K,
                  const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy,
                  void (*silu_mul)(const float*, const float*, float*, int64_t) = nullptr) {
  constexpr int MR = UK::kMR, NC = UK::kNC;
  const int64_t Kp = KQ * 4, RB = K * UK::kElemBytes;  // bytes of a row of units / of a stored row
  const int64_t SL0 = std::clamp<int64_t>(direct_slab_bytes() / Kp / NC * NC, NC, kDirectSlab);
  const int64_t SL = silu_mul ? std::max<int64_t>(NC, SL0 / 2 / NC * NC) : SL0;  // SwiGLU: two halves
  const int halves = silu_mul ? 2 : 1;
  const int64_t F = W.rows() / 2;
  static thread_local UnitScratch conv_buf[2], ys_buf;
  alignas(64) int32_t corr[2][kDirectSlab];
  alignas(64) float sw[2][kDirectSlab];
  const SwigluOut out{silu_mul, silu_mul ? ys_buf.get<float>(MR * 2 * SL) : nullptr, SL, y, ldy};
  for (int64_t sb = n0; sb < n1; sb += SL) {
    const int64_t sn = std::min(SL, n1 - sb);
    // A tile reads NC rows at once, ldw apart: at a multiple of 2 KB (K = 4096, 12288) their
    // lines share one or two L1 sets and evict each other, so the slab is copied to a stride of
    // one more line (the copy stays in L2). Zen 4, M = 256, K = 12288 → N = 3072: 73-85 → 92-98 %
    // of the vpdpbusd peak, as K = 12352 in place.
    const uint8_t* src[2];
    const uint8_t* w[2];
    int64_t ldw = 0;
    for (int h = 0; h < halves; ++h) {
      const int64_t r0 = sb + h * F;
      src[h] = static_cast<const uint8_t*>(W.data) + r0 * RB;
      // Not a structured binding: clang 14 rejects those inside requires-expressions and lambdas.
      const auto slab_rows = unit_padded_rows(src[h], RB, Kp, sn, conv_buf[h], /*spread=*/true);
      w[h] = slab_rows.first;
      ldw = slab_rows.second;
      if constexpr (UK::kElemBytes == 1)
        for (int64_t j = 0; j < sn; ++j) {
          corr[h][j] = UK::rowsum(w[h] + j * ldw, Kp);
          sw[h][j] = scale_at(W.scales, W.scale_dtype, r0 + j);
        }
    }
    // The next slab's rows are prefetched into L2 over this slab's tiles, a few lines per 16
    // units (without: ~15 % of the time went to the row sums' first reads; all of them in one
    // tile cost that tile's own streams ~7 %). They are fetched where they lie, also when the
    // slab is then copied. (SwiGLU: each half's next rows over its own tiles.)
    const int64_t next = std::clamp<int64_t>(n1 - sb - SL, 0, SL);
    const int64_t tiles = ((m1 - m0 + MR - 1) / MR) * ((sn + NC - 1) / NC);
    SlicePrefetch pf[2] = {SlicePrefetch(next > 0 ? src[0] + SL * RB : src[0], RB, next, RB, tiles * (KQ / 16)),
                           SlicePrefetch(next > 0 && silu_mul ? src[1] + SL * RB : src[0], RB, silu_mul ? next : 0,
                                         RB, tiles * (KQ / 16))};
    for (int64_t m = m0; m < m1; m += MR) {
      const int rows = static_cast<int>(std::min<int64_t>(MR, m1 - m));
      out.block<NC>(m, sb, sn, rows, [&](int h, int64_t nb, auto nc, float* yt, int64_t ldt) {
        const int64_t col0 = sb + h * F;  // the half's first row of W (bias index)
        UK::template tile<nc()>(qa + (m / MR) * KQ * MR, w[h] + nb * ldw, ldw, KQ, &pf[h], corr[h] + nb, sx + m,
                                sw[h] + nb, bias ? bias + col0 + nb : nullptr, yt, ldt, rows);
      });
    }
  }
}

// The whole linear (kernels.h semantics) with micro-kernel UK; with silu_mul the fused SwiGLU
// (registry.h's LinearSwigluFn: W = [gate; up], y = out [M, W.rows() / 2]).
template <class UK>
void direct_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                   ThreadPool& pool, int64_t ldx, int64_t ldy,
                   void (*silu_mul)(const float*, const float*, float*, int64_t) = nullptr) {
  constexpr int MR = UK::kMR;
  static_assert(kDirectSlab % UK::kNC == 0);
  // Bytes of a row of whole 4-byte units: int8 padded to 4, bf16 pairs (an even K).
  const int64_t Kp = (K * UK::kElemBytes + 3) / 4 * 4, KQ = Kp / 4, blocks = (M + MR - 1) / MR;
  // Reused between calls (a fresh vector's page faults and zeroing were ~5 % at M = 256).
  static thread_local UnitScratch qa_buf, sx_buf;
  uint32_t* qa = qa_buf.get<uint32_t>(blocks * KQ * MR);  // [blocks][KQ][MR] u8 = q + 128
  float* sx = sx_buf.get<float>(blocks * MR);             // per row; 0 for the pad rows
  // Each block's rows are quantized into a row-major scratch, then transposed into units by
  // UK::pack_rows (storing each row's units straight into the block, 128 B apart, was ~8 %).
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    static thread_local UnitScratch rows_buf;
    uint8_t* rows = rows_buf.get<uint8_t>(MR * Kp);
    for (int64_t b = b0; b < b1; ++b) {
      const int n = static_cast<int>(std::min<int64_t>(MR, M - b * MR));
      for (int r = 0; r < n; ++r) UK::quantize_row(x + (b * MR + r) * ldx, K, Kp, rows + r * Kp, &sx[b * MR + r]);
      for (int r = n; r < MR; ++r) sx[b * MR + r] = 0.0f;
      UK::pack_rows(rows, Kp, n, KQ, qa + b * KQ * MR);
    }
  });
  // All rows in one pass: every weight row is read from memory once per call. Superblocks of
  // rows whose packed activations fit in half the L2 (W re-read once per superblock) measured
  // 5-10 % faster on a single GEMM whose W stayed in L3, but in the pipeline, where W comes
  // from DRAM, 512² q8 denoising took 79.6 s with them against 60.6 s without (Xeon, 2 threads).
  const int64_t N = silu_mul ? W.rows() / 2 : W.rows(), item = silu_mul ? kDirectItem / 2 : kDirectItem;
  split_gemm(M, N, MR, UK::kNC, item, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    direct_block<UK>(qa, KQ, sx, m0, m1, K, W, n0, n1, bias, y, ldy, silu_mul);  // m0 % MR == 0
  });
}

}  // namespace
}  // namespace klein::kernels
