// The packing W8A8 GEMM driver of the AVX2 int8 kernel (gemm_int8_avx2.cpp) for Q8_ROW weights
// (int8, one scale per row); quantize_row_avx2 is also the AVX-VNNI and W4A8 kernels'. (The VNNI
// kernels read the weights in place: gemm_int8_direct.h.)
//
//   1. x is quantized per row exactly as ref::quantize_row_int8 (kernels.h), Kp = K rounded up
//      to 4 (zero padded): the micro-kernels sum quads of k. The rows are stored packed per
//      MR-row sliver, [M / MR][Kp / 4][MR] 4-byte units, so a micro-kernel broadcasts every row's
//      unit from one pointer at constant offsets: with 14 row pointers GCC ran out of general
//      registers and spilled the accumulators inside the loop (measured: 40 % → see bench).
//   2. Output columns are split into slabs (gemm_units.h's split_gemm); per KC slice, each slab's
//      int8 rows are transposed into NR-column panels of 4-byte units (4 k of one column).
//   3. The micro-kernel (UK::tile) sums MR × NR int32 tiles over the slice, per block of kI8MB
//      rows panel by panel (each panel reused from L1 by the block's slivers). The int32 partial
//      sums of earlier slices are kept in y itself (same size as float32): the accumulation over
//      the whole K stays exact in int32, as the reference's, and needs no extra buffer.
//   4. After the last slice, the tile is rescaled in place, each step rounded to float32 —
//      y = (float(acc) · s_x[m]) · s_w[n] + bias[n] — so y equals ref::linear_w8a8 bit
//      for bit. These files are compiled with -ffp-contract=off so the compiler cannot fuse the
//      multiply and add of that formula.
//
// The activations stay signed (vpmaddubsw's operand order; see gemm_int8_avx2.cpp for why that is
// exact), so no column-sum correction is needed.
//
// Include ONLY from the int8 SIMD files (all have at least AVX2): everything has internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

constexpr int64_t kI8KC = 128;  // units (4 k each) per K slice: a 32-column panel is 16 KB
constexpr int64_t kI8NC = 256;  // columns per slab
constexpr int64_t kI8MB = 48;   // rows of x per pass over a panel (a multiple of every kMR)

// ref::quantize_row_int8 with AVX2: the same float32 operations (max of |x|, amax / 127, x / s,
// round half to even, clamp), so the same bytes. Writes K bytes of q (xor `flip`: 0x80 turns the
// int8 into u8 = q + 128) and Kp - K pad bytes of `flip` (a zero).
inline void quantize_row_avx2(const float* x, int64_t K, int64_t Kp, uint8_t flip, uint8_t* q, float* s_out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float amax = _mm_cvtss_f32(h);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float s = amax / 127.0f;
  *s_out = s;
  if (!(s > 0.0f)) {
    std::memset(q, flip, Kp);
    return;
  }
  const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i vflip = _mm256_set1_epi8(static_cast<char>(flip));
  auto quant8 = [&](int64_t i) {
    const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));  // integral: exact
  };
  k = 0;
  for (; k + 32 <= K; k += 32) {
    // Values are within ±127, so the saturating packs are exact; they interleave 128-bit lanes,
    // which the permute undoes.
    const __m256i a = _mm256_packs_epi32(quant8(k), quant8(k + 8));
    const __m256i b = _mm256_packs_epi32(quant8(k + 16), quant8(k + 24));
    const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm256_xor_si256(p, vflip));
  }
  for (; k < K; ++k) {
    const float r = std::nearbyint(x[k] / s);
    q[k] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f))) ^ flip;
  }
  for (; k < Kp; ++k) q[k] = flip;
}

// y[m0:m1, n0:n1] for the quantized activations qa (sliver-packed, see above; m0 % MR == 0).
template <class UK>
void int8_block(const uint32_t* qa, int64_t Kp, const float* sx, int64_t m0, int64_t m1, int64_t K,
                const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int NR = UK::kNR, MR = UK::kMR;
  const int64_t KQ = Kp / 4;
  static thread_local UnitScratch pack_buf, conv_buf;
  uint32_t* bp = pack_buf.get<uint32_t>(std::min(kI8KC, KQ) * kI8NC);
  alignas(64) int32_t tile[MR * NR];
  alignas(64) float sw[kI8NC];
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kI8NC) {
    const int64_t ncn = std::min(kI8NC, n1 - nc0);
    const int64_t np = (ncn + NR - 1) / NR;
    // The slab's rows, as bytes with a row stride of Kp (a copy with zero padding when K % 4).
    // Not a structured binding: clang 14 rejects those inside requires-expressions and lambdas.
    const auto slab_rows = unit_padded_rows(static_cast<const uint8_t*>(W.data) + nc0 * K, K, Kp, ncn, conv_buf);
    const auto* const src = slab_rows.first;
    const int64_t ld = slab_rows.second;
    for (int64_t j = 0; j < ncn; ++j) sw[j] = scale_at(W.scales, W.scale_dtype, nc0 + j);
    for (int64_t kc0 = 0; kc0 < KQ; kc0 += kI8KC) {
      const int64_t kcn = std::min(kI8KC, KQ - kc0);
      for (int64_t p = 0; p < np; ++p) {
        uint32_t* panel = bp + p * kcn * NR;
        const int nr = static_cast<int>(std::min<int64_t>(NR, ncn - p * NR));
        if constexpr (requires { UK::pack(src, ld, nr, kc0, kcn, panel); })
          UK::pack(src + p * NR * ld, ld, nr, kc0, kcn, panel);  // the kernel's own (vectorised) packing
        else
          pack_units<NR>(src + p * NR * ld, ld, nr, kc0, kcn, panel);
      }
      const bool acc = kc0 > 0, last = kc0 + kcn == KQ;
      // The next slice's weight rows, fetched while this slice computes (gemm_units.h).
      SlicePrefetch pf(src + (kc0 + kcn) * 4, ld, ncn, std::min(kI8KC, KQ - (kc0 + kcn)) * 4, (m1 - m0 + MR - 1) / MR);
      // Per block of kI8MB rows, each panel stays in L1 while the block's slivers pass over it.
      for (int64_t mb = m0; mb < m1; mb += kI8MB) {
        const int64_t me = std::min(m1, mb + kI8MB);
        for (int64_t m = mb; m < me; m += MR) pf.step();
        for (int64_t p = 0; p < np; ++p) {
          const int64_t n = nc0 + p * NR;
          const int cols = static_cast<int>(std::min<int64_t>(NR, ncn - p * NR));
          for (int64_t m = mb; m < me; m += MR) {
            const int rows = static_cast<int>(std::min<int64_t>(MR, me - m));
            float* yt = y + m * ldy + n;
            // Full tiles sum straight into y's memory (as int32); edge tiles through `tile`.
            int32_t* c = reinterpret_cast<int32_t*>(yt);
            int64_t ldc = ldy;
            if (cols < NR) {
              c = tile, ldc = NR;
              if (acc)
                for (int r = 0; r < rows; ++r) std::memcpy(tile + r * NR, yt + r * ldy, cols * 4);
            }
            UK::tile_rows(rows, qa + (m / MR) * KQ * MR + kc0 * MR, bp + p * kcn * NR, kcn, c, ldc, acc);
            if (last) {
              const int64_t j0 = p * NR;
              for (int r = 0; r < rows; ++r) {
                const float s = sx[m + r];
                int j = 0;
                // 8 columns at a time, the same float32 operations in the same order as the tail
                // (and the reference): these files are compiled without FMA contraction.
                const __m256 vs = _mm256_set1_ps(s);
                for (; j + 8 <= cols; j += 8) {
                  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc + j));
                  const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(a), vs);
                  const __m256 b = bias ? _mm256_loadu_ps(bias + n + j) : _mm256_setzero_ps();
                  _mm256_storeu_ps(yt + r * ldy + j, _mm256_add_ps(_mm256_mul_ps(t, _mm256_loadu_ps(sw + j0 + j)), b));
                }
                for (; j < cols; ++j) {
                  int32_t a;
                  std::memcpy(&a, c + r * ldc + j, 4);
                  const float t = static_cast<float>(a) * s;
                  yt[r * ldy + j] = t * sw[j0 + j] + (bias ? bias[n + j] : 0.0f);
                }
              }
            } else if (cols < NR) {
              for (int r = 0; r < rows; ++r) std::memcpy(yt + r * ldy, tile + r * NR, cols * 4);
            }
          }
        }
      }
    }
  }
}

// The whole W8A8 linear (kernels.h semantics) with micro-kernel UK.
template <class UK>
void int8_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  constexpr int MR = UK::kMR;
  const int64_t Kp = (K + 3) / 4 * 4, KQ = Kp / 4, slivers = (M + MR - 1) / MR;
  std::vector<uint32_t> qa(slivers * KQ * MR, 0);  // [slivers][KQ][MR] quantized rows of x
  std::vector<float> sx(M);                         // [M] their scales
  pool.parallel_for(slivers, [&](int64_t s0, int64_t s1) {
    std::vector<uint8_t> row(Kp);
    for (int64_t sl = s0; sl < s1; ++sl)
      for (int64_t m = sl * MR; m < std::min(M, (sl + 1) * MR); ++m) {
        quantize_row_avx2(x + m * ldx, K, Kp, 0, row.data(), &sx[m]);
        uint32_t* d = qa.data() + sl * KQ * MR + (m - sl * MR);
        for (int64_t q = 0; q < KQ; ++q) std::memcpy(d + q * MR, row.data() + q * 4, 4);
      }
  }, 2);
  split_gemm(M, W.rows(), UK::kMR, UK::kNR, kI8NC, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int8_block<UK>(qa.data(), Kp, sx.data(), m0, m1, K, W, n0, n1, bias, y, ldy);  // m0 % MR == 0
  });
}

}  // namespace
}  // namespace klein::kernels
