// The packing W8A8 GEMM driver of the AVX2 int8 kernel (gemm_int8_avx2.cpp) for Q8_ROW weights
// (int8, one scale per row); quantize_row_avx2 is also the AVX-VNNI and W4A8 kernels'. (The VNNI
// kernels read the weights in place: gemm_direct.h.) The AVX2 kernel multiplies int16 pairs
// (vpmaddwd), so both operands are widened from int8 on the way to it:
//
//   1. x is quantized per row exactly as ref::quantize_row_int8, Kp = K rounded up to 2 (zero
//      padded). The rows are stored packed per MR-row sliver as int8 pairs, [M / MR][Kp / 2][MR]
//      2-byte units, so a micro-kernel broadcasts every row's pair from one pointer at constant
//      offsets (with 14 row pointers GCC ran out of general registers and spilled accumulators).
//      Per K slice and block of kI8MB rows the block's pairs are widened to int16 pairs (4-byte
//      units) in a thread's scratch just before the micro-kernel reads them: x stays one byte per
//      element in memory (an int16 copy of a 4608 × 12288 activation would be 113 MB), and the
//      widening is 1/256 of the multiply-adds at the 256-column slabs.
//   2. Output columns are split into slabs (gemm_units.h's split_gemm); per KC slice, each slab's
//      int8 rows are transposed into NR-column panels of int16 pairs (UK::pack).
//   3. The micro-kernel (UK::tile) sums MR × NR int32 tiles over the slice, per block of kI8MB
//      rows panel by panel (each panel reused from L1 by the block's slivers). The int32 partial
//      sums of earlier slices are kept in y itself (same size as float32): the accumulation over
//      the whole K stays exact in int32, as the reference's, and needs no extra buffer.
//   4. After the last slice, the tile is rescaled in place, each step rounded to float32 —
//      y = (float(acc) · s_x[m]) · s_w[n] + bias[n] — so y equals ref::linear_w8a8 bit
//      for bit. These files are compiled with -ffp-contract=off so the compiler cannot fuse the
//      multiply and add of that formula.
//
// Include ONLY from the int8 SIMD files (all have at least AVX2): everything has internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

// Blocking (Zen 3, 2 threads, DiT shapes): a slice of 256 pairs (512 k) keeps a 16-column panel
// of int16 pairs at 16 KB in L1 while a block's 48 widened rows (48 KB) stream from L2; 128
// pairs (8 KB panels, 24 KB of rows) measured 3-5 % slower, 64 pairs 10 %, 24- or 36-row
// blocks the same as 48.
constexpr int64_t kI8KC = 256;  // units (a pair of k each) per K slice
constexpr int64_t kI8NC = 256;  // columns per slab
constexpr int64_t kI8MB = 48;   // rows of x per pass over a panel (a multiple of kMR)

// ref::quantize_row_int8 with AVX2: the same float32 operations (max of |x|, amax / 127, x / s,
// round half to even, clamp), so the same bytes. Writes K bytes of q (xor `flip`: 0x80 turns the
// int8 into u8 = q + 128) and Kp - K pad bytes of `flip` (a zero). The max of |x| is taken on
// the bits as integers: for non-negative floats their order, with every NaN above +inf, so a NaN
// anywhere in the row is kept (vmaxps would drop it unless it came last) and the row's outputs
// turn NaN (kernels.h) instead of it quantizing to -127.
inline void quantize_row_avx2(const float* x, int64_t K, int64_t Kp, uint8_t flip, uint8_t* q, float* s_out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i mx = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k)), abs_mask));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  uint32_t bits = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  for (; k < K; ++k) bits = std::max(bits, std::bit_cast<uint32_t>(x[k]) & 0x7fffffffu);
  const float amax = std::bit_cast<float>(bits);
  const float s = amax / 127.0f;
  *s_out = s;
  if (!(s > 0.0f && s < std::numeric_limits<float>::infinity())) {  // zero, or a NaN / inf in x
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

// n int8 → int16 by sign extension.
inline void widen_s8(const int8_t* s, int64_t n, int16_t* d) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = s[i];
}

// y[m0:m1, n0:n1] for the quantized activations qa (sliver-packed int8 pairs, KQ of them per
// row, see above; m0 % MR == 0).
template <class UK>
void int8_block(const uint16_t* qa, int64_t KQ, const float* sx, int64_t m0, int64_t m1, int64_t K,
                const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int NR = UK::kNR, MR = UK::kMR;
  static_assert(kI8MB % MR == 0, "a block is whole slivers");
  const int64_t Kp = KQ * 2;
  static thread_local UnitScratch pack_buf, conv_buf, wide_buf;
  uint32_t* bp = pack_buf.get<uint32_t>(std::min(kI8KC, KQ) * kI8NC);
  uint32_t* xw = wide_buf.get<uint32_t>(std::min(kI8KC, KQ) * kI8MB);  // [kI8MB / MR][kcn][MR] int16 pairs
  alignas(64) int32_t tile[MR * NR];
  alignas(64) float sw[kI8NC];
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kI8NC) {
    const int64_t ncn = std::min(kI8NC, n1 - nc0);
    const int64_t np = (ncn + NR - 1) / NR;
    // The slab's rows, as bytes with a row stride of Kp (a copy with zero padding when K is odd).
    // Not a structured binding: clang 14 rejects those inside requires-expressions and lambdas.
    const auto slab_rows = unit_padded_rows(static_cast<const uint8_t*>(W.data) + nc0 * K, K, Kp, ncn, conv_buf);
    const auto* const src = slab_rows.first;
    const int64_t ld = slab_rows.second;
    for (int64_t j = 0; j < ncn; ++j) sw[j] = scale_at(W.scales, W.scale_dtype, nc0 + j);
    for (int64_t kc0 = 0; kc0 < KQ; kc0 += kI8KC) {
      const int64_t kcn = std::min(kI8KC, KQ - kc0);
      for (int64_t p = 0; p < np; ++p)
        UK::pack(src + p * NR * ld, ld, static_cast<int>(std::min<int64_t>(NR, ncn - p * NR)), kc0, kcn,
                 bp + p * kcn * NR);
      const bool acc = kc0 > 0, last = kc0 + kcn == KQ;
      // The next slice's weight rows (2 bytes per unit), fetched while this slice computes (gemm_units.h).
      SlicePrefetch pf(src + (kc0 + kcn) * 2, ld, ncn, std::min(kI8KC, KQ - (kc0 + kcn)) * 2, (m1 - m0 + MR - 1) / MR);
      // Per block of kI8MB rows, each panel stays in L1 while the block's slivers pass over it.
      for (int64_t mb = m0; mb < m1; mb += kI8MB) {
        const int64_t me = std::min(m1, mb + kI8MB);
        for (int64_t m = mb; m < me; m += MR) {
          widen_s8(reinterpret_cast<const int8_t*>(qa + ((m / MR) * KQ + kc0) * MR), kcn * MR * 2,
                   reinterpret_cast<int16_t*>(xw + (m - mb) / MR * kcn * MR));
          pf.step();
        }
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
            UK::tile_rows(rows, xw + (m - mb) / MR * kcn * MR, bp + p * kcn * NR, kcn, c, ldc, acc);
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
  const int64_t Kp = (K + 1) / 2 * 2, KQ = Kp / 2, slivers = (M + MR - 1) / MR;
  std::vector<uint16_t> qa(slivers * KQ * MR, 0);  // [slivers][KQ][MR] quantized rows of x, int8 pairs
  std::vector<float> sx(M);                         // [M] their scales
  pool.parallel_for(slivers, [&](int64_t s0, int64_t s1) {
    std::vector<uint8_t> row(Kp);
    for (int64_t sl = s0; sl < s1; ++sl)
      for (int64_t m = sl * MR; m < std::min(M, (sl + 1) * MR); ++m) {
        quantize_row_avx2(x + m * ldx, K, Kp, 0, row.data(), &sx[m]);
        uint16_t* d = qa.data() + sl * KQ * MR + (m - sl * MR);
        for (int64_t q = 0; q < KQ; ++q) std::memcpy(d + q * MR, row.data() + q * 2, 2);
      }
  }, 2);
  split_gemm(M, W.rows(), UK::kMR, UK::kNR, kI8NC, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int8_block<UK>(qa.data(), KQ, sx.data(), m0, m1, K, W, n0, n1, bias, y, ldy);  // m0 % MR == 0
  });
}

}  // namespace
}  // namespace klein::kernels
