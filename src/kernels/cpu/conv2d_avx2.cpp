// AVX2/FMA conv2d as an implicit GEMM:  out[Cout, P] (+)= Wf[Cout, K] · col[K, P]  with
// P = OH·OW output pixels and K = Cin·kh·kw (k = (ci·kh + ky)·kw + kx, the weight's own order).
//
// The work is split into tasks of (a block of kNB = 128 output pixels) × (a range of Cout rows),
// handed out dynamically to the pool's threads. Per task and per K slice of kKC = 256:
//   - pack the im2col panel Bp[panel][kc][16] of the block's pixels straight from the input
//     (applying the upsample / prologue / zero padding on the way; 128 KB, stays in L2);
//   - for every 6-row sliver of Wf (read in place, row stride K; 6 KB, stays in L1):
//     6×16 FMA micro-kernel against each 16-pixel panel, accumulating into the NCHW output,
//     whose rows are contiguous in the pixel index — so no transpose is ever needed.
// The output block is first set to the bias (or has it added, when accumulating). Weights in
// f16/bf16/quantized storage are expanded once per call to f32 (an f32 weight is used in place).
// Memory: Wf (for a non-f32 weight) + 128 KB of panels per thread; nothing scales with the image.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/conv2d_avx2.h"

namespace klein::kernels::avx2 {
namespace {

constexpr int64_t kNB = 128;  // output pixels per task (8 panels of 16)
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
};

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
  if (g.up) iy >>= 1, ix >>= 1;
  const float v = g.x[(c * g.H + iy) * g.W + ix];
  return g.prologue ? transform1(g, c, v) : v;
}

// dst[k - k0][j] = col[k][p0 + j] for k in [k0, k0 + kc), j < np; zero for np ≤ j < 16.
void pack_panel(const Geom& g, int64_t p0, int np, int64_t k0, int64_t kc, float* dst) {
  if (g.pointwise) {
    const int64_t HW = g.H * g.W;
    for (int64_t kk = 0; kk < kc; ++kk) {
      float* d = dst + kk * kNR;
      const float* src = g.x + (k0 + kk) * HW + p0;
      if (np == kNR) {
        _mm256_storeu_ps(d, _mm256_loadu_ps(src));
        _mm256_storeu_ps(d + 8, _mm256_loadu_ps(src + 8));
        if (g.prologue) transform16(g, k0 + kk, d);
      } else {
        for (int j = 0; j < np; ++j) d[j] = g.prologue ? transform1(g, k0 + kk, src[j]) : src[j];
        for (int j = np; j < kNR; ++j) d[j] = 0.0f;
      }
    }
    return;
  }
  const int64_t khw = g.KH * g.KW;
  int64_t ci = k0 / khw, ky = (k0 % khw) / g.KW, kx = k0 % g.KW;
  const int64_t oy0 = p0 / g.OW, ox0 = p0 % g.OW;
  const bool one_row = ox0 + np <= g.OW;
  // Panels that wrap to the next output row (only when OW is not a multiple of 16): per-pixel
  // coordinates, scalar gather.
  int64_t oys[kNR], oxs[kNR];
  if (!one_row)
    for (int j = 0; j < np; ++j) oys[j] = (p0 + j) / g.OW, oxs[j] = (p0 + j) % g.OW;
  const int s = g.s;
  for (int64_t kk = 0; kk < kc; ++kk) {
    float* d = dst + kk * kNR;
    if (!one_row) {
      for (int j = 0; j < np; ++j)
        d[j] = fetch(g, ci, oys[j] * s - g.pt + ky, oxs[j] * s - g.pl + kx);
      for (int j = np; j < kNR; ++j) d[j] = 0.0f;
    } else {
      const int64_t iy = oy0 * s - g.pt + ky;
      const int64_t ix0 = ox0 * s - g.pl + kx;
      if (iy < 0 || iy >= g.Hu) {
        std::memset(d, 0, kNR * sizeof(float));
      } else if (ix0 >= 0 && ix0 + (np - 1) * s < g.Wu) {
        const float* row = g.x + (ci * g.H + (g.up ? iy >> 1 : iy)) * g.W;
        if (!g.up && s == 1) {
          if (np == kNR) {
            _mm256_storeu_ps(d, _mm256_loadu_ps(row + ix0));
            _mm256_storeu_ps(d + 8, _mm256_loadu_ps(row + ix0 + 8));
          } else {
            std::memcpy(d, row + ix0, np * sizeof(float));
          }
        } else if (g.up) {
          for (int j = 0; j < np; ++j) d[j] = row[(ix0 + j * s) >> 1];
        } else {
          for (int j = 0; j < np; ++j) d[j] = row[ix0 + j * s];
        }
        if (np == kNR) {
          if (g.prologue) transform16(g, ci, d);
        } else {
          if (g.prologue)
            for (int j = 0; j < np; ++j) d[j] = transform1(g, ci, d[j]);
          for (int j = np; j < kNR; ++j) d[j] = 0.0f;
        }
      } else {
        for (int j = 0; j < np; ++j) d[j] = fetch(g, ci, iy, ix0 + j * s);
        for (int j = np; j < kNR; ++j) d[j] = 0.0f;
      }
    }
    if (++kx == g.KW) {
      kx = 0;
      if (++ky == g.KH) ky = 0, ++ci;
    }
  }
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

  // Tasks: pixel blocks × Cout chunks (chunks only when there are too few pixel blocks to keep
  // every thread busy).
  const int64_t n_pb = (P + kNB - 1) / kNB;
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
      thread_local Scratch scratch;
      float* bp = scratch.get(static_cast<size_t>(kNB * kKC));
      for (int64_t t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
        const int64_t pb = t / n_cc, cc = t % n_cc;
        const int64_t pix0 = pb * kNB, nb = std::min(kNB, P - pix0);
        const int64_t c0 = cc * cc_rows, c1 = std::min(Cout, c0 + cc_rows);
        if (c0 >= c1) continue;
        // Bias into (or onto) the output block.
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
          for (int64_t j = 0; j < n_panel; ++j) {
            const int np = static_cast<int>(std::min<int64_t>(kNR, nb - j * kNR));
            pack_panel(g, pix0 + j * kNR, np, k0, kc, bp + j * kc * kNR);
          }
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
