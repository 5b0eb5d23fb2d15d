// AVX2/FMA conv2d as an implicit GEMM:  out[Cout, P] (+)= Wf[Cout, K] · col[K, P]  with
// P = OH·OW output pixels and K = Cin·kh·kw (k = (ci·kh + ky)·kw + kx, the weight's own order).
//
// The work is split into tasks of (a block of kNB = 256 output pixels) × (a range of Cout rows),
// handed out dynamically to the pool's threads. Per task and per K slice of kKC = 256:
//   - pack the im2col panels Bp[panel][kc][16] of the block's pixels straight from the input
//     (applying the upsample / prologue / zero padding on the way; 256 KB, stays in L2);
//   - for every 6-row sliver of Wf (read in place, row stride K; 6 KB, stays in L1):
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
#include "kernels/cpu/conv2d_avx2.h"

namespace klein::kernels::avx2 {
namespace {

constexpr int64_t kNB = 256;  // output pixels per task (16 panels of 16)
constexpr int64_t kKC = 256;  // reduction depth per packed slice

struct Geom {
  const float* x;  // one batch item [Cin, H, W]
  int64_t Cin, H, W, KH, KW, OH, OW, K;
  int64_t Hu, Wu;  // input size after optional upsampling
  int s, pt, pl;
  bool up;
  const float* scale;
  const float* shift;
  bool silu;
  bool prologue;  // scale, shift or silu present
  bool pointwise;  // 1×1, stride 1, no padding, no upsampling: col row k = input plane k
  // Optional pre-transformed strip of the conv input frame (see build_pack_strip): rows
  // [s_r0, s_r0 + s_nr) and columns [s_x0, s_x0 + s_ld) of channels from s_c0, with up and
  // prologue already applied (the Geom using it has them off).
  const float* strip = nullptr;
  int64_t s_c0 = 0, s_r0 = 0, s_nr = 0, s_ld = 0, s_x0 = 0;
};

// Row iy (in bounds) of channel c in the conv input frame: column ix is row[ix − col_off(g)],
// or row[ix >> 1] with upsampling (which a strip never has: it is expanded already).
inline const float* row_ptr(const Geom& g, int64_t c, int64_t iy) {
  if (g.strip) return g.strip + ((c - g.s_c0) * g.s_nr + iy - g.s_r0) * g.s_ld;
  return g.x + (c * g.H + (g.up ? iy >> 1 : iy)) * g.W;
}
inline int64_t col_off(const Geom& g) { return g.strip ? g.s_x0 : 0; }

inline float silu1(float v) { return v / (1.0f + std::exp(-v)); }

inline float transform1(const Geom& g, int64_t c, float v) {
  if (g.scale) v *= g.scale[c];
  if (g.shift) v += g.shift[c];
  if (g.silu) v = silu1(v);
  return v;
}

inline __m256 silu8(__m256 v) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// Prologue on 16 in-bounds values of channel c, in place.
inline void transform16(const Geom& g, int64_t c, float* d) {
  const __m256 a = _mm256_set1_ps(g.scale ? g.scale[c] : 1.0f);
  const __m256 b = _mm256_set1_ps(g.shift ? g.shift[c] : 0.0f);
  for (int h = 0; h < 16; h += 8) {
    __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(d + h), a, b);
    if (g.silu) v = silu8(v);
    _mm256_storeu_ps(d + h, v);
  }
}

// Source value of the (transformed, upsampled, padded) input at channel c, row iy, column ix of
// the conv's input frame; 0 outside.
inline float fetch(const Geom& g, int64_t c, int64_t iy, int64_t ix) {
  if (iy < 0 || iy >= g.Hu || ix < 0 || ix >= g.Wu) return 0.0f;
  const float* row = row_ptr(g, c, iy);
  const float v = g.up ? row[ix >> 1] : row[ix - col_off(g)];
  return g.prologue ? transform1(g, c, v) : v;
}

// Upsampling and the prologue cost per packed element, and a 3×3 conv packs every input value
// 9 times. So when either is present, the rows a (block, K slice) needs are first expanded and
// transformed once into a strip — channels [c_lo, c_hi), input rows and columns clipped to the
// image — and the panels are packed from it. Returns the Geom that reads the strip.
Geom build_pack_strip(const Geom& g, int64_t pix0, int64_t nb, int64_t k0, int64_t kc,
                      Scratch& scratch) {
  const int64_t khw = g.KH * g.KW;
  const int64_t c_lo = k0 / khw, c_hi = (k0 + kc - 1) / khw + 1;
  const int64_t oy_a = pix0 / g.OW, oy_b = (pix0 + nb - 1) / g.OW;
  const int64_t r_lo = std::max<int64_t>(0, oy_a * g.s - g.pt);
  const int64_t r_hi = std::min<int64_t>(g.Hu, oy_b * g.s - g.pt + g.KH);
  int64_t x_lo = 0, x_hi = g.Wu;
  if (oy_a == oy_b) {
    x_lo = std::max<int64_t>(0, (pix0 % g.OW) * g.s - g.pl);
    x_hi = std::min<int64_t>(g.Wu, ((pix0 + nb - 1) % g.OW) * g.s - g.pl + g.KW);
  }
  Geom s = g;
  s.up = false;
  s.prologue = false;
  s.s_c0 = c_lo, s.s_r0 = r_lo, s.s_x0 = x_lo;
  s.s_nr = std::max<int64_t>(0, r_hi - r_lo);
  s.s_ld = std::max<int64_t>(0, x_hi - x_lo);
  float* S = scratch.get(static_cast<size_t>(std::max<int64_t>(1, (c_hi - c_lo) * s.s_nr * s.s_ld)));
  s.strip = S;
  const int64_t ld = s.s_ld;
  for (int64_t c = c_lo; c < c_hi; ++c)
    for (int64_t r = r_lo; r < r_hi; ++r) {
      const float* src = g.x + (c * g.H + (g.up ? r >> 1 : r)) * g.W;
      float* d = S + ((c - c_lo) * s.s_nr + r - r_lo) * ld;
      if (g.up)
        for (int64_t i = 0; i < ld; ++i) d[i] = src[(x_lo + i) >> 1];
      else
        std::memcpy(d, src + x_lo, ld * sizeof(float));
      if (!g.prologue) continue;
      int64_t i = 0;
      for (; i + kNR <= ld; i += kNR) transform16(g, c, d + i);
      for (; i < ld; ++i) d[i] = transform1(g, c, d[i]);
    }
  return s;
}

// The im2col panels of output pixels [pix0, pix0 + nb) for k in [k0, k0 + kc):
//   bp[j][k − k0][jj] = col[k][pix0 + 16·j + jj]   (zero for pixels past nb).
// k is the outer loop so each input row segment is read left to right across all the block's
// panels (streaming, prefetch-friendly), not as one 64-byte piece per row per panel.
void pack_block(const Geom& g, int64_t pix0, int64_t nb, int64_t k0, int64_t kc, float* bp) {
  const int64_t n_panel = (nb + kNR - 1) / kNR;
  const int64_t pstride = kc * kNR;
  auto panel_np = [&](int64_t j) { return static_cast<int>(std::min<int64_t>(kNR, nb - j * kNR)); };
  if (g.pointwise) {
    const int64_t HW = g.H * g.W;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t c = k0 + kk;
      const float* src = g.x + c * HW + pix0;
      for (int64_t j = 0; j < n_panel; ++j, src += kNR) {
        float* d = bp + j * pstride + kk * kNR;
        const int np = panel_np(j);
        if (np == kNR) {
          _mm256_storeu_ps(d, _mm256_loadu_ps(src));
          _mm256_storeu_ps(d + 8, _mm256_loadu_ps(src + 8));
          if (g.prologue) transform16(g, c, d);
        } else {
          for (int jj = 0; jj < np; ++jj) d[jj] = g.prologue ? transform1(g, c, src[jj]) : src[jj];
          for (int jj = np; jj < kNR; ++jj) d[jj] = 0.0f;
        }
      }
    }
    return;
  }
  // Per-panel output coordinates. A panel that wraps to the next output row (only when OW is
  // not a multiple of 16) keeps per-pixel coordinates and is gathered element by element.
  struct Panel {
    int64_t oy, ox0;
    int np;
    bool one_row;
    int64_t oys[kNR], oxs[kNR];
  };
  Panel pan[kNB / kNR];
  for (int64_t j = 0; j < n_panel; ++j) {
    Panel& P = pan[j];
    const int64_t p0 = pix0 + j * kNR;
    P.np = panel_np(j);
    P.oy = p0 / g.OW, P.ox0 = p0 % g.OW;
    P.one_row = P.ox0 + P.np <= g.OW;
    if (!P.one_row)
      for (int jj = 0; jj < P.np; ++jj) P.oys[jj] = (p0 + jj) / g.OW, P.oxs[jj] = (p0 + jj) % g.OW;
  }
  const int64_t khw = g.KH * g.KW;
  int64_t ci = k0 / khw, ky = (k0 % khw) / g.KW, kx = k0 % g.KW;
  const int s = g.s;
  for (int64_t kk = 0; kk < kc; ++kk) {
    for (int64_t j = 0; j < n_panel; ++j) {
      const Panel& P = pan[j];
      const int np = P.np;
      float* d = bp + j * pstride + kk * kNR;
      if (!P.one_row) {
        for (int jj = 0; jj < np; ++jj)
          d[jj] = fetch(g, ci, P.oys[jj] * s - g.pt + ky, P.oxs[jj] * s - g.pl + kx);
        for (int jj = np; jj < kNR; ++jj) d[jj] = 0.0f;
        continue;
      }
      const int64_t iy = P.oy * s - g.pt + ky;
      const int64_t ix0 = P.ox0 * s - g.pl + kx;
      if (iy < 0 || iy >= g.Hu) {
        std::memset(d, 0, kNR * sizeof(float));
      } else if (ix0 >= 0 && ix0 + (np - 1) * s < g.Wu) {
        const float* row = row_ptr(g, ci, iy);
        if (g.up) {
          for (int jj = 0; jj < np; ++jj) d[jj] = row[(ix0 + jj * s) >> 1];
        } else {
          const float* src = row + (ix0 - col_off(g));  // column ix0
          if (s == 1 && np == kNR) {
            _mm256_storeu_ps(d, _mm256_loadu_ps(src));
            _mm256_storeu_ps(d + 8, _mm256_loadu_ps(src + 8));
          } else if (s == 1) {
            std::memcpy(d, src, np * sizeof(float));
          } else {
            for (int jj = 0; jj < np; ++jj) d[jj] = src[jj * s];
          }
        }
        if (np == kNR) {
          if (g.prologue) transform16(g, ci, d);
        } else {
          if (g.prologue)
            for (int jj = 0; jj < np; ++jj) d[jj] = transform1(g, ci, d[jj]);
          for (int jj = np; jj < kNR; ++jj) d[jj] = 0.0f;
        }
      } else {
        for (int jj = 0; jj < np; ++jj) d[jj] = fetch(g, ci, iy, ix0 + jj * s);
        for (int jj = np; jj < kNR; ++jj) d[jj] = 0.0f;
      }
    }
    if (++kx == g.KW) {
      kx = 0;
      if (++ky == g.KH) ky = 0, ++ci;
    }
  }
}

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
void build_strip(const Geom& g, int64_t oy0, int64_t nr, int64_t Wpad, float* xs) {
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
      if (!g.prologue) continue;
      int64_t i = 0;
      for (; i + kNR <= n; i += kNR) transform16(g, c, v + i);
      for (; i < n; ++i) v[i] = transform1(g, c, v[i]);
    }
}

// out rows [co0, co0 + NCO) of output row oy (strip row rr), pixels [x0, x0 + kRun).
template <int NCO>
void direct_tile(const Geom& g, const float* xs, int64_t nr, int64_t Wpad, int64_t rr, int64_t x0,
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

void conv_direct(const Geom& g, const float* wf, const float* bias, bool accumulate, float* out,
                 int64_t Cout, ThreadPool& pool) {
  const int64_t P = g.OH * g.OW;
  const int64_t n_run = (g.OW + kRun - 1) / kRun;
  // Every tile reads xs[.., x0 + kx .. x0 + kx + kRun), so rows need n_run·kRun + kw − 1 floats.
  const int64_t Wpad = n_run * kRun + g.KW - 1;
  const int64_t n_strip = (g.OH + kStripRows - 1) / kStripRows;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    thread_local Scratch scratch;
    for (int64_t st = next.fetch_add(1); st < n_strip; st = next.fetch_add(1)) {
      const int64_t oy0 = st * kStripRows, rows = std::min(kStripRows, g.OH - oy0);
      const int64_t nr = rows + g.KH - 1;
      float* xs = scratch.get(static_cast<size_t>(g.Cin * nr * Wpad));
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
  std::vector<float> bvec(Cout, 0.0f);
  const bool has_bias = bias && !bias->empty();
  if (has_bias) weight_to_f32(*bias, 0, Cout, bvec.data());

  Geom g{};
  g.Cin = Cin, g.H = H, g.W = W, g.KH = KH, g.KW = KW, g.OH = OH, g.OW = OW, g.K = K;
  g.up = p.upsample2x;
  g.Hu = H * (g.up ? 2 : 1), g.Wu = W * (g.up ? 2 : 1);
  g.s = p.stride, g.pt = p.pad_top, g.pl = p.pad_left;
  g.scale = p.in_scale, g.shift = p.in_shift, g.silu = p.in_silu;
  g.prologue = g.scale || g.shift || g.silu;
  g.pointwise = KH == 1 && KW == 1 && p.stride == 1 && !g.up && p.pad_top == 0 &&
                p.pad_bottom == 0 && p.pad_left == 0 && p.pad_right == 0;

  if (Cout <= kDirectMaxCout && p.stride == 1) {
    for (int64_t n = 0; n < N; ++n) {
      g.x = in + n * Cin * H * W;
      conv_direct(g, wf, bvec.data(), p.accumulate, out + n * Cout * P, Cout, pool);
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
      thread_local Scratch scratch, strip_scratch;
      float* bp = scratch.get(static_cast<size_t>(NB * kKC));
      for (int64_t t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
        const int64_t pb = t / n_cc, cc = t % n_cc;
        const int64_t pix0 = pb * NB, nb = std::min(NB, P - pix0);
        const int64_t c0 = cc * cc_rows, c1 = std::min(Cout, c0 + cc_rows);
        if (c0 >= c1) continue;
        for (int64_t co = c0; co < c1; ++co) {
          float* row = o + co * P + pix0;
          if (!p.accumulate) {
            std::fill(row, row + nb, bvec[co]);
          } else if (has_bias) {
            for (int64_t j = 0; j < nb; ++j) row[j] += bvec[co];
          }
        }
        const int64_t n_panel = (nb + kNR - 1) / kNR;
        for (int64_t k0 = 0; k0 < K; k0 += kKC) {
          const int64_t kc = std::min(kKC, K - k0);
          if (use_strip)
            pack_block(build_pack_strip(g, pix0, nb, k0, kc, strip_scratch), pix0, nb, k0, kc, bp);
          else
            pack_block(g, pix0, nb, k0, kc, bp);
          for (int64_t co = c0; co < c1; co += kMR) {
            const int rows = static_cast<int>(std::min<int64_t>(kMR, c1 - co));
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
