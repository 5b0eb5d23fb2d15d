// The stride-1 direct bf16 conv's operands, shared by the AVX512_BF16 conv (conv2d_avx512bf16.cpp,
// whose top comment describes the algorithm) and the AMX one (conv2d_amx.cpp): the weight
// reordered into channel-pair units per chunk and tap, and the strip S of transformed input rows
// as channel-pair units.
//
// Include ONLY from conv2d_avx512bf16.cpp / conv2d_amx.cpp: everything has internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/conv2d_pack.h"

namespace klein::kernels {
namespace {

constexpr int64_t kCPC = 64;                   // channel pairs per chunk: a sliver's A is 14·taps·64 units
constexpr int64_t kStripBytes = int64_t{512} << 10;
// Output rows per band at least, past kStripBytes if need be: a band's strip holds KH − 1 rows
// more than it outputs, each built (GroupNorm + SiLU, bf16, pairs) once per band, so wide rows
// (the VAE's 128 channels at 512², 256 at 256²) that fit one output row per band built every
// input row three times. 6 rows, measured on the AMX Xeon: those convs 94 → 64 and 99 → 77 ms,
// narrower ones unchanged or faster (1 and 4 rows were slower; 8 spilled the 256² strips).
constexpr int64_t kMinBand = 6;

// How a direct conv splits its work: output rows in bands whose strip S (CP planes of R rows × LD
// units; tiles of 32 output pixels) fits kStripBytes, each band split into ranges of whole
// `unit`-row blocks of output channels so that the pool's threads get ~4 tasks each.
struct DirectPlan {
  int64_t n_xt, LD, band, n_cc, cc_rows, n_tasks;
  int64_t toff[64];  // tap (ky, kx) → offset in S (T ≤ 64: the callers check)
  // Task t: output rows [oy0, oy0 + rows), strip rows R, output channels [c0, c1) (empty: skip).
  struct Task {
    int64_t oy0, rows, R, c0, c1;
  };
  Task task(int64_t t, int64_t OH, int64_t KH, int64_t Cout) const {
    const int64_t oy0 = t / n_cc * band, c0 = t % n_cc * cc_rows, rows = std::min(band, OH - oy0);
    return {oy0, rows, rows + KH - 1, c0, std::min(Cout, c0 + cc_rows)};
  }
};
inline DirectPlan direct_plan(int64_t Cout, int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t CP, int64_t unit,
                              int threads) {
  DirectPlan d;
  d.n_xt = (OW + 31) / 32;
  d.LD = (d.n_xt * 32 + KW - 1 + 15) / 16 * 16;
  d.band = std::clamp<int64_t>(std::max(kMinBand, kStripBytes / (CP * d.LD * 4) - (KH - 1)), 1, OH);
  const int64_t n_band = (OH + d.band - 1) / d.band, n_unit = (Cout + unit - 1) / unit;
  d.n_cc = std::clamp<int64_t>((4 * static_cast<int64_t>(threads) + n_band - 1) / n_band, 1, n_unit);
  d.cc_rows = (n_unit + d.n_cc - 1) / d.n_cc * unit;
  d.n_tasks = n_band * d.n_cc;
  for (int64_t ky = 0; ky < KH; ++ky)
    for (int64_t kx = 0; kx < KW; ++kx) d.toff[ky * KW + kx] = ky * d.LD + kx;
  return d;
}

// One output channel's weight h[Cin][T] (bf16) as pair units d[T·CP], chunk-major: per chunk of
// kCPC pairs, per tap, per pair; zero past Cin (CP may be padded past Cin / 2: those pairs are zero).
// Through ht[T][2·CP], h by tap, where a tap's pairs are consecutive: one copy per chunk and tap
// (the element-wise reorder was 2.7 % of a 256² decode).
inline void direct_weight_row(const uint16_t* h, int64_t Cin, int64_t T, int64_t CP, uint16_t* ht, uint16_t* d) {
  for (int64_t t = 0; t < T; ++t) {
    uint16_t* r = ht + t * 2 * CP;
    for (int64_t c = 0; c < Cin; ++c) r[c] = h[c * T + t];
    std::fill(r + Cin, r + 2 * CP, uint16_t{0});
  }
  for (int64_t cp0 = 0; cp0 < CP; cp0 += kCPC) {
    const int64_t cpc = std::min(kCPC, CP - cp0);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(d + 2 * (T * cp0 + t * cpc), ht + t * 2 * CP + 2 * cp0, static_cast<size_t>(cpc) * 4);
  }
}

// The weight as bf16 pair units [Cout][T·CP] (direct_weight_row per output channel).
std::vector<uint16_t> direct_weights(const Weight& w, int64_t Cout, int64_t Cin, int64_t T, int64_t CP,
                                     ThreadPool& pool) {
  const int64_t U = T * CP, K = Cin * T;
  std::vector<uint16_t> out(static_cast<size_t>(Cout * U * 2), 0);
  pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
    std::vector<float> f(K);
    std::vector<uint16_t> h(K), ht(T * 2 * CP);
    for (int64_t co = b; co < e; ++co) {
      weight_row_f32(w, co, K, f.data());  // [Cin][T]
      f32_to_bf16_row(f.data(), K, h.data());
      direct_weight_row(h.data(), Cin, T, CP, ht.data(), out.data() + co * U * 2);
    }
  });
  return out;
}

// Units per output channel of the sub-pixel weights: 4·CP, one line more — the VAE's CP = 128 /
// 256 put 4·CP units 2 / 4 KB apart, so a sliver's 14 rows would share L1 sets (the 512-channel
// 64² → 128² conv ran at 53 % of the vdpbf16ps peak so, at 72 % with the line).
constexpr int64_t subpixel_lda(int64_t CP) { return 4 * CP + 16; }

// The sub-pixel form's weights (conv2d_subpixel_form: a 3×3 conv of the ×2 upsampled input) as
// four 2×2 convs' pair units [phase = dy·2 + dx][Cout][subpixel_lda(CP)]: tap (ty, tx) =
// subpixel_tap of the float weight, rounded to bf16 (ref::conv2d_bf16_subpixel's).
inline std::vector<uint16_t> subpixel_weights(const Weight& w, int64_t Cout, int64_t Cin, int64_t CP, ThreadPool& pool) {
  const int64_t U = subpixel_lda(CP);
  std::vector<uint16_t> out(static_cast<size_t>(4 * Cout * U * 2), 0);
  pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
    std::vector<float> f(Cin * 9), f4(Cin * 4);
    std::vector<uint16_t> h(Cin * 4), ht(4 * 2 * CP);
    for (int64_t co = b; co < e; ++co) {
      weight_row_f32(w, co, Cin * 9, f.data());  // [Cin][3][3]
      for (int ph = 0; ph < 4; ++ph) {
        for (int64_t ci = 0; ci < Cin; ++ci)
          for (int t = 0; t < 4; ++t) f4[ci * 4 + t] = subpixel_tap(f.data() + ci * 9, ph / 2, ph % 2, t / 2, t % 2);
        f32_to_bf16_row(f4.data(), Cin * 4, h.data());
        direct_weight_row(h.data(), Cin, 4, CP, ht.data(), out.data() + (ph * Cout + co) * U * 2);
      }
    }
  });
  return out;
}

// e^x for 16 lanes, as conv_exp8 (conv2d_pack.h) on zmm: the clamps (bound, x) keep a NaN.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(lo, x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

// 16 values of channel c at frame row iy, columns ix0 .. ix0 + 15 (lanes outside the image 0):
// read through the ×2 upsampling, the prologue applied (as transform_run).
inline __m512 frame16(const ConvGeom& g, int64_t c, int64_t iy, int64_t ix0, __mmask16 valid) {
  const float* src = g.x + (c * g.H + (g.up ? iy >> 1 : iy)) * g.W;
  __m512 v;
  if (!g.up) {
    v = _mm512_maskz_loadu_ps(valid, src + ix0);
  } else {
    // Lane l reads src[(ix0 + l) >> 1] = src[base + idx[l]]: one load of 16 from base, permuted.
    const int64_t base = ix0 >> 1;  // arithmetic shift: −1 for ix0 = −1
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i idx = _mm512_sub_epi32(_mm512_srai_epi32(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(ix0)), lane), 1),
                                         _mm512_set1_epi32(static_cast<int>(base)));
    const int64_t lo = std::max<int64_t>(0, -base), hi = std::min<int64_t>(16, g.W - base);
    const __mmask16 in = lo < hi ? static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
    v = _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(in, src + base));
  }
  if (g.prologue) {
    v = _mm512_fmadd_ps(v, _mm512_set1_ps(g.scale ? g.scale[c] : 1.0f), _mm512_set1_ps(g.shift ? g.shift[c] : 0.0f));
    if (g.silu) {
      // v / (1 + e^-v) with the reciprocal by vrcp14ps and one Newton step (≤ 2 ulp; the value is
      // rounded to bf16 next), much cheaper than vdivps on zmm.
      const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), v)));
      __m512 inv = _mm512_rcp14_ps(den);
      inv = _mm512_mul_ps(inv, _mm512_fnmadd_ps(den, inv, _mm512_set1_ps(2.0f)));
      v = _mm512_mul_ps(v, inv);
    }
  }
  return _mm512_maskz_mov_ps(valid, v);  // the padding is zero after the prologue
}

// S[cp][r][0, LD): frame rows iy = oy0 − pt + r (r < R), column x ↔ ix = x − pl; transformed,
// rounded to bf16 pairs, zero outside the image. One pass: no float copy of the rows.
void build_strip(const ConvGeom& g, int64_t CP, int64_t oy0, int64_t R, int64_t LD, uint32_t* S) {
  for (int64_t cp = 0; cp < CP; ++cp)
    for (int64_t r = 0; r < R; ++r) {
      uint32_t* d = S + (cp * R + r) * LD;
      const int64_t iy = oy0 - g.pt + r;
      if (iy < 0 || iy >= g.Hu || 2 * cp >= g.Cin) {  // outside the frame, or a padding pair
        std::memset(d, 0, LD * sizeof(uint32_t));
        continue;
      }
      const int64_t c = 2 * cp;
      for (int64_t x = 0; x < LD; x += 16) {
        const int64_t ix0 = x - g.pl;
        const int64_t lo = std::max<int64_t>(0, -ix0), hi = std::min<int64_t>(16, g.Wu - ix0);
        if (lo >= hi) {
          _mm512_storeu_si512(d + x, _mm512_setzero_si512());
          continue;
        }
        const __mmask16 valid = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
        const __m512 v0 = frame16(g, c, iy, ix0, valid);
        const __m512 v1 = c + 1 < g.Cin ? frame16(g, c + 1, iy, ix0, valid) : _mm512_setzero_ps();
        _mm512_storeu_si512(d + x, f32x16x2_to_bf16_pairs(v0, v1));
      }
    }
}

// Every task of plan d (over `rows` output rows of the strip's frame, a KH-tall kernel, geometry
// g) of every batch item, on the pool's threads: setup() once per thread and item (the AMX conv
// configures its tiles), then per task its strip S built (CP planes of tk.R rows × d.LD units)
// and body(o, tk, S), o the item's output.
template <class Setup, class Body>
void run_band_tasks(const DirectPlan& d, ConvGeom g, const float* in, int64_t N, int64_t in_item, float* out,
                    int64_t out_item, int64_t rows, int64_t KH, int64_t Cout, int64_t CP, ThreadPool& pool,
                    const Setup& setup, const Body& body) {
  for (int64_t n = 0; n < N; ++n) {
    g.x = in + n * in_item;
    float* o = out + n * out_item;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      setup();
      static thread_local UnitScratch strip_buf;
      for (int64_t t = next.fetch_add(1); t < d.n_tasks; t = next.fetch_add(1)) {
        const DirectPlan::Task tk = d.task(t, rows, KH, Cout);
        if (tk.c0 >= tk.c1) continue;
        uint32_t* S = strip_buf.get<uint32_t>(static_cast<size_t>(CP * tk.R * d.LD));
        build_strip(g, CP, tk.oy0, tk.R, d.LD, S);
        body(o, tk, S);
      }
    });
  }
}

}  // namespace
}  // namespace klein::kernels
