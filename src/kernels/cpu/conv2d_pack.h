// The implicit-GEMM convolutions' packing, shared by the AVX2 conv (conv2d_avx2.cpp: 16-pixel
// panels for its 6×16 ymm micro-kernel) and the AVX-512 ones (conv2d_avx512*.cpp: 32-pixel panels
// for the 14×32 zmm micro-kernel of gemm_avx512_common.h).
//
// The conv is  out[Cout, P] (+)= Wf[Cout, K] · col[K, P]  with P = OH·OW output pixels and
// K = Cin·kh·kw (k = (ci·kh + ky)·kw + kx, the weight's own order). col is never materialised:
// pack_block writes the panels of one block of output pixels for one K slice straight from the
// input, applying the nearest ×2 upsampling, the per-channel prologue (scale, shift, SiLU) and the
// zero padding on the way.
//
// Written with 8-lane AVX2 vectors only (the AVX-512 TUs have AVX2 too). Include ONLY from the
// conv2d_avx2 / conv2d_avx512* files. Everything here has internal linkage, so each file keeps its
// own copy compiled with its own ISA flags: a shared inline function would be one symbol that the
// linker could resolve to the AVX-512 copy for an AVX2 caller.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <vector>

#include "core/weight.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

constexpr int64_t kConvMaxBlock = 256;  // most output pixels pack_block takes at once

// The conv's bias as float32 [Cout] (zeros without one), and whether there is one.
struct ConvBias {
  std::vector<float> v;
  bool present = false;
};
inline ConvBias conv_bias(const Weight* bias, int64_t Cout) {
  ConvBias b{std::vector<float>(Cout, 0.0f), bias && !bias->empty()};
  if (b.present) weight_to_f32(*bias, 0, Cout, b.v.data());
  return b;
}

// Output rows [c0, c1) of one batch item (rows P apart), pixels [off, off + n): set to the bias,
// or with the bias added when the conv accumulates onto them — before the products add in.
inline void conv_init_rows(float* o, int64_t P, int64_t c0, int64_t c1, int64_t off, int64_t n, const ConvBias& b,
                           bool accumulate) {
  for (int64_t co = c0; co < c1; ++co) {
    float* row = o + co * P + off;
    if (!accumulate) {
      std::fill(row, row + n, b.v[co]);
    } else if (b.present) {
      for (int64_t j = 0; j < n; ++j) row[j] += b.v[co];
    }
  }
}

struct ConvGeom {
  const float* x;  // one batch item [Cin, H, W]
  int64_t Cin, H, W, KH, KW, OH, OW, K;
  int64_t Hu, Wu;  // input size after optional upsampling
  int s, pt, pl;
  bool up;
  const float* scale;
  const float* shift;
  bool silu;
  bool prologue;   // scale, shift or silu present
  bool pointwise;  // 1×1, stride 1, no padding, no upsampling: col row k = input plane k
  // Optional pre-transformed strip of the conv input frame (see build_pack_strip): rows
  // [s_r0, s_r0 + s_nr) and columns [s_x0, s_x0 + s_ld) of channels from s_c0, with up and
  // prologue already applied (the ConvGeom using it has them off).
  const float* strip = nullptr;
  int64_t s_c0 = 0, s_r0 = 0, s_nr = 0, s_ld = 0, s_x0 = 0;
};

// The geometry of one conv call (x still unset: one batch item at a time).
inline ConvGeom conv_geom(int64_t Cin, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                          const Conv2dParams& p) {
  ConvGeom g{};
  g.Cin = Cin, g.H = H, g.W = W, g.KH = KH, g.KW = KW, g.OH = OH, g.OW = OW, g.K = Cin * KH * KW;
  g.up = p.upsample2x;
  g.Hu = H * (g.up ? 2 : 1), g.Wu = W * (g.up ? 2 : 1);
  g.s = p.stride, g.pt = p.pad_top, g.pl = p.pad_left;
  g.scale = p.in_scale, g.shift = p.in_shift, g.silu = p.in_silu;
  g.prologue = g.scale || g.shift || g.silu;
  g.pointwise = KH == 1 && KW == 1 && p.stride == 1 && !g.up && p.pad_top == 0 && p.pad_bottom == 0 &&
                p.pad_left == 0 && p.pad_right == 0;
  return g;
}

// Row iy (in bounds) of channel c in the conv input frame: column ix is row[ix − col_off(g)],
// or row[ix >> 1] with upsampling (which a strip never has: it is expanded already).
inline const float* row_ptr(const ConvGeom& g, int64_t c, int64_t iy) {
  if (g.strip) return g.strip + ((c - g.s_c0) * g.s_nr + iy - g.s_r0) * g.s_ld;
  return g.x + (c * g.H + (g.up ? iy >> 1 : iy)) * g.W;
}
inline int64_t col_off(const ConvGeom& g) { return g.strip ? g.s_x0 : 0; }

inline float silu1(float v) { return v / (1.0f + std::exp(-v)); }

inline float transform1(const ConvGeom& g, int64_t c, float v) {
  if (g.scale) v *= g.scale[c];
  if (g.shift) v += g.shift[c];
  if (g.silu) v = silu1(v);
  return v;
}

// e^x for 8 lanes, ~1-2 ulp (Cephes-style: 2^n · poly(r)). Inputs below -87.3 give 0
// (including -inf), inputs above 88.3 are clamped, NaN stays NaN: the clamps are written
// (bound, x), as vmaxps / vminps return the second operand when one is NaN.
inline __m256 conv_exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(lo, x);
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n·ln2 with ln2 split in two so r is exact to float precision.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, res);
}

// The prologue on n in-bounds values of channel c, from s into d (8 lanes at a time, scalar
// tail); s == d transforms in place.
inline void transform_copy(const ConvGeom& g, int64_t c, const float* s, float* d, int64_t n) {
  const __m256 a = _mm256_set1_ps(g.scale ? g.scale[c] : 1.0f);
  const __m256 b = _mm256_set1_ps(g.shift ? g.shift[c] : 0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(s + i), a, b);
    if (g.silu) {
      const __m256 e = conv_exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
      v = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    }
    _mm256_storeu_ps(d + i, v);
  }
  for (; i < n; ++i) d[i] = transform1(g, c, s[i]);
}
inline void transform_run(const ConvGeom& g, int64_t c, float* d, int64_t n) { transform_copy(g, c, d, d, n); }

// Source value of the (transformed, upsampled, padded) input at channel c, row iy, column ix of
// the conv's input frame; 0 outside.
inline float fetch(const ConvGeom& g, int64_t c, int64_t iy, int64_t ix) {
  if (iy < 0 || iy >= g.Hu || ix < 0 || ix >= g.Wu) return 0.0f;
  const float* row = row_ptr(g, c, iy);
  const float v = g.up ? row[ix >> 1] : row[ix - col_off(g)];
  return g.prologue ? transform1(g, c, v) : v;
}

// Upsampling and the prologue cost per packed element, and a 3×3 conv packs every input value
// 9 times. So when either is present (and the conv is not pointwise), the rows a (block, K slice)
// needs are first expanded and transformed once into a strip — channels [c_lo, c_hi), input rows
// and columns clipped to the image — and the panels are packed from it. Returns the ConvGeom that
// reads the strip (held in `scratch`).
inline ConvGeom build_pack_strip(const ConvGeom& g, int64_t pix0, int64_t nb, int64_t k0, int64_t kc,
                                 UnitScratch& scratch) {
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
  ConvGeom s = g;
  s.up = false;
  s.prologue = false;
  s.s_c0 = c_lo, s.s_r0 = r_lo, s.s_x0 = x_lo;
  s.s_nr = std::max<int64_t>(0, r_hi - r_lo);
  s.s_ld = std::max<int64_t>(0, x_hi - x_lo);
  float* S = scratch.get<float>(static_cast<size_t>(std::max<int64_t>(1, (c_hi - c_lo) * s.s_nr * s.s_ld)));
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
      if (g.prologue) transform_run(g, c, d, ld);
    }
  return s;
}

// NR floats from src to d (NR a multiple of 8).
template <int NR>
inline void copy_run(float* d, const float* src) {
  for (int h = 0; h < NR; h += 8) _mm256_storeu_ps(d + h, _mm256_loadu_ps(src + h));
}

// d[jj] = src[2·jj] for jj < np (a stride-2 conv's row run): 8 at a time from two loads' even
// lanes; the last 8 (overlapping) from one float earlier, odd lanes, so that no load reads past
// src[2·(np − 1)] (the last column the run needs; a strip may end there). The element-wise loop
// was ~9 % of a 256² VAE encode (its three downsamplers).
inline void copy_stride2(float* d, const float* src, int np) {
  if (np < 9) {
    for (int jj = 0; jj < np; ++jj) d[jj] = src[2 * jj];
    return;
  }
  auto pick8 = [](const float* p, bool odd) {  // p[0], p[2], …, p[14] (odd: p[1], p[3], …, p[15])
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    const __m256 t =
        odd ? _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)) : _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8));  // a0 a2 a4 a6 | b0 b2 b4 b6
  };
  for (int jj = 0; jj + 8 < np; jj += 8) _mm256_storeu_ps(d + jj, pick8(src + 2 * jj, false));
  _mm256_storeu_ps(d + np - 8, pick8(src + 2 * (np - 8) - 1, true));
}

// The im2col panels of output pixels [pix0, pix0 + nb) (nb ≤ kConvMaxBlock) for k in [k0, k0 + kc):
//   bp[j][k − k0][jj] = col[k][pix0 + NR·j + jj]   (zero for pixels past nb).
// k is the outer loop so each input row segment is read left to right across all the block's
// panels (streaming, prefetch-friendly), not as one 64-byte piece per row per panel.
template <int NR>
void pack_block(const ConvGeom& g, int64_t pix0, int64_t nb, int64_t k0, int64_t kc, float* bp) {
  static_assert(NR % 8 == 0 && NR <= kConvMaxBlock);
  const int64_t n_panel = (nb + NR - 1) / NR;
  const int64_t pstride = kc * NR;
  auto panel_np = [&](int64_t j) { return static_cast<int>(std::min<int64_t>(NR, nb - j * NR)); };
  if (g.pointwise) {
    const int64_t HW = g.H * g.W;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t c = k0 + kk;
      const float* src = g.x + c * HW + pix0;
      for (int64_t j = 0; j < n_panel; ++j, src += NR) {
        float* d = bp + j * pstride + kk * NR;
        const int np = panel_np(j);
        if (np == NR) {
          copy_run<NR>(d, src);
        } else {
          std::memcpy(d, src, np * sizeof(float));
          std::memset(d + np, 0, (NR - np) * sizeof(float));
        }
        if (g.prologue) transform_run(g, c, d, np);
      }
    }
    return;
  }
  // Per-panel output coordinates. A panel that wraps to the next output row (only when OW is
  // not a multiple of NR) keeps per-pixel coordinates and is gathered element by element.
  struct Panel {
    int64_t oy, ox0;
    int np;
    bool one_row;
    int64_t oys[NR], oxs[NR];
  };
  Panel pan[kConvMaxBlock / NR];
  for (int64_t j = 0; j < n_panel; ++j) {
    Panel& P = pan[j];
    const int64_t p0 = pix0 + j * NR;
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
      float* d = bp + j * pstride + kk * NR;
      if (!P.one_row) {
        for (int jj = 0; jj < np; ++jj)
          d[jj] = fetch(g, ci, P.oys[jj] * s - g.pt + ky, P.oxs[jj] * s - g.pl + kx);
        for (int jj = np; jj < NR; ++jj) d[jj] = 0.0f;
        continue;
      }
      const int64_t iy = P.oy * s - g.pt + ky;
      const int64_t ix0 = P.ox0 * s - g.pl + kx;
      if (iy < 0 || iy >= g.Hu) {
        std::memset(d, 0, NR * sizeof(float));
      } else if (ix0 >= 0 && ix0 + (np - 1) * s < g.Wu) {
        const float* row = row_ptr(g, ci, iy);
        if (g.up) {
          for (int jj = 0; jj < np; ++jj) d[jj] = row[(ix0 + jj * s) >> 1];
        } else {
          const float* src = row + (ix0 - col_off(g));  // column ix0
          if (s == 1 && np == NR)
            copy_run<NR>(d, src);
          else if (s == 1)
            std::memcpy(d, src, np * sizeof(float));
          else if (s == 2)
            copy_stride2(d, src, np);
          else
            for (int jj = 0; jj < np; ++jj) d[jj] = src[jj * s];
        }
        if (g.prologue) transform_run(g, ci, d, np);
        for (int jj = np; jj < NR; ++jj) d[jj] = 0.0f;
      } else {
        for (int jj = 0; jj < np; ++jj) d[jj] = fetch(g, ci, iy, ix0 + jj * s);
        for (int jj = np; jj < NR; ++jj) d[jj] = 0.0f;
      }
    }
    if (++kx == g.KW) {
      kx = 0;
      if (++ky == g.KH) ky = 0, ++ci;
    }
  }
}


}  // namespace
}  // namespace klein::kernels
