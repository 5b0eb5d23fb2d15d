// AMX conv2d (Precision::kFast): the AVX512_BF16 conv's arithmetic (input after the prologue and
// weights rounded to bf16, float32 sums: ref::conv2d_bf16) with tdpbf16ps tile products.
//
// Stride-1 convs run the direct algorithm of conv2d_avx512bf16.cpp on its operands
// (conv2d_bf16_direct.h): per band of output rows the strip S[channel pair][row][x] of bf16 pair
// units, and the weight as units [Cout][chunk][tap][pair]. For 32 output channels × 32 output
// pixels of one row, 2 × 2 tiles accumulate over every chunk, tap and 16 channel pairs:
//   A tile = 16 output channels × 16 pair units of one tap  (weight rows in place, stride U units)
//   B tile = 16 pair units × 16 pixels: S rows of 16 channel pairs at row oy + ky, columns
//            x + kx .. x + kx + 15 (stride one channel-pair plane, R·LD units)
// so the im2col is never formed and the tiles read both operands where they lie. The sums start
// from the output (the bias, or what is accumulated onto) and go back to it through a 32 × 32
// scratch, so partial tiles (edges of OW and Cout) need no special path. The channel pairs are
// padded to whole 16-pair steps, Cout to whole 32-row blocks (zero weights).
// The decoder's upsampling convs take this path in their sub-pixel form (conv2d_subpixel_direct),
// the other same-padded 3×3 convs of ≥ 16 channels the Winograd form (conv2d_winograd_tiles).
// Strided convs (the encoder's downsamplers) run the im2col GEMM of the AVX512_BF16 conv with the
// same tiles (conv2d_im2col below); the few-output-channel ones the float32 direct conv, as in
// every conv kernel.
#include "kernels/cpu/amx_common.h"
#include "kernels/cpu/avx512bf16_dot.h"
#include "kernels/cpu/conv2d_avx512_common.h"
#include "kernels/cpu/conv2d_bf16_direct.h"
#include "kernels/cpu/conv2d_bf16_winograd.h"

namespace klein::kernels::amx {
namespace {

// Accumulator tiles 0..3 (32 co × 32 pixels) += one chunk's products over every tap and its cpc
// pairs; a = the weight units of row co at this chunk ([tap][cpc] units, rows U apart), s = S
// at (the chunk's first pair, row oy − oy0, column x), tap (ky, kx) at s + toff[t].
void conv_tile(const uint32_t* a, int64_t U, int64_t cpc, const uint32_t* s, int64_t plane, const int64_t* toff,
               int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    const uint32_t* at = a + t * cpc;
    const uint32_t* st = s + toff[t];
    for (int64_t i = 0; i < cpc; i += 16)
      amx_step<false>(at + i, at + 16 * U + i, U * 4, st + i * plane, st + i * plane + 16, plane * 4);
  }
}

// The accumulators from / back to the output block of `nr` ≤ 32 channels × `ncol` ≤ 32 pixels at
// ob (rows P apart), through the 32 × 32 scratch cbuf (zeros outside the block), so edges need no
// path of their own.
void out_to_acc(const float* ob, int64_t P, int nr, int ncol, float* cbuf) {
  const __mmask16 m0 = col_mask(ncol), m1 = col_mask(std::max(0, ncol - 16));
  for (int r = 0; r < 32; ++r) {
    const bool in = r < nr;
    _mm512_store_ps(cbuf + r * 32, in ? _mm512_maskz_loadu_ps(m0, ob + r * P) : _mm512_setzero_ps());
    _mm512_store_ps(cbuf + r * 32 + 16, in ? _mm512_maskz_loadu_ps(m1, ob + r * P + 16) : _mm512_setzero_ps());
  }
  amx_acc_load(cbuf, 128);
}
// The accumulators of a block that starts from the bias alone (bias: its first channel's; the
// conv does not accumulate onto the output): no pass over the output beforehand and no read of
// it here — at the VAE encoder's 512² (128 channels, 134 MB a tensor) those passes were ~9 % of
// its time, waiting on memory.
void bias_to_acc(const float* bias, int nr, float* cbuf) {
  for (int r = 0; r < 32; ++r) {
    const __m512 v = r < nr ? _mm512_set1_ps(bias[r]) : _mm512_setzero_ps();
    _mm512_store_ps(cbuf + r * 32, v);
    _mm512_store_ps(cbuf + r * 32 + 16, v);
  }
  amx_acc_load(cbuf, 128);
}
void acc_to_out(float* ob, int64_t P, int nr, int ncol, float* cbuf) {
  amx_acc_store(cbuf, 128);
  const __mmask16 m0 = col_mask(ncol), m1 = col_mask(std::max(0, ncol - 16));
  for (int r = 0; r < nr; ++r) {
    _mm512_mask_storeu_ps(ob + r * P, m0, _mm512_load_ps(cbuf + r * 32));
    if (ncol > 16) _mm512_mask_storeu_ps(ob + r * P + 16, m1, _mm512_load_ps(cbuf + r * 32 + 16));
  }
}

void conv2d_direct(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                   const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3], T = KH * KW;
  const int64_t CP = ((Cin + 1) / 2 + 15) / 16 * 16;  // channel pairs, whole tile steps
  const int64_t U = T * CP, P = OH * OW, CoutP = (Cout + 31) / 32 * 32;
  std::vector<uint16_t> wd = direct_weights(w, Cout, Cin, T, CP, pool);
  wd.resize(static_cast<size_t>(CoutP * U * 2), 0);  // zero rows up to whole 32-row blocks
  const auto* A = reinterpret_cast<const uint32_t*>(wd.data());
  const ConvBias cb = conv_bias(bias, Cout);
  ConvGeom g = conv_geom(Cin, H, W, KH, KW, OH, OW, p);

  const DirectPlan d = direct_plan(Cout, OH, OW, KH, KW, CP, 32, pool.size());
  const int64_t LD = d.LD;
  run_band_tasks(d, g, in, N, Cin * H * W, out, Cout * P, OH, KH, Cout, CP, pool, amx_configure_tiles,
                 [&](float* o, const DirectPlan::Task& tk, const uint32_t* S) {
                   const int64_t oy0 = tk.oy0, R = tk.R, c0 = tk.c0, c1 = tk.c1;
                   alignas(64) float cbuf[32 * 32];
                   if (p.accumulate) conv_init_rows(o, P, c0, c1, oy0 * OW, tk.rows * OW, cb, true);
                   for (int64_t co = c0; co < c1; co += 32) {
                     const int nr = static_cast<int>(std::min<int64_t>(32, c1 - co));
                     for (int64_t rr = 0; rr < tk.rows; ++rr)
                       for (int64_t xt = 0; xt < d.n_xt; ++xt) {
                         const int64_t x0 = xt * 32;
                         const int ncol = static_cast<int>(std::min<int64_t>(32, OW - x0));
                         float* ob = o + co * P + (oy0 + rr) * OW + x0;
                         if (p.accumulate)
                           out_to_acc(ob, P, nr, ncol, cbuf);
                         else
                           bias_to_acc(cb.v.data() + co, nr, cbuf);
                         for (int64_t cp0 = 0; cp0 < CP; cp0 += kCPC)
                           conv_tile(A + co * U + T * cp0, U, std::min(kCPC, CP - cp0), S + (cp0 * R + rr) * LD + x0,
                                     R * LD, d.toff, T);
                         acc_to_out(ob, P, nr, ncol, cbuf);
                       }
                   }
                 });
}

// The two dx phases' 32 × 32 sums c[dx][row][j] (rows 0..nr − 1) into output rows ob + r·P as
// column 2j + dx, nout ≤ 64 columns (+ what the output holds, when accumulating): for each half h,
// output columns 32h + 0..15 / 16..31 take lanes 0-7 / 8-15 of both phases, interleaved.
void interleave_to_out(const float (*c)[32 * 32], int nr, int nout, bool accumulate, float* ob, int64_t P) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  for (int r = 0; r < nr; ++r)
    for (int h = 0; h < 2 && 32 * h < nout; ++h) {
      const __m512 e = _mm512_load_ps(c[0] + r * 32 + 16 * h), q = _mm512_load_ps(c[1] + r * 32 + 16 * h);
      float* dst = ob + r * P + 32 * h;
      const __mmask16 m0 = col_mask(nout - 32 * h), m1 = col_mask(std::max(0, nout - 32 * h - 16));
      __m512 v0 = _mm512_permutex2var_ps(e, lo, q), v1 = _mm512_permutex2var_ps(e, hi, q);
      if (accumulate) {
        v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, dst));
        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, dst + 16));
      }
      _mm512_mask_storeu_ps(dst, m0, v0);
      if (m1) _mm512_mask_storeu_ps(dst + 16, m1, v1);
    }
}

// The decoder's upsampling convs in their sub-pixel form (conv2d_subpixel_form, kernels/conv2d.h;
// ref::conv2d_bf16_subpixel's arithmetic): four 2 × 2 convs of the input itself, one per phase
// (dy, dx), whose summed taps are subpixel_weights' ([phase][Cout][subpixel_lda(CP)] units). The
// strip is built from the input at its own size, so a quarter of the upsampled strip's units and
// prologue work, and each block takes 4 taps per phase instead of 9. Per 32 channels × 32 input
// columns of input row a: for dy, the two dx phases' accumulators go to two 32 × 32 scratches and
// out interleaved (column j of phase dx → output column 2j + dx of row 2a + dy).
void conv2d_subpixel_direct(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                            const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], CP = ((Cin + 1) / 2 + 15) / 16 * 16, U = subpixel_lda(CP);
  const int64_t OW = 2 * W, P = 4 * H * W;
  std::vector<uint16_t> wd = subpixel_weights(w, Cout, Cin, CP, pool);
  // The last phase's last block may read up to 31 rows past Cout: zeros (never stored).
  wd.resize(wd.size() + static_cast<size_t>(32 * U * 2), 0);
  const auto* A = reinterpret_cast<const uint32_t*>(wd.data());
  const ConvBias cb = conv_bias(bias, Cout);
  Conv2dParams pl = p;
  pl.upsample2x = false;  // the strip frames the input at its own size, padded by 1
  ConvGeom g = conv_geom(Cin, H, W, 3, 3, H, W, pl);
  const DirectPlan d = direct_plan(Cout, H, W, 3, 3, CP, 32, pool.size());
  const int64_t LD = d.LD;
  run_band_tasks(d, g, in, N, Cin * H * W, out, Cout * P, H, 3, Cout, CP, pool, amx_configure_tiles,
                 [&](float* o, const DirectPlan::Task& tk, const uint32_t* S) {
                   const int64_t R = tk.R, c0 = tk.c0, c1 = tk.c1;
                   alignas(64) float cbuf[2][32 * 32];
                   for (int64_t co = c0; co < c1; co += 32) {
                     const int nr = static_cast<int>(std::min<int64_t>(32, c1 - co));
                     for (int64_t rr = 0; rr < tk.rows; ++rr)
                       for (int64_t xt = 0; xt < d.n_xt; ++xt) {
                         const int64_t x0 = xt * 32;
                         const int ncol = static_cast<int>(std::min<int64_t>(32, W - x0));
                         for (int64_t dy = 0; dy < 2; ++dy) {
                           for (int64_t dx = 0; dx < 2; ++dx) {
                             // Tap (ty, tx): strip row rr + dy + ty (input row a − 1 + dy + ty), column x + dx + tx.
                             const int64_t t0 = dy * LD + dx, toff[4] = {t0, t0 + 1, t0 + LD, t0 + LD + 1};
                             const uint32_t* a = A + ((dy * 2 + dx) * Cout + co) * U;
                             bias_to_acc(cb.v.data() + co, nr, cbuf[dx]);  // (+ the output, at the store)
                             for (int64_t cp0 = 0; cp0 < CP; cp0 += kCPC)
                               conv_tile(a + 4 * cp0, U, std::min(kCPC, CP - cp0), S + (cp0 * R + rr) * LD + x0,
                                         R * LD, toff, 4);
                             amx_acc_store(cbuf[dx], 128);
                           }
                           interleave_to_out(cbuf, nr, 2 * ncol, p.accumulate,
                                             o + co * P + (2 * (tk.oy0 + rr) + dy) * OW + 2 * x0, P);
                         }
                       }
                   }
                 });
}

// The other same-padded 3×3 convs in Winograd form F(2×2, 3×3) (conv2d_bf16_winograd.h; 16
// products per 2×2 output tile and channel instead of 36, ref::conv2d_bf16_winograd's arithmetic),
// the AVX512_BF16 conv's algorithm with the products on tiles. Per task (a block of NT slots, a
// range of output channels) V is built once; then per 32 output channels × 32-slot panel, per ξ,
// M_ξ[co][slot] = U_ξ · V_ξ over the channel pairs: A tile = 16 rows of U_ξ × 16 pairs (rows LDA
// units apart), B tile = 16 pairs × 16 slots of V's panel (rows 32 units apart), stored to a
// 32 × 32 scratch per ξ; then Aᵀ M A + bias (+ out) per group of 16 tiles. The channel pairs are
// padded to whole 16-pair steps (zero in U and V), Cout to whole 32-row blocks (zero U rows).
void conv2d_winograd_tiles(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                           const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], CP = ((Cin + 1) / 2 + 15) / 16 * 16, LDA = winograd_lda(CP), P = H * W;
  const int64_t CoutP = (Cout + 31) / 32 * 32;
  // Kept across calls in the calling thread's scratch, as the AVX512_BF16 conv's.
  static thread_local UnitScratch u_buf;
  uint16_t* wu = u_buf.get<uint16_t>(static_cast<size_t>(CoutP * LDA * 2));
  winograd_weights(w, Cout, Cin, CP, wu, pool);
  std::memset(wu + Cout * LDA * 2, 0, static_cast<size_t>((CoutP - Cout) * LDA) * 4);
  const auto* A = reinterpret_cast<const uint32_t*>(wu);
  const ConvBias cb = conv_bias(bias, Cout);
  const ConvGeom g0 = conv_geom(Cin, H, W, 3, 3, H, W, p);
  const WinoPlan d = wino_plan(Cout, H, W, CP, 32, pool.size());
  const int64_t NT = d.NT, n_panel = d.n_panel;
  run_wino_tasks(
      d, g0, in, Cin * H * W, out, Cout * P, N, Cout, pool,
      [&] {
        amx_configure_tiles();
        return wino_bufs(d, CP, 16 * 32 * 32);  // M: [ξ][32 co][32 slots]
      },
      [&](const ConvGeom& g, float* o, const WinoPlan::Task& tk, const WinoBufs& b) {
        const WinoBlock& k = tk.k;
        const int64_t ns = k.bh * k.bw;  // slots (ty − ty0)·bw + (tx − tx0)
        winograd_build_v(g, k, CP, n_panel, NT, b.rb, b.V);
        for (int64_t co = tk.c0; co < tk.c1; co += 32) {
          const int nr = static_cast<int>(std::min<int64_t>(32, tk.c1 - co));
          for (int64_t j = 0; j * 32 < ns; ++j) {
            for (int x = 0; x < 16; ++x) {
              const uint32_t* a = A + co * LDA + x * CP;
              const uint32_t* bv = b.V + (x * n_panel + j) * CP * 32;
              amx_acc_zero();
              for (int64_t cp0 = 0; cp0 < CP; cp0 += 16)
                amx_step<false>(a + cp0, a + 16 * LDA + cp0, LDA * 4, bv + cp0 * 32, bv + cp0 * 32 + 16, 128);
              amx_acc_store(b.M + x * 1024, 128);
            }
            for (int r = 0; r < nr; ++r)
              for (int64_t so = j * 32; so < std::min(ns, j * 32 + 32); so += 16) {
                const int64_t ty = k.ty0 + so / k.bw, tx = k.tx0 + so % k.bw;
                if (2 * tx >= W) continue;  // a dead group
                winograd_output16(b.M + r * 32 + so % 32, 1024, cb.present ? cb.v[co + r] : 0.0f, p.accumulate,
                                  o + (co + r) * P, H, W, ty, tx);
              }
          }
        }
      });
}

// Strided convs (the encoder's downsamplers): the im2col GEMM of conv2d_avx512_common.h — the
// same bf16 panels [8 panels][kcu][32 units] per block of 256 output pixels and K slice, packed
// by conv_pack_units<Bf16Dot> — with the products on tiles: A = 16 output channels × 16 units of
// the weight rows ([CoutP][KUp] bf16 pairs, padded with zeros to whole 32-row blocks and 16-unit
// steps), B = 16 units × 16 pixels of a panel (rows 128 bytes apart); the sums accumulate in the
// output through a 32 × 32 scratch, slice after slice.
void conv2d_im2col(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                   const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  const int64_t K = Cin * KH * KW, KU = (K + 1) / 2, KUp = (KU + 15) / 16 * 16, P = OH * OW;
  const int64_t CoutP = (Cout + 31) / 32 * 32;
  std::vector<uint16_t> wb(static_cast<size_t>(CoutP * KUp * 2), 0);  // [CoutP][KUp] bf16 pairs
  pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
    static thread_local UnitScratch row;
    float* f = row.get<float>(K);
    for (int64_t r = b; r < e; ++r) {
      weight_row_f32(w, r, K, f);
      f32_to_bf16_row(f, K, wb.data() + r * KUp * 2);
    }
  });
  const auto* A = reinterpret_cast<const uint32_t*>(wb.data());
  const ConvBias cb = conv_bias(bias, Cout);
  ConvGeom g = conv_geom(Cin, H, W, KH, KW, OH, OW, p);
  const bool use_strip = (g.prologue || g.up) && !g.pointwise;
  const int64_t NB = kConvZNB, n_pb = (P + NB - 1) / NB, n_blk = CoutP / 32;
  const int64_t want = 4 * static_cast<int64_t>(pool.size());
  const int64_t n_cc = std::clamp<int64_t>((want + n_pb - 1) / n_pb, 1, n_blk);
  const int64_t cc_rows = (n_blk + n_cc - 1) / n_cc * 32;
  const int64_t n_tasks = n_pb * n_cc;
  for (int64_t n = 0; n < N; ++n) {
    g.x = in + n * Cin * H * W;
    float* o = out + n * Cout * P;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      amx_configure_tiles();
      static thread_local UnitScratch panel_buf, sub_buf, strip_buf;
      uint32_t* bp = panel_buf.get<uint32_t>(static_cast<size_t>(NB * std::min(kConvZKCU, KUp)));
      float* sub = sub_buf.get<float>(static_cast<size_t>(NB * kConvZSub));
      alignas(64) float cbuf[32 * 32];
      for (int64_t t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
        const int64_t pb = t / n_cc, cc = t % n_cc;
        const int64_t pix0 = pb * NB, nb = std::min(NB, P - pix0);
        const int64_t c0 = cc * cc_rows, c1 = std::min(Cout, c0 + cc_rows);
        if (c0 >= c1) continue;
        conv_init_rows(o, P, c0, c1, pix0, nb, cb, p.accumulate);
        const int64_t n_panel = (nb + kZNR - 1) / kZNR;
        for (int64_t q0 = 0; q0 < KUp; q0 += kConvZKCU) {
          const int64_t kcu = std::min(kConvZKCU, KUp - q0);  // a multiple of 16
          const int64_t k0 = q0 * 2, kc = std::clamp<int64_t>(K - k0, 0, kcu * 2);
          // Units past K must be zero in the panels (conv_pack_units writes only the k that exist).
          if (kc < kcu * 2) std::memset(bp, 0, static_cast<size_t>(n_panel * kcu * kZNR) * 4);
          if (kc > 0) {
            if (use_strip)
              conv_pack_units<Bf16Dot>(build_pack_strip(g, pix0, nb, k0, kc, strip_buf), pix0, nb, k0, kc, kcu, bp, sub);
            else
              conv_pack_units<Bf16Dot>(g, pix0, nb, k0, kc, kcu, bp, sub);
          }
          for (int64_t co = c0; co < c1; co += 32) {
            const int nr = static_cast<int>(std::min<int64_t>(32, c1 - co));
            const uint32_t* a = A + co * KUp + q0;
            for (int64_t j = 0; j < n_panel; ++j) {
              const int ncol = static_cast<int>(std::min<int64_t>(kZNR, nb - j * kZNR));
              float* ob = o + co * P + pix0 + j * kZNR;
              out_to_acc(ob, P, nr, ncol, cbuf);
              const uint32_t* b = bp + j * kcu * kZNR;
              for (int64_t u = 0; u < kcu; u += 16)
                amx_step<false>(a + u, a + 16 * KUp + u, KUp * 4, b + u * kZNR, b + u * kZNR + 16, kZNR * 4);
              acc_to_out(ob, P, nr, ncol, cbuf);
            }
          }
        }
      }
    });
  }
}

}  // namespace

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w, const Weight* bias,
            float* out, int64_t OH, int64_t OW, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], T = w.shape[2] * w.shape[3];
  if (avx2::conv2d_is_direct(Cout, p))
    avx2::conv2d(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);  // few output channels: float32
  else if (avx512bf16::conv2d_subpixel(p, Cout, w.shape[2], w.shape[3]))  // the AVX512_BF16 conv's forms
    conv2d_subpixel_direct(in, N, Cin, H, W, w, bias, out, p, pool);
  else if (avx512bf16::conv2d_winograd(p, Cin, Cout, w.shape[2], w.shape[3]))
    conv2d_winograd_tiles(in, N, Cin, H, W, w, bias, out, p, pool);
  else if (p.stride == 1 && T <= 64)
    conv2d_direct(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
  else
    conv2d_im2col(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::amx
