// The AVX2 and AVX-512 element-wise kernels (kernels/eltwise.h), written once over a vector
// type V: eltwise_avx2.cpp instantiates them with 8-lane ymm, eltwise_avx512.cpp with 16-lane
// zmm. V provides loads / stores (full and masked to the first k lanes), float arithmetic, the
// exp, a swap of adjacent lanes (interleaved RoPE) and the float → double widening of both
// halves of a vector (norm statistics are summed in double, as the reference does).
//
// Include ONLY from those two files (and, through eltwise_v16.h, amx_common.h: the fused SwiGLU).
// Everything here has internal linkage, so each file keeps its
// own copy compiled with its own ISA flags: a shared inline function would be one symbol that the
// linker could resolve to the AVX-512 copy for an AVX2 caller.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/eltwise.h"

namespace klein::kernels {
namespace {

template <class V>
struct EltwiseSimd {
  using F = typename V::F;
  using D = typename V::D;
  static constexpr int W = V::W;

  // Loads and stores of W lanes at p: Full for the body, Part (masked, zero-filled) for the
  // last n % W elements, so a kernel never reads or writes past the row end.
  struct Full {
    F load(const float* p) const { return V::load(p); }
    void store(float* p, F v) const { V::store(p, v); }
  };
  struct Part {
    typename V::M m;
    F load(const float* p) const { return V::load_n(p, m); }
    void store(float* p, F v) const { V::store_n(p, v, m); }
  };
  // body(i, io) for i = 0, W, 2W, ... < n, io being Full or, for the last partial step, Part.
  template <class Body>
  static void for_each(int64_t n, Body&& body) {
    int64_t i = 0;
    for (; i + W <= n; i += W) body(i, Full{});
    if (i < n) body(i, Part{V::mask(n - i)});
  }

  // ---- statistics in double. Four accumulators (two vectors of W floats per step, each
  // widened in two halves): the adds and FMAs have 3-4 cycles of latency, one chain would
  // leave the core idle. Tails are summed in scalar double as in the reference.
  static double sum(const float* x, int64_t n) {
    D a0 = V::dzero(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
      const F u = V::load(x + i), v = V::load(x + i + W);
      a0 = V::dadd(a0, V::lo(u)), a1 = V::dadd(a1, V::hi(u));
      a2 = V::dadd(a2, V::lo(v)), a3 = V::dadd(a3, V::hi(v));
    }
    for (; i + W <= n; i += W) {
      const F u = V::load(x + i);
      a0 = V::dadd(a0, V::lo(u)), a1 = V::dadd(a1, V::hi(u));
    }
    double s = V::dhsum(V::dadd(V::dadd(a0, a1), V::dadd(a2, a3)));
    for (; i < n; ++i) s += x[i];
    return s;
  }
  // Σ (x − c)² (c = 0: the sum of squares).
  static double sum_sq_dev(const float* x, int64_t n, double c) {
    const D vc = V::dset1(c);
    D a0 = V::dzero(), a1 = a0, a2 = a0, a3 = a0;
    auto sq = [&](D acc, D v) {
      const D d = V::dsub(v, vc);
      return V::dfma(d, d, acc);
    };
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
      const F u = V::load(x + i), v = V::load(x + i + W);
      a0 = sq(a0, V::lo(u)), a1 = sq(a1, V::hi(u));
      a2 = sq(a2, V::lo(v)), a3 = sq(a3, V::hi(v));
    }
    for (; i + W <= n; i += W) {
      const F u = V::load(x + i);
      a0 = sq(a0, V::lo(u)), a1 = sq(a1, V::hi(u));
    }
    double s = V::dhsum(V::dadd(V::dadd(a0, a1), V::dadd(a2, a3)));
    for (; i < n; ++i) {
      const double d = x[i] - c;
      s += d * d;
    }
    return s;
  }
  // The reference's 1 / sqrt(mean(x²) + eps), rounded to float the same way.
  static float rms_inv(const float* x, int64_t n, float eps) {
    return 1.0f / std::sqrt(static_cast<float>(sum_sq_dev(x, n, 0.0) / static_cast<double>(n)) + eps);
  }

  // ---- kernels

  static void rms_norm(const float* x, float* y, const float* w, int64_t n, float eps) {
    const F inv = V::set1(rms_inv(x, n, eps));
    if (w)
      for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::mul(io.load(w + i), V::mul(io.load(x + i), inv))); });
    else
      for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::mul(io.load(x + i), inv)); });
  }

  static void layer_norm(const float* x, float* y, const float* w, const float* b, int64_t n, float eps) {
    const double mean = sum(x, n) / static_cast<double>(n);
    const double var = sum_sq_dev(x, n, mean) / static_cast<double>(n);
    const F m = V::set1(static_cast<float>(mean));
    const F rstd = V::set1(static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps))));
    auto norm = [&](F v) { return V::mul(V::sub(v, m), rstd); };
    if (w && b)  // the modulated LayerNorm of every DiT block: onep and shift
      for_each(n, [&](int64_t i, auto io) {
        io.store(y + i, V::fmadd(norm(io.load(x + i)), io.load(w + i), io.load(b + i)));
      });
    else if (w)
      for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::mul(norm(io.load(x + i)), io.load(w + i))); });
    else if (b)
      for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::add(norm(io.load(x + i)), io.load(b + i))); });
    else
      for_each(n, [&](int64_t i, auto io) { io.store(y + i, norm(io.load(x + i))); });
  }

  // Two passes (the mean, then Σ (x − mean)²) per chunk of kMomentsChunk values, the chunks merged
  // as Chan et al. (as group_norm_stats merges tiles): the second pass reads the chunk from L2,
  // not memory. Whole-group passes read the VAE's GroupNorm groups twice from memory (16 MB each
  // at 1024²): `moments` was ~10 % of a 1024² decode under perf.
  static constexpr int64_t kMomentsChunk = int64_t{1} << 15;  // 128 KB of floats
  static Moments moments(const float* x, int64_t n) {
    double count = 0.0, mean = 0.0, m2 = 0.0;
    for (int64_t c0 = 0; c0 < n; c0 += kMomentsChunk) {
      const int64_t nb = std::min(kMomentsChunk, n - c0);
      const double mb = sum(x + c0, nb) / static_cast<double>(nb), m2b = sum_sq_dev(x + c0, nb, mb);
      if (c0 == 0) {
        count = static_cast<double>(nb), mean = mb, m2 = m2b;
        continue;
      }
      const double nbd = static_cast<double>(nb), nt = count + nbd, d = mb - mean;
      mean += d * nbd / nt;
      m2 += m2b + d * d * count * nbd / nt;
      count = nt;
    }
    return {mean, m2};
  }

  static void rope_half(float* x, int64_t heads, int64_t D_, const float* cos, const float* sin) {
    const int64_t half = D_ / 2;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * D_;
      for_each(half, [&](int64_t i, auto io) {
        const F a = io.load(v + i), b = io.load(v + half + i), c = io.load(cos + i), s = io.load(sin + i);
        io.store(v + i, V::fmsub(a, c, V::mul(b, s)));
        io.store(v + half + i, V::fmadd(b, c, V::mul(a, s)));
      });
    }
  }

  // Interleaved RoPE of W lanes: (a, b) pairs → (a·c − b·s, b·c + a·s), as
  // x·cos + (−x_odd, x_even)·sin. The pair partner comes from a lane swap and the minus from a
  // sign flip of the even lanes; a step starts at an even index, so pairs never straddle steps.
  static F rope_pairs(F a, F c, F s) {
    const F t = V::flip_even(V::mul(V::swap_pairs(a), s));
    return V::fmadd(a, c, t);
  }

  static void rope_interleaved(float* x, int64_t heads, int64_t D_, const float* cos, const float* sin) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * D_;
      for_each(D_, [&](int64_t i, auto io) {
        io.store(v + i, rope_pairs(io.load(v + i), io.load(cos + i), io.load(sin + i)));
      });
    }
  }

  // Fused: the head's statistics pass, then one pass that normalises and rotates in registers
  // (the head, 512 bytes at D = 128, is still in L1 for the second read).
  static void qk_norm_rope(float* x, int64_t heads, int64_t D_, const float* w, float eps, const float* cos,
                           const float* sin) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * D_;
      const F inv = V::set1(rms_inv(v, D_, eps));
      for_each(D_, [&](int64_t i, auto io) {
        const F nv = V::mul(V::mul(io.load(v + i), inv), io.load(w + i));  // (v·inv)·w as the reference
        io.store(v + i, rope_pairs(nv, io.load(cos + i), io.load(sin + i)));
      });
    }
  }

  // silu(v) = v / (1 + e^−v) with a true division (not rcp + Newton: ~1 ulp more).
  static F silu_v(F v) { return V::div(v, V::add(V::set1(1.0f), V::exp(V::neg(v)))); }

  static void silu_mul(const float* a, const float* b, float* out, int64_t n) {
    for_each(n, [&](int64_t i, auto io) { io.store(out + i, V::mul(silu_v(io.load(a + i)), io.load(b + i))); });
  }
  static void silu(float* x, int64_t n) {
    for_each(n, [&](int64_t i, auto io) { io.store(x + i, silu_v(io.load(x + i))); });
  }
  static void gated_add(float* h, const float* o, const float* g, int64_t n) {
    for_each(n, [&](int64_t i, auto io) { io.store(h + i, V::fmadd(io.load(g + i), io.load(o + i), io.load(h + i))); });
  }
  static void add(float* y, const float* x, int64_t n) {
    for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::add(io.load(y + i), io.load(x + i))); });
  }
  static void add_scalar(const float* x, float c, float* y, int64_t n) {
    const F vc = V::set1(c);
    for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::add(vc, io.load(x + i))); });
  }
  static void scale_shift(const float* x, float* y, const float* sc, const float* sh, int64_t n) {
    for_each(n, [&](int64_t i, auto io) {
      io.store(y + i, V::fmadd(io.load(x + i), io.load(sc + i), io.load(sh + i)));
    });
  }
  static void scale_shift1(const float* x, float* y, float s, float t, int64_t n) {
    const F vs = V::set1(s), vt = V::set1(t);
    for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::fmadd(io.load(x + i), vs, vt)); });
  }
  static void exp(const float* x, float* y, int64_t n) {
    for_each(n, [&](int64_t i, auto io) { io.store(y + i, V::exp(io.load(x + i))); });
  }

  static constexpr EltwiseFns table() {
    return {
        .rms_norm = rms_norm,
        .layer_norm = layer_norm,
        .moments = moments,
        .rope_half = rope_half,
        .rope_interleaved = rope_interleaved,
        .qk_norm_rope = qk_norm_rope,
        .silu_mul = silu_mul,
        .silu = silu,
        .gated_add = gated_add,
        .add = add,
        .add_scalar = add_scalar,
        .scale_shift = scale_shift,
        .scale_shift1 = scale_shift1,
        .exp = exp,
    };
  }
};

// e^x with the Cephes expf polynomial, shared by both widths (V supplies round, scale by 2^n):
// n = round(x·log2 e), r = x − n·ln 2 (ln 2 in two parts, FMA: r is exact to float precision),
// e^r ≈ 1 + (r + r²·P(r)) with P of degree 5 on |r| ≤ ln2 / 2 — adding the 1 last keeps the
// small terms' bits (adding 1 to r first measured 1.26 ulp) — then scaled by 2^n. Measured over
// every float in [-104, 89] against the exact value: ≤ 1.01 ulp (22 of 2.24e9 inputs above
// 1 ulp); ≥ 88.7229 → +inf, ≤ -103.973 → 0 (subnormals between), NaN → NaN. The clamps are
// written (bound, x) so that a NaN x passes through (max / min return the second operand when
// one is NaN).
template <class V>
inline typename V::F exp_cephes(typename V::F x) {
  using F = typename V::F;
  x = V::min(V::set1(89.0f), V::max(V::set1(-104.0f), x));
  const F n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  F r = V::fnmadd(n, V::set1(0.693359375f), x);
  r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
  F p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, r, V::set1(1.6666665459e-1f));
  p = V::fmadd(p, r, V::set1(5.0000001201e-1f));
  const F e = V::add(V::fmadd(p, V::mul(r, r), r), V::set1(1.0f));
  return V::scale2n(e, n);
}

}  // namespace
}  // namespace klein::kernels
