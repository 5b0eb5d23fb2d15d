// The W8A8 GEMM driver that reads the Q8_ROW weights where they lie (the mapped file): no panel
// packing. Used by the VNNI kernels; gemm_int8_common.h has the packing driver (AVX2) and the
// shared quantization.
//
// Why: a packed-panel GEMM transposes every weight byte into 4-byte column units for each call,
// which took ~14 % of a W8A8 GEMM at M = 256 on a Xeon (the weights are read cold, at a stride
// of K, and the micro-kernel itself ran at ~97 % of the vpdpbusd peak on hot operands). Here
// the micro-kernel computes yᵀ instead: its vector lanes run along M (the activations, packed
// once per call) and it broadcasts one 4-byte unit of a weight row — 4 consecutive k of one
// output column, which is how [N, K] row-major int8 weights already lie in memory. vpdpbusd
// wants the broadcast operand signed and the vector one unsigned, so activations are stored as
// u8 = q + 128 and corr[n] = 128 · Σ_k W[n, k] is subtracted, summed per tile column from the
// same rows (that pass also brings them into cache ahead of the tile).
//
//   1. x is quantized per row exactly as ref::quantize_row_int8, into blocks of MR rows stored
//      [M / MR][KQ][MR] 4-byte units (Kp = K rounded up to 4, zero padded; pad rows hold 0).
//   2. Rows are processed in superblocks whose packed activations fit in L2 (int8_direct_a_bytes),
//      one pool.run each; within a superblock the threads take slabs of columns.
//   3. Per NC columns: corr and the weight scales; then for each MR-row block the micro-kernel
//      sums the MR × NC int32 tile over the whole K in registers and stores
//      y = (float(acc − corr[n]) · s_x[m]) · s_w[n] + bias[n], each step rounded to float32 as in
//      ref::linear_w8a8 (bit for bit; these files are compiled with -ffp-contract=off).
//
// UK supplies kMR, kNC, quantize_row(x, K, Kp, q, &s) (ref::quantize_row_int8 into u8 = q + 128),
// rowsum(w, K) → Σ of K int8, pack_rows(rows, ld, n, KQ, qa) (units of n
// rows, zero above), and
// tile_cols(nc, a, w, ldw, nq, corr, sx, sw, bias, y, ldy, rows).
//
// Include ONLY from the VNNI SIMD files: everything has internal linkage.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

// Packed activation bytes per superblock: 3/4 of this core's L2, so that the weight rows of the
// tile columns and y fit beside them (every row of W is re-read once per superblock). Measured
// on a Xeon with 2 MB of L2, M = 1024, 2 threads: 1.5 MB 5-10 % faster than 1 MB or 0.5 MB, and
// than no superblocks (A streamed from L3).
inline int64_t int8_direct_a_bytes() {
  static const int64_t bytes = l2_cache_bytes() * 3 / 4;
  return bytes;
}
constexpr int64_t kI8DirectNC = 96;  // columns per thread work item (a multiple of every kNC)

template <class UK>
void int8_direct_block(const uint32_t* qa, int64_t KQ, const float* sx, int64_t m0, int64_t m1, int64_t K,
                       const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int MR = UK::kMR, NC = UK::kNC;
  const int64_t Kp = KQ * 4;
  static thread_local UnitScratch conv_buf;
  alignas(64) int32_t corr[NC];
  alignas(64) float sw[NC];
  for (int64_t nb = n0; nb < n1; nb += NC) {
    const int nc = static_cast<int>(std::min<int64_t>(NC, n1 - nb));
    // The tile reads whole 4-byte units: rows whose K is not a multiple of 4 are copied, padded.
    const uint8_t* w = static_cast<const uint8_t*>(W.data) + nb * K;
    int64_t ldw = K;
    if (K != Kp) {
      uint8_t* c = conv_buf.get<uint8_t>(NC * Kp);
      for (int j = 0; j < nc; ++j) {
        std::memcpy(c + j * Kp, w + j * K, K);
        std::memset(c + j * Kp + K, 0, Kp - K);
      }
      w = c, ldw = Kp;
    }
    for (int j = 0; j < nc; ++j) {
      corr[j] = UK::rowsum(w + j * ldw, Kp);
      sw[j] = scale_at(W.scales, W.scale_dtype, nb + j);
    }
    // The next columns' rows are prefetched into L2 over these columns' tiles, a few lines per
    // 16 units (without: ~15 % of the time went to the row sums' first reads; all lines in the
    // first tile alone cost its own streams ~7 %). The padded copy (K % 4) is private: no prefetch.
    const int64_t next = K == Kp ? std::clamp<int64_t>(n1 - nb - NC, 0, NC) : 0;
    SlicePrefetch pf(w + NC * ldw, ldw, next, Kp, ((m1 - m0 + MR - 1) / MR) * (KQ / 16));
    for (int64_t m = m0; m < m1; m += MR)
      UK::tile_cols(nc, qa + (m / MR) * KQ * MR, w, ldw, KQ, &pf, corr, sx + m, sw, bias ? bias + nb : nullptr,
                    y + m * ldy + nb, ldy, static_cast<int>(std::min<int64_t>(MR, m1 - m)));
  }
}

// The whole W8A8 linear (kernels.h semantics) with micro-kernel UK.
template <class UK>
void int8_direct_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                        ThreadPool& pool, int64_t ldx, int64_t ldy) {
  constexpr int MR = UK::kMR;
  static_assert(kI8DirectNC % UK::kNC == 0);
  const int64_t Kp = (K + 3) / 4 * 4, KQ = Kp / 4, blocks = (M + MR - 1) / MR;
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
  // Rows per superblock: as even as possible (a short last one re-reads all of W for few rows).
  const int64_t cap = std::max<int64_t>(1, int8_direct_a_bytes() / (Kp * MR)), passes = (blocks + cap - 1) / cap;
  const int64_t super = (blocks + passes - 1) / passes * MR;
  for (int64_t s0 = 0; s0 < M; s0 += super) {
    const int64_t s1 = std::min(M, s0 + super);
    split_gemm(s1 - s0, W.rows(), MR, UK::kNC, kI8DirectNC, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      int8_direct_block<UK>(qa, KQ, sx, s0 + m0, s0 + m1, K, W, n0, n1, bias, y, ldy);
    });
  }
}

}  // namespace
}  // namespace klein::kernels
