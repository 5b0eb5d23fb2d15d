// The Winograd form F(2×2, 3×3) of the stride-1 bf16 conv's operands (conv2d_winograd_form,
// kernels/conv2d.h; ref::conv2d_bf16_winograd's arithmetic), shared by the AVX512_BF16 conv
// (conv2d_avx512bf16.cpp) and the AMX one (conv2d_amx.cpp), which differ only in their products:
// U = G g Gᵀ per kernel as bf16 pair units [Cout][ξ][CP], V = Bᵀ d B per tile of the block's
// input (after the prologue) as [ξ][panel][cp][32 slots], and Aᵀ M A + bias into the output.
//
// Include ONLY from conv2d_avx512bf16.cpp / conv2d_amx.cpp: everything has internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/conv2d_bf16_direct.h"
#include "kernels/cpu/conv2d_pack.h"
#include "kernels/cpu/conv2d_winograd_plan.h"
#include "kernels/cpu/gemm_avx512_common.h"

namespace klein::kernels {
namespace {

constexpr int64_t kWinoVBytes = int64_t{512} << 10;
// Fewer input channels keep the direct form: K = CP pairs per micro-kernel call would be too
// short to pay for the transforms (the encoder's conv_in has 3).
constexpr int64_t kWinoMinCin = 16;

// Units per output channel of U: 16·CP, one line more (16·CP units are a multiple of 4 KB for
// every CP ≥ 64: a sliver's 14 rows would share L1 sets, as subpixel_lda's).
constexpr int64_t winograd_lda(int64_t CP) { return 16 * CP + 16; }

// U as pair units [Cout][winograd_lda(CP)]: U_ξ's CP pairs at ξ·CP (winograd_weight_tile of
// the float weight, rounded to bf16 as f32_to_bf16). Per output channel: the taps by tap
// ft[9][Cin], 16 kernels transformed per step into uf[ξ][Cin], one row conversion per ξ (the
// scalar transform and conversion per element were 4-5 % of a 256² decode or encode).
// Written into `out` (Cout · winograd_lda(CP) units; the line past each row is never read).
void winograd_weights(const Weight& w, int64_t Cout, int64_t Cin, int64_t CP, uint16_t* out, ThreadPool& pool) {
  const int64_t U = winograd_lda(CP), Cin16 = (Cin + 15) / 16 * 16;
  pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
    std::vector<float> f(Cin * 9), ft(9 * Cin16, 0.0f), uf(16 * Cin16);
    for (int64_t co = b; co < e; ++co) {
      weight_row_f32(w, co, Cin * 9, f.data());  // [Cin][3][3]
      for (int64_t ci = 0; ci < Cin; ++ci)
        for (int k = 0; k < 9; ++k) ft[k * Cin16 + ci] = f[ci * 9 + k];
      for (int64_t c0 = 0; c0 < Cin16; c0 += 16) {
        __m512 g[9], u[16];
        for (int k = 0; k < 9; ++k) g[k] = _mm512_loadu_ps(ft.data() + k * Cin16 + c0);
        winograd_weight_tile(g, u);  // 16 kernels at once
        for (int x = 0; x < 16; ++x) _mm512_storeu_ps(uf.data() + x * Cin16 + c0, u[x]);
      }
      uint16_t* d = out + co * U * 2;
      for (int x = 0; x < 16; ++x) {
        f32_to_bf16_row(uf.data() + x * Cin16, Cin, d + 2 * x * CP);
        // Zero past Cin: the last pair's missing channel, and pairs padded past (Cin + 1) / 2.
        std::fill(d + 2 * x * CP + Cin, d + 2 * (x + 1) * CP, uint16_t{0});
      }
    }
  });
}

// The block's frame rows 2·ty0 − 1 + r (r < 2·bh + 2) of channel c through the prologue, zero
// outside the image, split by column parity: with b = 2·tx0 − 1, row r's E[k] = column b + 2k
// and O[k] = column b + 2k + 1 (k ≤ bw), at rb + r·2·LE and + LE. Split so, a tile's window
// columns are four plain loads (winograd_input16).
constexpr int64_t wino_le(int64_t bw) { return bw + 16; }
void winograd_rows(const ConvGeom& g, int64_t c, const WinoBlock& k, float* rb) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
  const int64_t LE = wino_le(k.bw);
  auto col16 = [&](int64_t iy, int64_t ix0) {  // frame columns ix0 .. ix0 + 15
    const int64_t lo = std::max<int64_t>(0, -ix0), hi = std::min<int64_t>(16, g.W - ix0);
    const __mmask16 valid = lo < hi ? static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
    return valid ? frame16(g, c, iy, ix0, valid) : _mm512_setzero_ps();
  };
  for (int64_t r = 0; r < 2 * k.bh + 2; ++r) {
    float* E = rb + r * 2 * LE;
    float* O = E + LE;
    const int64_t iy = 2 * k.ty0 - 1 + r;
    if (iy < 0 || iy >= g.H) {
      std::memset(E, 0, 2 * LE * sizeof(float));
      continue;
    }
    const int64_t b = 2 * k.tx0 - 1;
    if (c + 2 < g.Cin) {
      // The next pair's channel of this parity, same row: the block reads each input row as a
      // short run in a new plane, which the hardware prefetchers start on late (the masked
      // input load held ~1/4 of this function's samples without this).
      const char* nx = reinterpret_cast<const char*>(g.x + ((c + 2) * g.H + iy) * g.W + std::max<int64_t>(0, b));
      const int64_t bytes = std::min<int64_t>(2 * k.bw + 2, g.W - std::max<int64_t>(0, b)) * 4;
      for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(nx + off, _MM_HINT_T0);
    }
    for (int64_t x = 0; x < 2 * k.bw; x += 32) {
      const __m512 z0 = col16(iy, b + x), z1 = col16(iy, b + x + 16);
      _mm512_storeu_ps(E + x / 2, _mm512_permutex2var_ps(z0, ev, z1));
      _mm512_storeu_ps(O + x / 2, _mm512_permutex2var_ps(z0, od, z1));
    }
    // Columns b + 2·bw and b + 2·bw + 1: E[bw], O[bw] (one vector, its first two lanes).
    const __m512 z = col16(iy, b + 2 * k.bw);
    _mm512_storeu_ps(E + k.bw, _mm512_permutexvar_ps(ev, z));
    _mm512_storeu_ps(O + k.bw, _mm512_permutexvar_ps(od, z));
  }
}

// v[ξ] for the 16 tiles of a group whose windows start at row r0 and column pair k0 of rb (as
// winograd_rows builds it): a tile's window row is E[k], O[k], E[k + 1], O[k + 1] (lane l ↔ tile l).
inline void winograd_input16(const float* rb, int64_t LE, int64_t r0, int64_t k0, __m512* v) {
  __m512 d[16];
  for (int r = 0; r < 4; ++r) {
    const float* E = rb + (r0 + r) * 2 * LE + k0;
    const float* O = E + LE;
    d[4 * r + 0] = _mm512_loadu_ps(E), d[4 * r + 1] = _mm512_loadu_ps(O);
    d[4 * r + 2] = _mm512_loadu_ps(E + 1), d[4 * r + 3] = _mm512_loadu_ps(O + 1);
  }
  winograd_input_tile(d, v);
}


// Aᵀ M A of the 16 tiles of a group (m[ξ] at stride ld), + bias (+ out), into output rows
// 2·ty, 2·ty + 1 of channel plane o, columns 2·tx0 .. (32 of them, clipped to OW / OH).
inline void winograd_output16(const float* m, int64_t ld, float bias, bool accumulate, float* o, int64_t OH,
                              int64_t OW, int64_t ty, int64_t tx0) {
  __m512 mv[16], y[4];
  for (int x = 0; x < 16; ++x) mv[x] = _mm512_loadu_ps(m + x * ld);
  winograd_output_tile(mv, y);
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  const __m512 b = _mm512_set1_ps(bias);
  const int64_t cols = std::min<int64_t>(32, OW - 2 * tx0);
  const __mmask16 k0 = col_mask(static_cast<int>(cols)), k1 = col_mask(static_cast<int>(std::max<int64_t>(0, cols - 16)));
  for (int dy = 0; dy < 2 && 2 * ty + dy < OH; ++dy) {
    // y[dy·2 + k] for k = 0, 1: output columns 2·(tx0 + l) + k.
    const __m512 y0 = y[2 * dy], y1 = y[2 * dy + 1];
    float* row = o + (2 * ty + dy) * OW + 2 * tx0;
    __m512 r0 = _mm512_add_ps(_mm512_permutex2var_ps(y0, lo, y1), b);
    __m512 r1 = _mm512_add_ps(_mm512_permutex2var_ps(y0, hi, y1), b);
    if (accumulate) {
      r0 = _mm512_add_ps(_mm512_maskz_loadu_ps(k0, row), r0);
      r1 = _mm512_add_ps(_mm512_maskz_loadu_ps(k1, row + 16), r1);
    }
    _mm512_mask_storeu_ps(row, k0, r0);
    _mm512_mask_storeu_ps(row + 16, k1, r1);
  }
}

// How a Winograd conv of H × W outputs splits its work (wino_plan_for, conv2d_winograd_plan.h):
// blocks of at most kWinoVBytes of V (16 · CP · NT units, NT a multiple of the 32-slot panel).
inline WinoPlan wino_plan(int64_t Cout, int64_t H, int64_t W, int64_t CP, int64_t unit, int threads) {
  return wino_plan_for(Cout, (H + 1) / 2, ((W + 1) / 2 + 15) / 16 * 16,
                       std::max<int64_t>(32, kWinoVBytes / (64 * CP) / 32 * 32), 32, unit, threads);
}

// Rows per channel of winograd_rows' buffer for blocks of this shape (at most).
constexpr int64_t winograd_rows_per_ch(const WinoBlock& shape) { return (2 * shape.bh + 2) * 2 * wino_le(shape.bw); }

// A pool thread's buffers for the tasks of plan d: V (winograd_build_v's 16 · CP · NT units), M
// (m_floats of products) and two channels' rows; kept across calls.
struct WinoBufs {
  uint32_t* V;
  float *M, *rb;
};
inline WinoBufs wino_bufs(const WinoPlan& d, int64_t CP, int64_t m_floats) {
  static thread_local UnitScratch v_buf, m_buf, row_buf;
  return {v_buf.get<uint32_t>(static_cast<size_t>(16 * CP * d.NT)), m_buf.get<float>(static_cast<size_t>(m_floats)),
          row_buf.get<float>(static_cast<size_t>(2 * winograd_rows_per_ch(d.shape)))};
}

// V[ξ][panel][cp][32] units (n_panel panels of 32 slots, NT = 32 · n_panel) of block k: per
// channel pair cp < CP, the block's rows through winograd_rows (two channels' into rb, each
// winograd_rows_per_ch(k) floats), each group of 16 slots' v[ξ] (winograd_input16), rounded to
// bf16 pairs. Pairs past the input channels, and slots past the block's, are zero.
inline void winograd_build_v(const ConvGeom& g, const WinoBlock& k, int64_t CP, int64_t n_panel, int64_t NT, float* rb,
                             uint32_t* V) {
  const int64_t LE = wino_le(k.bw), rows_per_ch = winograd_rows_per_ch(k);
  const int64_t ns = k.bh * k.bw;  // slots (ty − ty0)·bw + (tx − tx0); the rest of the last panel zero
  if (ns % 32 || 2 * CP > g.Cin + 1) std::memset(V, 0, static_cast<size_t>(16 * CP * NT) * 4);
  float v0[16 * 16];  // channel 2·cp's v, [ξ][lane]
  for (int64_t cp = 0; 2 * cp < g.Cin; ++cp) {
    const bool pair = 2 * cp + 1 < g.Cin;
    winograd_rows(g, 2 * cp, k, rb);
    if (pair) winograd_rows(g, 2 * cp + 1, k, rb + rows_per_ch);
    for (int64_t so = 0; so < ns; so += 16) {
      const int64_t r0 = 2 * (so / k.bw), k0 = so % k.bw;
      __m512 v[16];
      winograd_input16(rb, LE, r0, k0, v);
      for (int x = 0; x < 16; ++x) _mm512_storeu_ps(v0 + 16 * x, v[x]);
      if (pair)
        winograd_input16(rb + rows_per_ch, LE, r0, k0, v);
      else
        for (auto& z : v) z = _mm512_setzero_ps();
      // The flushing conversion (avx512_convert.h): the transformed input only feeds the tile
      // products; the weight, converted once per call, is exact.
      for (int x = 0; x < 16; ++x)
        _mm512_storeu_si512(V + ((x * n_panel + so / 32) * CP + cp) * 32 + so % 32,
                            bf16_pairs_ftz(_mm512_loadu_ps(v0 + 16 * x), v[x]));
    }
  }
}

}  // namespace
}  // namespace klein::kernels
