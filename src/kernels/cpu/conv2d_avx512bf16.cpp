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

}  // namespace

bool conv2d_subpixel(const Conv2dParams& p, int64_t Cout, int64_t KH, int64_t KW) {
  return conv2d_subpixel_form(KH, KW, p) && !avx2::conv2d_is_direct(Cout, p);
}

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  const int64_t Cout = w.shape[0], T = w.shape[2] * w.shape[3];
  if (conv2d_subpixel(p, Cout, w.shape[2], w.shape[3]))
    conv2d_subpixel_direct(in, N, Cin, H, W, w, bias, out, p, pool);
  else if (p.stride == 1 && T <= 64 && !avx2::conv2d_is_direct(Cout, p))
    conv2d_direct(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
  else
    conv2d_zmm<Bf16Dot>(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::avx512bf16
