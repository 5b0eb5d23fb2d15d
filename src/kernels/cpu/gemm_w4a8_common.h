// The packing W4A8 GEMM driver of the AVX2 Q4_G64 kernel (gemm_w4a8_avx2.cpp); arithmetic:
// ref::linear_w4a8 with float32 sums. (The VNNI kernels, AVX512_VNNI and AVX-VNNI, read the
// weight rows in order and need no panels: gemm_w4a8_direct.h. They perform the same float32
// steps.)
//
//   1. x is quantized per row as the W8A8 kernels do (gemm_int8_common.h's quantize_row_avx2:
//      signed int8, no +128 shift) into MR-row slivers of 4-byte units, and each row's per-group
//      sums X_g = Σ q are kept ([M][G] floats, exact: |X_g| ≤ 64 · 127).
//   2. Per slab of columns and K slice of KG groups, the weight nibbles are unpacked to bytes
//      0..15 straight into NR-column panels of 4-byte units (panel[q][j]), beside the panel's
//      per-group scales and offsets (s, o [KG][NR], zero for padded columns).
//   3. The micro-kernel (UK::tile<rows>) sums, per group, int32 A_g = Σ q · w exactly, then folds
//      it into float32 accumulators held in y: f = fma(float(A_g), s_g, f); f = fma(X_g, o_g, f);
//      after the last slice y = fma(f, s_x, bias). Every kernel performs these float32 steps in
//      this order per output, so all ISAs give the same bits (the tests hold them to the double
//      reference within 1e-5 relative).
//
// Nibbles are unsigned and the activations signed, which is vpmaddubsw's operand order, so no
// shift or column-sum correction is needed.
//
// Include ONLY from the W4A8 SIMD files (all have at least AVX2): internal linkage throughout.
// (The VNNI kernels read the weight rows in order instead: gemm_w4a8_direct.h.)
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_units.h"
#include "kernels/cpu/q4_unpack.h"

namespace klein::kernels {
namespace {

// The panel's scales and offsets per group (s, o [ng][NR]; zero for the padded columns j ≥ nr),
// a row's ng values at a time (a call per value showed as ~5 % of the then packing VNNI GEMM's
// samples at K = 12288 under perf).
template <int NR>
void pack_q4_scales(const Weight& W, int64_t n0, int nr, int64_t g0, int64_t ng, float* s, float* o) {
  const int64_t G = W.cols() / 64;
  float rs[64], ro[64];
  for (int j = 0; j < NR; ++j) {
    for (int64_t c = 0; c < ng; c += 64) {
      const int64_t n = std::min<int64_t>(64, ng - c);
      if (j < nr) {
        scales_to_f32(W.scales, W.scale_dtype, (n0 + j) * G + g0 + c, n, rs);
        scales_to_f32(W.offsets, W.scale_dtype, (n0 + j) * G + g0 + c, n, ro);
      }
      for (int64_t g = 0; g < n; ++g) {
        s[(c + g) * NR + j] = j < nr ? rs[g] : 0.0f;
        o[(c + g) * NR + j] = j < nr ? ro[g] : 0.0f;
      }
    }
  }
}

// Panel of `nr` ≤ NR weight rows from row n0, groups [g0, g0 + ng): nibbles → bytes as 4-byte
// units (dst[q][j]), and the rows' scales and offsets per group (s, o [ng][NR]); padded columns
// get zero weights, scales and offsets. ng ≤ KG.
template <int NR, int64_t KG>
void pack_q4_panel(const Weight& W, int64_t n0, int nr, int64_t g0, int64_t ng, uint32_t* dst, float* s, float* o) {
  const int64_t K = W.cols();
  alignas(64) uint8_t row[KG * 64];
  for (int j = 0; j < NR; ++j) {
    if (j >= nr) {
      for (int64_t q = 0; q < ng * 16; ++q) dst[q * NR + j] = 0;
      continue;
    }
    const uint8_t* src = static_cast<const uint8_t*>(W.data) + (n0 + j) * (K / 2) + g0 * 32;
    for (int64_t h = 0; h < ng * 2; ++h)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + h * 32), q4_spread16(src + h * 16));
    for (int64_t q = 0; q < ng * 16; ++q) std::memcpy(dst + q * NR + j, row + q * 4, 4);
  }
  pack_q4_scales<NR>(W, n0, nr, g0, ng, s, o);
}

// UK::tile<rows> for a run-time row count 1 ≤ rows ≤ R (the last sliver of M may be short).
template <class UK, int R = UK::kMR, class... Args>
void tile_rows(int rows, Args... args) {
  if constexpr (R > 1)
    if (rows < R) return tile_rows<UK, R - 1>(rows, args...);
  UK::template tile<R>(args...);
}

// y[m0:m1, n0:n1] (m0 % MR == 0). qa: sliver-packed int8 units; sx: row scales; xs: [M][G].
template <class UK>
void w4a8_block(const uint32_t* qa, const float* sx, const float* xs, int64_t m0, int64_t m1, int64_t K,
                const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int MR = UK::kMR, NR = UK::kNR;
  constexpr int64_t KG = UK::kKG, NC = UK::kNC;
  const int64_t G = K / 64, KQ = K / 4;
  static thread_local UnitScratch pack_buf, scale_buf;
  uint32_t* bp = pack_buf.get<uint32_t>(KG * 16 * NC);
  float* sp = scale_buf.get<float>(2 * KG * NC);  // per panel: s [kg][NR], o [kg][NR]
  for (int64_t nc0 = n0; nc0 < n1; nc0 += NC) {
    const int64_t ncn = std::min(NC, n1 - nc0), np = (ncn + NR - 1) / NR;
    for (int64_t g0 = 0; g0 < G; g0 += KG) {
      const int64_t ng = std::min(KG, G - g0);
      for (int64_t p = 0; p < np; ++p)
        pack_q4_panel<NR, KG>(W, nc0 + p * NR, static_cast<int>(std::min<int64_t>(NR, ncn - p * NR)), g0, ng,
                              bp + p * ng * 16 * NR, sp + p * 2 * ng * NR, sp + p * 2 * ng * NR + ng * NR);
      const bool acc = g0 > 0, last = g0 + ng == G;
      // The next slice's nibbles (32 bytes per group per row), fetched while this one computes.
      SlicePrefetch pf(static_cast<const uint8_t*>(W.data) + nc0 * (K / 2) + (g0 + ng) * 32, K / 2, ncn,
                       std::min(KG, G - (g0 + ng)) * 32, (m1 - m0 + MR - 1) / MR);
      // Rows in blocks of UK::kMB (a multiple of MR): per block, each panel stays in L1 while the
      // block's slivers pass over it.
      constexpr int64_t MB = UK::kMB;
      for (int64_t mb = m0; mb < m1; mb += MB) {
        const int64_t me = std::min(m1, mb + MB);
        for (int64_t m = mb; m < me; m += MR) pf.step();
        for (int64_t p = 0; p < np; ++p) {
          const int64_t n = nc0 + p * NR;
          const float* s = sp + p * 2 * ng * NR;
          for (int64_t m = mb; m < me; m += MR) {
            const int rows = static_cast<int>(std::min<int64_t>(MR, me - m));
            tile_rows<UK>(rows, qa + (m / MR) * KQ * MR + g0 * 16 * MR, bp + p * ng * 16 * NR, ng, s, s + ng * NR,
                          xs + m * G + g0, G, y + m * ldy + n, ldy, acc,
                          static_cast<int>(std::min<int64_t>(NR, ncn - p * NR)), last ? sx + m : nullptr,
                          last && bias ? bias + n : nullptr);
          }
        }
      }
    }
  }
}

// The whole W4A8 linear (kernels.h semantics; K % 64 == 0 as Q4_G64 requires) with UK.
template <class UK>
void w4a8_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  constexpr int MR = UK::kMR;
  const int64_t KQ = K / 4, G = K / 64, slivers = (M + MR - 1) / MR;
  std::vector<uint32_t> qa(slivers * KQ * MR, 0);  // [slivers][KQ][MR] int8 units of x
  std::vector<float> sx(M), xs(M * G);               // row scales; per-group sums of q, [M][G]
  pool.parallel_for(slivers, [&](int64_t s0, int64_t s1) {
    std::vector<uint8_t> row(K);
    for (int64_t sl = s0; sl < s1; ++sl)
      for (int64_t m = sl * MR; m < std::min(M, (sl + 1) * MR); ++m) {
        quantize_row_avx2(x + m * ldx, K, K, 0, row.data(), &sx[m]);  // signed: no shift
        for (int64_t g = 0; g < G; ++g) {
          int32_t t = 0;
          for (int k = 0; k < 64; ++k) t += static_cast<int8_t>(row[g * 64 + k]);
          xs[m * G + g] = static_cast<float>(t);
        }
        uint32_t* d = qa.data() + sl * KQ * MR + (m - sl * MR);
        for (int64_t q = 0; q < KQ; ++q) std::memcpy(d + q * MR, row.data() + q * 4, 4);
      }
  }, 2);
  split_gemm(M, W.rows(), UK::kMR, UK::kNR, UK::kNC, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    w4a8_block<UK>(qa.data(), sx.data(), xs.data(), m0, m1, K, W, n0, n1, bias, y, ldy);
  });
}

}  // namespace
}  // namespace klein::kernels
