// AVX512_BF16 conv2d (Precision::kFast): the transformed input (after upsampling and the
// GroupNorm/SiLU prologue) and the weight rounded to bf16 (round-to-nearest-even, as torch), pairs
// multiplied by vdpbf16ps into float32 sums. ref::conv2d_bf16 is the same arithmetic with double
// sums.
//
// Stride-1 convs (all of the decoder's, most of the encoder's) run a direct kernel with no
// im2col: the unit pairs two input CHANNELS at one position, so for a band of output rows
//   S[cp][r][x] = (bf16 t(x[2cp][iy][ix]), bf16 t(x[2cp+1][iy][ix]))   (zero-padded frame)
// is built once (transformed and rounded once per band), and the B operand of the 14×32
// micro-kernel for tap (ky, kx) and 32 output pixels of row oy is just 32 consecutive units of
// S at row oy − oy0 + ky, column x0 + kx — read in place, one plane (R·LD units) per channel pair
// (zukernel_taps). The weight is reordered once per call to match: per chunk of 32 channel
// pairs, per tap, per pair. Per task (a band of output rows × a range of Cout rows):
//   build S (≤ ~512 KB, so it stays in L2) → per chunk, per ≤ 14-row sliver of Cout, per
//   32-pixel tile: 9 taps × 32 pairs of units into the NCHW output (bias set first).
// Strided convs (the encoder's downsamplers) take the im2col path of conv2d_avx512_common.h.
// The decoder's upsampling convs take the direct path in their sub-pixel form
// (conv2d_subpixel_direct below): 4 of the 9 taps' products per output pixel.
#include "core/dtype.h"
#include "kernels/cpu/avx512bf16_dot.h"
#include "kernels/cpu/conv2d_avx512_common.h"
#include "kernels/cpu/conv2d_bf16_direct.h"

namespace klein::kernels::avx512bf16 {
namespace {

// Every task of plan d (over OH output rows of a KH-tall kernel) of every batch item, on the
// pool: the task's strip S built from g (CP planes of tk.R rows × d.LD units), its output rows
// set to the bias (or the bias added) — rows [first · OW, (first + rows) · OW) of channels
// [c0, c1), through `row_scale` output rows per planned row — then body(o, tk, S).
template <class Body>
void run_bands(const DirectPlan& d, ConvGeom g, const float* in, int64_t N, int64_t in_item, float* out,
               int64_t Cout, int64_t P, int64_t OH, int64_t KH, int64_t OW, int64_t row_scale, int64_t CP,
               const ConvBias& cb, bool accumulate, ThreadPool& pool, const Body& body) {
  for (int64_t n = 0; n < N; ++n) {
    g.x = in + n * in_item;
    float* o = out + n * Cout * P;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      static thread_local UnitScratch strip_buf;
      for (int64_t t = next.fetch_add(1); t < d.n_tasks; t = next.fetch_add(1)) {
        const DirectPlan::Task tk = d.task(t, OH, KH, Cout);
        if (tk.c0 >= tk.c1) continue;
        uint32_t* S = strip_buf.get<uint32_t>(static_cast<size_t>(CP * tk.R * d.LD));
        build_strip(g, CP, tk.oy0, tk.R, d.LD, S);
        conv_init_rows(o, P, tk.c0, tk.c1, row_scale * tk.oy0 * OW, row_scale * tk.rows * OW, cb, accumulate);
        body(o, tk, S);
      }
    });
  }
}

void conv2d_direct(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                   const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3], T = KH * KW, CP = (Cin + 1) / 2;
  const int64_t U = T * CP, P = OH * OW;
  const std::vector<uint16_t> wd = direct_weights(w, Cout, Cin, T, CP, pool);
  const auto* A = reinterpret_cast<const uint32_t*>(wd.data());  // read through Bf16Dot::bcast's memcpy
  static_assert(kZNR == 32);  // direct_plan's pixel tiles
  const DirectPlan d = direct_plan(Cout, OH, OW, KH, KW, CP, kZMR, pool.size());
  const int64_t LD = d.LD;
  run_bands(d, conv_geom(Cin, H, W, KH, KW, OH, OW, p), in, N, Cin * H * W, out, Cout, P, OH, KH, OW, 1, CP,
            conv_bias(bias, Cout), p.accumulate, pool, [&](float* o, const DirectPlan::Task& tk, const uint32_t* S) {
              const Slivers sl(tk.c0, tk.c1, kZMR);
              for (int64_t cp0 = 0; cp0 < CP; cp0 += kCPC) {
                const int64_t cpc = std::min(kCPC, CP - cp0);
                for (int64_t i = 0; i < sl.n; ++i) {
                  const int64_t co = sl.begin(i);
                  const uint32_t* a = A + co * U + T * cp0;
                  for (int64_t rr = 0; rr < tk.rows; ++rr)
                    for (int64_t xt = 0; xt < d.n_xt; ++xt) {
                      const int cols = static_cast<int>(std::min<int64_t>(kZNR, OW - xt * kZNR));
                      zukernel_taps_rows<Bf16Dot>(sl.rows(i), a, U, S + (cp0 * tk.R + rr) * LD + xt * kZNR, d.toff,
                                                  static_cast<int>(T), cpc, tk.R * LD,
                                                  o + co * P + (tk.oy0 + rr) * OW + xt * kZNR, P, true, cols);
                    }
                }
              }
            });
}

// The sub-pixel form (conv2d_subpixel_form, kernels/conv2d.h): the strip is built from the
// input itself (no upsampling, so a quarter of the upsampled strip's units), and each of its
// bands gives 2 × rows output rows through four 4-tap passes, one per phase (dy, dx), whose
// micro-kernel adds column j into output column 2j + dx of row 2a + dy. The phase loop runs
// inside the sliver loop, so that a sliver's output rows stay in L2 across the four phases.
void conv2d_subpixel_direct(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                            const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], CP = (Cin + 1) / 2, U = subpixel_lda(CP), OW = 2 * W, P = 4 * H * W;
  const std::vector<uint16_t> wd = subpixel_weights(w, Cout, Cin, CP, pool);
  const auto* A = reinterpret_cast<const uint32_t*>(wd.data());
  Conv2dParams pl = p;
  pl.upsample2x = false;  // the strip frames the input at its own size, padded by 1
  const DirectPlan d = direct_plan(Cout, H, W, 3, 3, CP, kZMR, pool.size());
  const int64_t LD = d.LD;
  run_bands(d, conv_geom(Cin, H, W, 3, 3, H, W, pl), in, N, Cin * H * W, out, Cout, P, H, 3, OW, 2, CP,
            conv_bias(bias, Cout), p.accumulate, pool, [&](float* o, const DirectPlan::Task& tk, const uint32_t* S) {
              const Slivers sl(tk.c0, tk.c1, kZMR);
              for (int64_t cp0 = 0; cp0 < CP; cp0 += kCPC) {
                const int64_t cpc = std::min(kCPC, CP - cp0);
                for (int64_t i = 0; i < sl.n; ++i)
                  for (int ph = 0; ph < 4; ++ph) {
                    const int64_t dy = ph / 2, dx = ph % 2;
                    // Tap (ty, tx) reads strip row rr + dy + ty (input row a − 1 + dy + ty), column x + dx + tx.
                    const int64_t toff[4] = {dy * LD + dx, dy * LD + dx + 1, (dy + 1) * LD + dx,
                                             (dy + 1) * LD + dx + 1};
                    const int64_t co = sl.begin(i);
                    const uint32_t* a = A + (ph * Cout + co) * U + 4 * cp0;
                    for (int64_t rr = 0; rr < tk.rows; ++rr)
                      for (int64_t xt = 0; xt < d.n_xt; ++xt) {
                        const int cols = static_cast<int>(std::min<int64_t>(kZNR, W - xt * kZNR));
                        const uint32_t* b = S + (cp0 * tk.R + rr) * LD + xt * kZNR;
                        float* c = o + co * P + (2 * (tk.oy0 + rr) + dy) * OW + 2 * xt * kZNR;
                        if (dx == 0)
                          zukernel_taps_rows<Bf16Dot, 0>(sl.rows(i), a, U, b, toff, 4, cpc, tk.R * LD, c, P, true, cols);
                        else
                          zukernel_taps_rows<Bf16Dot, 1>(sl.rows(i), a, U, b, toff, 4, cpc, tk.R * LD, c, P, true, cols);
                      }
                  }
              }
            });
}

// ---- The Winograd form F(2×2, 3×3) (conv2d_winograd_form, kernels/conv2d.h) ----
// Tiles of 2×2 output pixels live in slots s = ty·TWp + tx, TWp = TW rounded up to 16, so that
// each group of 16 slots (the lanes of one vector) lies in one tile row; slots tx ≥ TW are dead
// (computed, never stored). A task takes a block of NT slots (whole 32-slot panels) and a range
// of output channels:
//   V[ξ][panel][cp][32] ← for each channel pair, the block's 16 transformed values per tile
//     (winograd_input_tile, vectorised over the 16 tiles of a group), rounded to bf16 pairs;
//   per ≤ 14-row sliver of Cout: M[ξ][row][slot] = U_ξ · V_ξ, 16 calls of the 14×32
//     micro-kernel per panel with K = the CP channel pairs (U = winograd_weight_tile, as pair
//     units [Cout][ξ][CP]); then Aᵀ M A per tile, + bias (+ out), into the NCHW output.
// V stays in L2 (≤ kWinoVBytes), a sliver's M (16 · 14 · NT floats) in L1/L2.
constexpr int64_t kWinoVBytes = int64_t{512} << 10;
// Fewer input channels keep the direct form: K = CP pairs per micro-kernel call would be too
// short to pay for the transforms (the encoder's conv_in has 3).
constexpr int64_t kWinoMinCin = 16;

// Units per output channel of U: 16·CP, one line more (16·CP units are a multiple of 4 KB for
// every CP ≥ 64: a sliver's 14 rows would share L1 sets, as subpixel_lda's).
constexpr int64_t winograd_lda(int64_t CP) { return 16 * CP + 16; }

// winograd_weight_tile of 16 kernels at once: g[k] holds tap k of each, u[ξ] gets U_ξ; the same
// float operations in the same order, so the same bits.
inline void winograd_weight16(const __m512* g, __m512* u) {
  const __m512 half = _mm512_set1_ps(0.5f);
  __m512 h[12];
  for (int c = 0; c < 3; ++c) {
    h[0 + c] = g[c];
    h[3 + c] = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(g[c], g[3 + c]), g[6 + c]), half);
    h[6 + c] = _mm512_mul_ps(_mm512_add_ps(_mm512_sub_ps(g[c], g[3 + c]), g[6 + c]), half);
    h[9 + c] = g[6 + c];
  }
  for (int i = 0; i < 4; ++i) {
    const __m512* x = h + 3 * i;
    u[4 * i + 0] = x[0];
    u[4 * i + 1] = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(x[0], x[1]), x[2]), half);
    u[4 * i + 2] = _mm512_mul_ps(_mm512_add_ps(_mm512_sub_ps(x[0], x[1]), x[2]), half);
    u[4 * i + 3] = x[2];
  }
}

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
        winograd_weight16(g, u);
        for (int x = 0; x < 16; ++x) _mm512_storeu_ps(uf.data() + x * Cin16 + c0, u[x]);
      }
      uint16_t* d = out + co * U * 2;
      for (int x = 0; x < 16; ++x) {
        f32_to_bf16_row(uf.data() + x * Cin16, Cin, d + 2 * x * CP);
        if (Cin % 2) d[2 * x * CP + Cin] = 0;  // the last pair's missing channel
      }
    }
  });
}

// A block of tiles: tile rows [ty0, ty0 + bh) × tile columns [tx0, tx0 + bw), bw a multiple of
// 16; its slots are (ty − ty0)·bw + (tx − tx0).
struct WinoBlock {
  int64_t ty0, bh, tx0, bw;
};

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
// winograd_rows builds it): winograd_input_tile's operations on vectors, lane l ↔ tile l.
inline void winograd_input16(const float* rb, int64_t LE, int64_t r0, int64_t k0, __m512* v) {
  __m512 e[16];
  for (int r = 0; r < 4; ++r) {
    const float* E = rb + (r0 + r) * 2 * LE + k0;
    const float* O = E + LE;
    const __m512 d0 = _mm512_loadu_ps(E), d1 = _mm512_loadu_ps(O);
    const __m512 d2 = _mm512_loadu_ps(E + 1), d3 = _mm512_loadu_ps(O + 1);
    e[4 * r + 0] = _mm512_sub_ps(d0, d2);
    e[4 * r + 1] = _mm512_add_ps(d1, d2);
    e[4 * r + 2] = _mm512_sub_ps(d2, d1);
    e[4 * r + 3] = _mm512_sub_ps(d1, d3);
  }
  for (int j = 0; j < 4; ++j) {
    v[0 + j] = _mm512_sub_ps(e[0 + j], e[8 + j]);
    v[4 + j] = _mm512_add_ps(e[4 + j], e[8 + j]);
    v[8 + j] = _mm512_sub_ps(e[8 + j], e[4 + j]);
    v[12 + j] = _mm512_sub_ps(e[4 + j], e[12 + j]);
  }
}

// Two rows of 16 floats → 16 bf16 pairs as f32x16x2_to_bf16_pairs, but by vcvtne2ps2bf16 (two
// instructions where the exact conversion takes ~18): denormal inputs become 0, where the
// reference keeps them — a difference below 2^-126 per product, far under any test bound; the
// transformed input is the only operand converted so (the weight, once per call, is exact).
inline __m512i bf16_pairs_ftz(__m512 lo, __m512 hi) {
  // cvtne2ps(hi, lo): bf16 of lo in elements 0-15, of hi in 16-31; interleave them as pairs.
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// Aᵀ M A of the 16 tiles of a group (m[ξ] at stride ld), + bias (+ out), into output rows
// 2·ty, 2·ty + 1 of channel plane o, columns 2·tx0 .. (32 of them, clipped to OW / OH).
inline void winograd_output16(const float* m, int64_t ld, float bias, bool accumulate, float* o, int64_t OH,
                              int64_t OW, int64_t ty, int64_t tx0) {
  __m512 s[8];
  for (int i = 0; i < 4; ++i) {
    const __m512 m0 = _mm512_loadu_ps(m + (4 * i) * ld), m1 = _mm512_loadu_ps(m + (4 * i + 1) * ld);
    const __m512 m2 = _mm512_loadu_ps(m + (4 * i + 2) * ld), m3 = _mm512_loadu_ps(m + (4 * i + 3) * ld);
    s[2 * i] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
    s[2 * i + 1] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
  }
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  const __m512 b = _mm512_set1_ps(bias);
  const int64_t cols = std::min<int64_t>(32, OW - 2 * tx0);
  const __mmask16 k0 = col_mask(static_cast<int>(cols)), k1 = col_mask(static_cast<int>(std::max<int64_t>(0, cols - 16)));
  for (int dy = 0; dy < 2 && 2 * ty + dy < OH; ++dy) {
    // y[dy][k] for k = 0, 1: output columns 2·(tx0 + l) + k.
    const __m512 y0 = dy == 0 ? _mm512_add_ps(_mm512_add_ps(s[0], s[2]), s[4]) : _mm512_sub_ps(_mm512_sub_ps(s[2], s[4]), s[6]);
    const __m512 y1 = dy == 0 ? _mm512_add_ps(_mm512_add_ps(s[1], s[3]), s[5]) : _mm512_sub_ps(_mm512_sub_ps(s[3], s[5]), s[7]);
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

// The block shape for NT slots at most: whole tile rows of up to NT tiles (bh > 1 only where a
// tile row is shorter). Blocks of fewer columns and more rows build fewer prologue values per
// tile ((2·bh + 2) rows of 2·bw + 16 for bh · bw tiles: 1.56 against 2.12 per input value for
// 128 channels at 256²), but measured no faster (2 threads, Zen 4): their input rows are read as
// short runs of many rows.
inline WinoBlock wino_shape(int64_t NT, int64_t TH, int64_t TWp) {
  const int64_t bw = std::min(NT, TWp);
  return {0, std::clamp<int64_t>(NT / bw, 1, TH), 0, bw};
}

void conv2d_winograd_tiles(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                           const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], CP = (Cin + 1) / 2, LDA = winograd_lda(CP), P = H * W;
  const int64_t TH = (H + 1) / 2, TW = (W + 1) / 2, TWp = (TW + 15) / 16 * 16;
  // The calling thread's U buffer is kept across calls (as the workers' scratch): a fresh
  // 2-8 MB vector per conv was zeroed and page-faulted on that one thread each time.
  static thread_local UnitScratch u_buf;
  uint16_t* wu = u_buf.get<uint16_t>(static_cast<size_t>(Cout * LDA * 2));
  winograd_weights(w, Cout, Cin, CP, wu, pool);
  const auto* A = reinterpret_cast<const uint32_t*>(wu);  // read through Bf16Dot::bcast's memcpy
  const ConvBias cb = conv_bias(bias, Cout);
  const ConvGeom g0 = conv_geom(Cin, H, W, 3, 3, H, W, p);
  // Slots per block: V (16 · CP · NT units) within kWinoVBytes, whole panels.
  const WinoBlock shape = wino_shape(std::max<int64_t>(kZNR, kWinoVBytes / (64 * CP) / kZNR * kZNR), TH, TWp);
  const int64_t NT = (shape.bh * shape.bw + kZNR - 1) / kZNR * kZNR, n_panel = NT / kZNR, LE = wino_le(shape.bw);
  const int64_t n_bx = (TWp + shape.bw - 1) / shape.bw, n_blk = (TH + shape.bh - 1) / shape.bh * n_bx;
  const int64_t n_unit = (Cout + kZMR - 1) / kZMR;
  const int64_t n_cc = std::clamp<int64_t>((4 * static_cast<int64_t>(pool.size()) + n_blk - 1) / n_blk, 1, n_unit);
  const int64_t cc_rows = (n_unit + n_cc - 1) / n_cc * kZMR, n_tasks = n_blk * n_cc;
  for (int64_t n = 0; n < N; ++n) {
    ConvGeom g = g0;
    g.x = in + n * Cin * H * W;
    float* o = out + n * Cout * P;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      static thread_local UnitScratch v_buf, m_buf, row_buf;
      uint32_t* V = v_buf.get<uint32_t>(static_cast<size_t>(16 * CP * NT));
      float* M = m_buf.get<float>(static_cast<size_t>(16 * kZMR * NT));
      const int64_t rows_per_ch = (2 * shape.bh + 2) * 2 * LE;
      float* rb = row_buf.get<float>(static_cast<size_t>(2 * rows_per_ch));  // two channels' rows
      float v0[16 * 16];                                                   // channel 2·cp's v, [ξ][lane]
      for (int64_t t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
        const int64_t bi = t / n_cc, c0 = t % n_cc * cc_rows, c1 = std::min(Cout, c0 + cc_rows);
        if (c0 >= c1) continue;
        WinoBlock k = shape;
        k.ty0 = bi / n_bx * shape.bh, k.tx0 = bi % n_bx * shape.bw;
        k.bh = std::min(shape.bh, TH - k.ty0), k.bw = std::min(shape.bw, TWp - k.tx0);
        const int64_t ns = k.bh * k.bw;  // slots (ty − ty0)·bw + (tx − tx0); the rest of the last panel zero
        if (ns % kZNR) std::memset(V, 0, static_cast<size_t>(16 * CP * NT) * 4);
        for (int64_t cp = 0; cp < CP; ++cp) {
          const bool pair = 2 * cp + 1 < Cin;
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
            for (int x = 0; x < 16; ++x)
              _mm512_storeu_si512(V + ((x * n_panel + so / kZNR) * CP + cp) * kZNR + so % kZNR,
                                  bf16_pairs_ftz(_mm512_loadu_ps(v0 + 16 * x), v[x]));
          }
        }
        const Slivers sl(c0, c1, kZMR);
        for (int64_t i = 0; i < sl.n; ++i) {
          const int64_t co = sl.begin(i);
          const int rows = sl.rows(i);
          for (int x = 0; x < 16; ++x)
            for (int64_t j = 0; j * kZNR < ns; ++j)
              zukernel_rows<Bf16Dot>(rows, A + co * LDA + x * CP, LDA, V + (x * n_panel + j) * CP * kZNR, CP,
                                     M + x * kZMR * NT + j * kZNR, NT, false, nullptr, kZNR);
          for (int r = 0; r < rows; ++r)
            for (int64_t so = 0; so < ns; so += 16) {
              const int64_t ty = k.ty0 + so / k.bw, tx = k.tx0 + so % k.bw;
              if (2 * tx >= W) continue;  // a dead group
              winograd_output16(M + r * NT + so, kZMR * NT, cb.present ? cb.v[co + r] : 0.0f, p.accumulate,
                                o + (co + r) * P, H, W, ty, tx);
            }
        }
      }
    });
  }
}

}  // namespace

bool conv2d_subpixel(const Conv2dParams& p, int64_t Cout, int64_t KH, int64_t KW) {
  return conv2d_subpixel_form(KH, KW, p) && !avx2::conv2d_is_direct(Cout, p);
}

bool conv2d_winograd(const Conv2dParams& p, int64_t Cin, int64_t Cout, int64_t KH, int64_t KW) {
  return conv2d_winograd_form(KH, KW, p) && Cin >= kWinoMinCin && !avx2::conv2d_is_direct(Cout, p);
}

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  const int64_t Cout = w.shape[0], T = w.shape[2] * w.shape[3];
  if (conv2d_subpixel(p, Cout, w.shape[2], w.shape[3]))
    conv2d_subpixel_direct(in, N, Cin, H, W, w, bias, out, p, pool);
  else if (conv2d_winograd(p, Cin, Cout, w.shape[2], w.shape[3]))
    conv2d_winograd_tiles(in, N, Cin, H, W, w, bias, out, p, pool);
  else if (p.stride == 1 && T <= 64 && !avx2::conv2d_is_direct(Cout, p))
    conv2d_direct(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
  else
    conv2d_zmm<Bf16Dot>(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::avx512bf16
