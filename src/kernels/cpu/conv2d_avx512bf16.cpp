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
#include "kernels/cpu/conv2d_bf16_winograd.h"

namespace klein::kernels::avx512bf16 {
namespace {

// Every task of plan d (over OH output rows of a KH-tall kernel) of every batch item, on the
// pool (run_band_tasks), its output rows set to the bias (or the bias added) before body — rows
// [first · OW, (first + rows) · OW) of channels [c0, c1), through `row_scale` output rows per
// planned row.
template <class Body>
void run_bands(const DirectPlan& d, const ConvGeom& g, const float* in, int64_t N, int64_t in_item, float* out,
               int64_t Cout, int64_t P, int64_t OH, int64_t KH, int64_t OW, int64_t row_scale, int64_t CP,
               const ConvBias& cb, bool accumulate, ThreadPool& pool, const Body& body) {
  run_band_tasks(d, g, in, N, in_item, out, Cout * P, OH, KH, Cout, CP, pool, [] {},
                 [&](float* o, const DirectPlan::Task& tk, const uint32_t* S) {
                   const int64_t first = row_scale * tk.oy0 * OW, n = row_scale * tk.rows * OW;
                   conv_init_rows(o, P, tk.c0, tk.c1, first, n, cb, accumulate);
                   body(o, tk, S);
                 });
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
void conv2d_winograd_tiles(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                           const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], CP = (Cin + 1) / 2, LDA = winograd_lda(CP), P = H * W;
  // The calling thread's U buffer is kept across calls (as the workers' scratch): a fresh
  // 2-8 MB vector per conv was zeroed and page-faulted on that one thread each time.
  static thread_local UnitScratch u_buf;
  uint16_t* wu = u_buf.get<uint16_t>(static_cast<size_t>(Cout * LDA * 2));
  winograd_weights(w, Cout, Cin, CP, wu, pool);
  const auto* A = reinterpret_cast<const uint32_t*>(wu);  // read through Bf16Dot::bcast's memcpy
  const ConvBias cb = conv_bias(bias, Cout);
  const ConvGeom g0 = conv_geom(Cin, H, W, 3, 3, H, W, p);
  static_assert(kZNR == 32);  // wino_plan's panels
  const WinoPlan d = wino_plan(Cout, H, W, CP, kZMR, pool.size());
  const int64_t NT = d.NT, n_panel = d.n_panel;
  run_wino_tasks(
      d, g0, in, Cin * H * W, out, Cout * P, N, Cout, pool, [&] { return wino_bufs(d, CP, 16 * kZMR * NT); },
      [&](const ConvGeom& g, float* o, const WinoPlan::Task& tk, const WinoBufs& b) {
        const WinoBlock& k = tk.k;
        const int64_t ns = k.bh * k.bw;  // slots (ty − ty0)·bw + (tx − tx0)
        winograd_build_v(g, k, CP, n_panel, NT, b.rb, b.V);
        const Slivers sl(tk.c0, tk.c1, kZMR);
        for (int64_t i = 0; i < sl.n; ++i) {
          const int64_t co = sl.begin(i);
          const int rows = sl.rows(i);
          for (int x = 0; x < 16; ++x)
            for (int64_t j = 0; j * kZNR < ns; ++j)
              zukernel_rows<Bf16Dot>(rows, A + co * LDA + x * CP, LDA, b.V + (x * n_panel + j) * CP * kZNR, CP,
                                     b.M + x * kZMR * NT + j * kZNR, NT, false, nullptr, kZNR);
          for (int r = 0; r < rows; ++r)
            for (int64_t so = 0; so < ns; so += 16) {
              const int64_t ty = k.ty0 + so / k.bw, tx = k.tx0 + so % k.bw;
              if (2 * tx >= W) continue;  // a dead group
              winograd_output16(b.M + r * NT + so, kZMR * NT, cb.present ? cb.v[co + r] : 0.0f, p.accumulate,
                                o + (co + r) * P, H, W, ty, tx);
            }
        }
      });
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
