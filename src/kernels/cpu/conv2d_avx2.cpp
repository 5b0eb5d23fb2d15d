// AVX2/FMA conv2d as an implicit GEMM:  out[Cout, P] (+)= Wf[Cout, K] · col[K, P]  with
// P = OH·OW output pixels and K = Cin·kh·kw (k = (ci·kh + ky)·kw + kx, the weight's own order).
//
// The work is split into tasks of (a block of kNB = 256 output pixels) × (a range of Cout rows),
// handed out dynamically to the pool's threads. Per task and per K slice of kKC = 256:
//   - pack the im2col panels Bp[panel][kc][16] of the block's pixels straight from the input
//     (conv2d_pack.h: upsample / prologue / zero padding applied on the way; 256 KB, stays in L2);
//   - for every ≤ 6-row sliver of Wf (read in place, row stride K; 6 KB, stays in L1):
//     6×16 FMA micro-kernel against each 16-pixel panel, accumulating into the NCHW output,
//     whose rows are contiguous in the pixel index — so no transpose is ever needed.
// The output block is first set to the bias (or has it added, when accumulating). Weights in
// f16/bf16/quantized storage are expanded once per call to f32 (an f32 weight is used in place).
// With at most kDirectMaxCout output channels and stride 1 (the decoder's final conv), a direct
// convolution over padded, transformed input row strips is used instead (see conv_direct).
// Memory: Wf (for a non-f32 weight) + 256 KB of panels per thread; nothing scales with the
// image except, on the direct path, one strip of kStripRows + kh − 1 input rows per thread.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/conv2d_kernels.h"
#include "kernels/cpu/conv2d_pack.h"

namespace klein::kernels::avx2 {
namespace {

constexpr int64_t kNB = kConvMaxBlock;  // output pixels per task (16 panels of 16)
constexpr int64_t kKC = 256;            // reduction depth per packed slice

// ---- Direct path for a handful of output channels (the decoder's final 128 → 3 conv) --------
// With Cout ≤ kDirectMaxCout the implicit GEMM would pack (and transform) Cin·kh·kw values per
// output pixel to do only Cout·Cin·kh·kw FMAs with them. Instead, per strip of kStripRows output
// rows: build the strip's padded, transformed input rows once ([Cin][rows + kh − 1][Wpad]), then
// slide: for every 32-pixel run and each tap, 4 vector loads feed up to 3 × 4 FMAs.
constexpr int64_t kDirectMaxCout = 6;
constexpr int64_t kStripRows = 4;
constexpr int64_t kRun = 32;  // output pixels per inner tile (4 ymm per output channel)

// xs[c][r][0 .. Wpad): the conv input rows iy = oy0 − pt + r (r < nr), padded left by pl,
// transformed, zero outside the image (and in the tail up to Wpad).
void build_strip(const ConvGeom& g, int64_t oy0, int64_t nr, int64_t Wpad, float* xs) {
  for (int64_t c = 0; c < g.Cin; ++c)
    for (int64_t r = 0; r < nr; ++r) {
      float* d = xs + (c * nr + r) * Wpad;
      const int64_t iy = oy0 - g.pt + r;
      std::memset(d, 0, Wpad * sizeof(float));
      if (iy < 0 || iy >= g.Hu) continue;
      const float* src = g.x + (c * g.H + (g.up ? iy >> 1 : iy)) * g.W;
      float* v = d + g.pl;
      const int64_t n = std::min(g.Wu, Wpad - g.pl);
      if (g.up)
        for (int64_t i = 0; i < n; ++i) v[i] = src[i >> 1];
      else
        std::memcpy(v, src, n * sizeof(float));
      if (g.prologue) transform_run(g, c, v, n);
    }
}

// out rows [co0, co0 + NCO) of output row oy (strip row rr), pixels [x0, x0 + kRun).
template <int NCO>
void direct_tile(const ConvGeom& g, const float* xs, int64_t nr, int64_t Wpad, int64_t rr, int64_t x0,
                 const float* wf, int64_t co0, const float* bias, bool accumulate, float* out,
                 int64_t P, int64_t oy) {
  __m256 acc[NCO][4];
  for (int c = 0; c < NCO; ++c)
    for (int q = 0; q < 4; ++q) acc[c][q] = _mm256_setzero_ps();
  const int64_t khw = g.KH * g.KW;
  for (int64_t ci = 0; ci < g.Cin; ++ci)
    for (int64_t ky = 0; ky < g.KH; ++ky) {
      const float* row = xs + (ci * nr + rr + ky) * Wpad + x0;
      const float* wk = wf + co0 * g.K + ci * khw + ky * g.KW;
      for (int64_t kx = 0; kx < g.KW; ++kx) {
        const __m256 v0 = _mm256_loadu_ps(row + kx), v1 = _mm256_loadu_ps(row + kx + 8);
        const __m256 v2 = _mm256_loadu_ps(row + kx + 16), v3 = _mm256_loadu_ps(row + kx + 24);
        for (int c = 0; c < NCO; ++c) {
          const __m256 w = _mm256_broadcast_ss(wk + c * g.K + kx);
          acc[c][0] = _mm256_fmadd_ps(w, v0, acc[c][0]);
          acc[c][1] = _mm256_fmadd_ps(w, v1, acc[c][1]);
          acc[c][2] = _mm256_fmadd_ps(w, v2, acc[c][2]);
          acc[c][3] = _mm256_fmadd_ps(w, v3, acc[c][3]);
        }
      }
    }
  const int64_t n = std::min(kRun, g.OW - x0);
  for (int c = 0; c < NCO; ++c) {
    alignas(32) float t[kRun];
    for (int q = 0; q < 4; ++q) _mm256_store_ps(t + 8 * q, acc[c][q]);
    float* o = out + (co0 + c) * P + oy * g.OW + x0;
    const float b = bias[co0 + c];
    if (accumulate)
      for (int64_t j = 0; j < n; ++j) o[j] += t[j] + b;
    else
      for (int64_t j = 0; j < n; ++j) o[j] = t[j] + b;
  }
}

void conv_direct(const ConvGeom& g, const float* wf, const float* bias, bool accumulate, float* out,
                 int64_t Cout, ThreadPool& pool) {
  const int64_t P = g.OH * g.OW;
  const int64_t n_run = (g.OW + kRun - 1) / kRun;
  // Every tile reads xs[.., x0 + kx .. x0 + kx + kRun), so rows need n_run·kRun + kw − 1 floats.
  const int64_t Wpad = n_run * kRun + g.KW - 1;
  const int64_t n_strip = (g.OH + kStripRows - 1) / kStripRows;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    thread_local UnitScratch scratch;
    for (int64_t st = next.fetch_add(1); st < n_strip; st = next.fetch_add(1)) {
      const int64_t oy0 = st * kStripRows, rows = std::min(kStripRows, g.OH - oy0);
      const int64_t nr = rows + g.KH - 1;
      float* xs = scratch.get<float>(static_cast<size_t>(g.Cin * nr * Wpad));
      build_strip(g, oy0, nr, Wpad, xs);
      for (int64_t rr = 0; rr < rows; ++rr)
        for (int64_t x0 = 0; x0 < g.OW; x0 += kRun)
          for (int64_t co = 0; co < Cout; co += 3) {
            const int nco = static_cast<int>(std::min<int64_t>(3, Cout - co));
            if (nco == 3)
              direct_tile<3>(g, xs, nr, Wpad, rr, x0, wf, co, bias, accumulate, out, P, oy0 + rr);
            else if (nco == 2)
              direct_tile<2>(g, xs, nr, Wpad, rr, x0, wf, co, bias, accumulate, out, P, oy0 + rr);
            else
              direct_tile<1>(g, xs, nr, Wpad, rr, x0, wf, co, bias, accumulate, out, P, oy0 + rr);
          }
    }
  });
}

}  // namespace

bool conv2d_is_direct(int64_t Cout, const Conv2dParams& p) { return Cout <= kDirectMaxCout && p.stride == 1; }

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  const int64_t K = Cin * KH * KW, P = OH * OW;

  // Weights as f32 [Cout, K] (in place when already f32), bias as f32 [Cout].
  std::vector<float> wbuf;
  const float* wf = nullptr;
  if (w.dtype == DType::kF32) {
    wf = static_cast<const float*>(w.data);
  } else {
    wbuf.resize(static_cast<size_t>(Cout * K));
    pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) weight_row_to_f32(w, r, wbuf.data() + r * K);
    });
    wf = wbuf.data();
  }
  const ConvBias cb = conv_bias(bias, Cout);

  ConvGeom g = conv_geom(Cin, H, W, KH, KW, OH, OW, p);

  if (conv2d_is_direct(Cout, p)) {
    for (int64_t n = 0; n < N; ++n) {
      g.x = in + n * Cin * H * W;
      conv_direct(g, wf, cb.v.data(), p.accumulate, out + n * Cout * P, Cout, pool);
    }
    return;
  }

  const bool use_strip = (g.prologue || g.up) && !g.pointwise;
  const int64_t NB = kNB;
  const int64_t n_pb = (P + NB - 1) / NB;
  const int64_t n_sliver = (Cout + kMR - 1) / kMR;
  const int64_t want = 4 * static_cast<int64_t>(pool.size());
  const int64_t n_cc = std::clamp<int64_t>((want + n_pb - 1) / n_pb, 1, n_sliver);
  const int64_t cc_rows = (n_sliver + n_cc - 1) / n_cc * kMR;
  const int64_t n_tasks = n_pb * n_cc;
  for (int64_t n = 0; n < N; ++n) {
    g.x = in + n * Cin * H * W;
    float* o = out + n * Cout * P;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      thread_local UnitScratch scratch, strip_scratch;
      float* bp = scratch.get<float>(static_cast<size_t>(NB * kKC));
      for (int64_t t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
        const int64_t pb = t / n_cc, cc = t % n_cc;
        const int64_t pix0 = pb * NB, nb = std::min(NB, P - pix0);
        const int64_t c0 = cc * cc_rows, c1 = std::min(Cout, c0 + cc_rows);
        if (c0 >= c1) continue;
        conv_init_rows(o, P, c0, c1, pix0, nb, cb, p.accumulate);
        const int64_t n_panel = (nb + kNR - 1) / kNR;
        for (int64_t k0 = 0; k0 < K; k0 += kKC) {
          const int64_t kc = std::min(kKC, K - k0);
          if (use_strip)
            pack_block<kNR>(build_pack_strip(g, pix0, nb, k0, kc, strip_scratch), pix0, nb, k0, kc, bp);
          else
            pack_block<kNR>(g, pix0, nb, k0, kc, bp);
          const Slivers sl(c0, c1, kMR);
          for (int64_t i = 0; i < sl.n; ++i) {
            const int64_t co = sl.begin(i);
            const int rows = sl.rows(i);
            const float* a = wf + co * K + k0;
            for (int64_t j = 0; j < n_panel; ++j) {
              const int np = static_cast<int>(std::min<int64_t>(kNR, nb - j * kNR));
              float* c = o + co * P + pix0 + j * kNR;
              if (np == kNR)
                ukernel_rows(rows, a, K, bp + j * kc * kNR, kNR, kc, c, P, true, nullptr);
              else
                ukernel_edge(rows, np, a, K, bp + j * kc * kNR, kNR, kc, c, P, true, nullptr);
            }
          }
        }
      }
    });
  }
}

}  // namespace klein::kernels::avx2
