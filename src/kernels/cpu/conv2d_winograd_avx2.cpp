// AVX2/FMA float32 conv2d under Precision::kFast: the same-padded 3×3 convs (the VAE's resnet
// convs, and its upsampling convs on the upsampled image) in the Winograd form F(2×2, 3×3)
// (conv2d_winograd_f32_form, kernels/conv2d.h; ref::conv2d_winograd's arithmetic): 16 products
// per tile of 2×2 outputs and input channel where the direct form has 36. The other convs (the
// first and last, the strided downsamplers, 1×1 shortcuts, ≤ 6 output channels) are left to the
// exact float32 conv of the ISA (conv2d_avx2.cpp, or the AVX-512F one on such CPUs).
//
// Tiles live in slots s = ty·TWp + tx, TWp = the tile columns rounded up to 16 (a panel), so each
// group of 8 slots (one vector's lanes) lies in one tile row; slots tx ≥ TW are dead (computed on
// zeros, never stored). A task takes a block of whole tile rows (≤ NT slots) and a range of
// output channels (conv2d_winograd_plan.h):
//   V[ξ][panel][ci][16] ← per input channel, the block's frame rows through the prologue (and the
//     upsampling), split by column parity so a tile's window is four plain loads; each group of 8
//     slots' 16 transformed values (winograd_input_tile on vectors);
//   per ≤ 6-row sliver of Cout: M[ξ][row][slot] = U_ξ · V_ξ, 16 GEMMs of the 6×16 micro-kernel
//     with K = Cin (U = winograd_weight_tile of each kernel, float [Cout][ξ][Cin], built once per
//     call); then Aᵀ M A per tile, + bias (+ out), into the NCHW output.
// V stays in L2 (≤ kVBytes where Cin allows 16 slots), a sliver's M (16 · 6 · NT floats) in L1/L2.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/conv2d_kernels.h"
#include "kernels/cpu/conv2d_pack.h"
#include "kernels/cpu/conv2d_winograd_plan.h"

namespace klein::kernels::avx2 {
namespace {

// Fewer input channels keep the direct form: K = Cin per micro-kernel call would be too short to
// pay for the transforms (the encoder's conv_in has 3).
constexpr int64_t kMinCin = 16;
constexpr int64_t kVBytes = int64_t{256} << 10;

// Floats per output channel of U: 16·Cin, one line more (16·Cin floats are a multiple of 4 KB
// for every Cin ≥ 64: a sliver's 6 rows would share L1 sets).
constexpr int64_t u_lda(int64_t Cin) { return 16 * Cin + 16; }

// U [Cout][u_lda(Cin)]: U_ξ's Cin values at ξ·Cin. Per output channel: the row in float, its
// taps by tap ft[9][Cin8], 8 kernels transformed per step.
void winograd_weights(const Weight& w, int64_t Cout, int64_t Cin, float* U, ThreadPool& pool) {
  const int64_t L = u_lda(Cin), Cin8 = (Cin + 7) / 8 * 8;
  pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
    std::vector<float> f(Cin * 9), ft(9 * Cin8, 0.0f), uf(16 * Cin8);
    for (int64_t co = b; co < e; ++co) {
      weight_row_to_f32(w, co, f.data());  // [Cin][3][3]
      for (int64_t ci = 0; ci < Cin; ++ci)
        for (int k = 0; k < 9; ++k) ft[k * Cin8 + ci] = f[ci * 9 + k];
      for (int64_t c0 = 0; c0 < Cin8; c0 += 8) {
        __m256 g[9], u[16];
        for (int k = 0; k < 9; ++k) g[k] = _mm256_loadu_ps(ft.data() + k * Cin8 + c0);
        winograd_weight_tile(g, u);  // 8 kernels at once
        for (int x = 0; x < 16; ++x) _mm256_storeu_ps(uf.data() + x * Cin8 + c0, u[x]);
      }
      float* d = U + co * L;
      for (int x = 0; x < 16; ++x) std::memcpy(d + x * Cin, uf.data() + x * Cin8, Cin * sizeof(float));
    }
  });
}

// d[i] = the prologue of source row `src` (channel c) at column s0 + i, i < n: 0 outside [0, W).
// The prologue reads the source and writes d in one pass (transform_run's arithmetic: a copy
// first, then transform_run in place, was ~6 % of a 256² decode in memmove).
inline void source_run(const ConvGeom& g, int64_t c, const float* src, int64_t s0, int64_t n, float* d) {
  const int64_t lo = std::clamp<int64_t>(-s0, 0, n), hi = std::clamp<int64_t>(g.W - s0, lo, n);
  std::memset(d, 0, lo * sizeof(float));
  std::memset(d + hi, 0, (n - hi) * sizeof(float));
  if (g.prologue)
    transform_copy(g, c, src + s0 + lo, d + lo, hi - lo);
  else
    std::memcpy(d + lo, src + s0 + lo, (hi - lo) * sizeof(float));
}

// The frame is the conv's input as the tiles see it: OH × OW (the upsampled image with
// upsampling). Block k's frame rows 2·ty0 − 1 + r (r < 2·bh + 2) of channel c, zero outside,
// split by column parity: with b = 2·tx0 − 1, row r's E[j] = column b + 2j and O[j] = column
// b + 2j + 1 (j ≤ bw), at rb + r·2·LE and + LE. `seg` takes 2·bw + 16 floats.
constexpr int64_t wino_le(int64_t bw) { return bw + 8; }
constexpr int64_t rows_per_ch(const WinoBlock& k) { return (2 * k.bh + 2) * 2 * wino_le(k.bw); }
void winograd_rows(const ConvGeom& g, int64_t c, const WinoBlock& k, float* rb, float* seg) {
  const int64_t LE = wino_le(k.bw), b = 2 * k.tx0 - 1;
  for (int64_t r = 0; r < 2 * k.bh + 2; ++r) {
    float* E = rb + r * 2 * LE;
    float* O = E + LE;
    const int64_t iy = 2 * k.ty0 - 1 + r;
    if (iy < 0 || iy >= g.OH) {
      std::memset(E, 0, 2 * LE * sizeof(float));
      continue;
    }
    const float* src = g.x + (c * g.H + (g.up ? iy >> 1 : iy)) * g.W;
    if (g.up) {
      // Frame column 2m − 1 + … reads source column m − 1 (even offsets) and m (odd ones): E[j] is
      // source column tx0 − 1 + j, O[j] the next one.
      source_run(g, c, src, k.tx0 - 1, k.bw + 2, E);
      std::memcpy(O, E + 1, (k.bw + 1) * sizeof(float));
      continue;
    }
    source_run(g, c, src, b, 2 * k.bw + 16, seg);
    for (int64_t j = 0; j <= k.bw; j += 8) {  // 16 columns → 8 even, 8 odd
      const __m256 a = _mm256_loadu_ps(seg + 2 * j), z = _mm256_loadu_ps(seg + 2 * j + 8);
      const __m256 ev = _mm256_shuffle_ps(a, z, _MM_SHUFFLE(2, 0, 2, 0));
      const __m256 od = _mm256_shuffle_ps(a, z, _MM_SHUFFLE(3, 1, 3, 1));
      _mm256_storeu_ps(E + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8)));
      _mm256_storeu_ps(O + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8)));
    }
  }
}

// v[ξ] of the 8 tiles whose windows start at row r0 and column pair j0 of rb: a tile's window
// row is E[j], O[j], E[j + 1], O[j + 1] (lane l ↔ tile l).
inline void winograd_input8(const float* rb, int64_t LE, int64_t r0, int64_t j0, __m256* v) {
  __m256 d[16];
  for (int r = 0; r < 4; ++r) {
    const float* E = rb + (r0 + r) * 2 * LE + j0;
    const float* O = E + LE;
    d[4 * r + 0] = _mm256_loadu_ps(E), d[4 * r + 1] = _mm256_loadu_ps(O);
    d[4 * r + 2] = _mm256_loadu_ps(E + 1), d[4 * r + 3] = _mm256_loadu_ps(O + 1);
  }
  winograd_input_tile(d, v);
}

// V[ξ][panel][ci][16] (n_panel panels of 16 slots) of block k, channel by channel.
void winograd_build_v(const ConvGeom& g, const WinoBlock& k, int64_t n_panel, float* rb, float* seg, float* V) {
  const int64_t LE = wino_le(k.bw), ns = k.bh * k.bw;  // ns: a multiple of 16, as bw
  for (int64_t c = 0; c < g.Cin; ++c) {
    winograd_rows(g, c, k, rb, seg);
    for (int64_t so = 0; so < ns; so += 8) {
      __m256 v[16];
      winograd_input8(rb, LE, 2 * (so / k.bw), so % k.bw, v);
      for (int x = 0; x < 16; ++x)
        _mm256_storeu_ps(V + ((x * n_panel + so / 16) * g.Cin + c) * 16 + so % 16, v[x]);
    }
  }
}

// Aᵀ M A of the 8 tiles at m (m[ξ] at stride ld), + bias (+ out), into output rows 2·ty, 2·ty + 1
// of channel plane o, columns 2·tx0 .. (16 of them, clipped to OW / OH).
inline void winograd_output8(const float* m, int64_t ld, float bias, bool accumulate, float* o, int64_t OH,
                             int64_t OW, int64_t ty, int64_t tx0) {
  __m256 mv[16], y[4];
  for (int x = 0; x < 16; ++x) mv[x] = _mm256_loadu_ps(m + x * ld);
  winograd_output_tile(mv, y);
  const __m256 b = _mm256_set1_ps(bias);
  const int64_t cols = std::min<int64_t>(16, OW - 2 * tx0);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i k0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)), lane);
  const __m256i k1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols - 8)), lane);
  for (int dy = 0; dy < 2 && 2 * ty + dy < OH; ++dy) {
    // y[dy·2 + k] for k = 0, 1: output columns 2·(tx0 + l) + k, interleaved.
    const __m256 lo = _mm256_unpacklo_ps(y[2 * dy], y[2 * dy + 1]);  // lanes 0, 1, 4, 5 as pairs
    const __m256 hi = _mm256_unpackhi_ps(y[2 * dy], y[2 * dy + 1]);  // lanes 2, 3, 6, 7
    __m256 r0 = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), b);
    __m256 r1 = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x31), b);
    float* row = o + (2 * ty + dy) * OW + 2 * tx0;
    if (cols == 16) {
      if (accumulate) {
        r0 = _mm256_add_ps(_mm256_loadu_ps(row), r0);
        r1 = _mm256_add_ps(_mm256_loadu_ps(row + 8), r1);
      }
      _mm256_storeu_ps(row, r0);
      _mm256_storeu_ps(row + 8, r1);
      continue;
    }
    if (accumulate) {
      r0 = _mm256_add_ps(_mm256_maskload_ps(row, k0), r0);
      r1 = _mm256_add_ps(_mm256_maskload_ps(row + 8, k1), r1);
    }
    _mm256_maskstore_ps(row, k0, r0);
    _mm256_maskstore_ps(row + 8, k1, r1);
  }
}

}  // namespace

bool conv2d_winograd_f32(const Conv2dParams& p, int64_t Cin, int64_t Cout, int64_t KH, int64_t KW) {
  return conv2d_winograd_f32_form(KH, KW, p) && Cin >= kMinCin && !conv2d_is_direct(Cout, p);
}

void conv2d_winograd(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                     const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], L = u_lda(Cin);
  const int u = p.upsample2x ? 2 : 1;
  const int64_t OH = H * u, OW = W * u, P = OH * OW;
  // The calling thread's U buffer is kept across calls, as the bf16 convs': a fresh one (up to
  // 16 MB at 512 channels) per conv would be zeroed and page-faulted on that one thread.
  static thread_local UnitScratch u_buf;
  float* U = u_buf.get<float>(static_cast<size_t>(Cout * L));
  winograd_weights(w, Cout, Cin, U, pool);
  const ConvBias cb = conv_bias(bias, Cout);
  const ConvGeom g0 = conv_geom(Cin, H, W, 3, 3, OH, OW, p);
  const int64_t max_slots = std::max<int64_t>(16, kVBytes / (64 * Cin) / 16 * 16);
  const WinoPlan d = wino_plan_for(Cout, (OH + 1) / 2, ((OW + 1) / 2 + 15) / 16 * 16, max_slots, kNR, kMR,
                                   pool.size());
  const int64_t NT = d.NT, n_panel = d.n_panel;
  struct Bufs {
    float *V, *M, *rb, *seg;
  };
  run_wino_tasks(
      d, g0, in, Cin * H * W, out, Cout * P, N, Cout, pool,
      [&] {
        static thread_local UnitScratch v_buf, m_buf, row_buf;
        float* rb = row_buf.get<float>(static_cast<size_t>(rows_per_ch(d.shape) + 2 * d.shape.bw + 16));
        return Bufs{v_buf.get<float>(static_cast<size_t>(16 * Cin * NT)),
                    m_buf.get<float>(static_cast<size_t>(16 * kMR * NT)), rb, rb + rows_per_ch(d.shape)};
      },
      [&](const ConvGeom& g, float* o, const WinoPlan::Task& tk, const Bufs& b) {
        const WinoBlock& k = tk.k;
        const int64_t ns = k.bh * k.bw;  // slots (ty − ty0)·bw + (tx − tx0)
        winograd_build_v(g, k, n_panel, b.rb, b.seg, b.V);
        const Slivers sl(tk.c0, tk.c1, kMR);
        for (int64_t i = 0; i < sl.n; ++i) {
          const int64_t co = sl.begin(i);
          const int rows = sl.rows(i);
          for (int x = 0; x < 16; ++x)
            for (int64_t j = 0; j * kNR < ns; ++j)
              ukernel_rows(rows, U + co * L + x * Cin, L, b.V + (x * n_panel + j) * Cin * kNR, kNR, Cin,
                           b.M + x * kMR * NT + j * kNR, NT, false, nullptr);
          for (int r = 0; r < rows; ++r)
            for (int64_t so = 0; so < ns; so += 8) {
              const int64_t ty = k.ty0 + so / k.bw, tx = k.tx0 + so % k.bw;
              if (2 * tx >= OW) continue;  // a dead group
              winograd_output8(b.M + r * NT + so, kMR * NT, cb.v[co + r], p.accumulate, o + (co + r) * P, OH, OW,
                               ty, tx);
            }
        }
      });
}

void conv2d_fast(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p, ThreadPool& pool) {
  if (conv2d_winograd_f32(p, Cin, w.shape[0], w.shape[2], w.shape[3]))
    conv2d_winograd(in, N, Cin, H, W, w, bias, out, p, pool);
  else
    conv2d(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::avx2
