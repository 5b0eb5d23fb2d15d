// The element-wise and normalisation ops (norms, activations, RoPE, residuals) in plain scalar
// C++: the reference the Backend's element-wise ops are specified by, and the kScalar row of the
// registry's element-wise kernels (kernels/eltwise.h; the AVX2 / AVX-512 rows are tested against
// these). Statistics accumulate in double for 1e-6-level parity with torch's float32 results.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace klein::ops {

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w   for r in [0, rows); x may alias y.
// x/y rows are `n` wide at row stride `ld` (0 = n). w may be null (no affine weight).
void rms_norm(const float* x, float* y, const float* w, int64_t rows, int64_t n, float eps,
              ThreadPool* pool = nullptr, int64_t ld = 0);
// LayerNorm over the last dim (biased variance, as torch), optional affine w/b (null = none).
void layer_norm(const float* x, float* y, const float* w, const float* b, int64_t rows, int64_t n,
                float eps, ThreadPool* pool = nullptr);
// x = silu(x) elementwise; silu(v) = v / (1 + exp(-v)).
void silu(float* x, int64_t n);
// out[i] = silu(a[i]) * b[i].
void silu_mul(const float* a, const float* b, float* out, int64_t n);
// GELU with tanh approximation (as torch approximate="tanh"). No model uses it (FLUX.2 and
// Qwen3 use SiLU), so it has no SIMD version.
void gelu_tanh(float* x, int64_t n);
// y = e^x (std::exp).
void exp(const float* x, float* y, int64_t n);

// Residuals and modulation: h += g·o; y += x; y = x + c; y = x·scale[i] + shift[i];
// y = x·s + t (one pair for the whole row).
void gated_add(float* h, const float* o, const float* g, int64_t n);
void add(float* y, const float* x, int64_t n);
void add_scalar(const float* x, float c, float* y, int64_t n);
void scale_shift(const float* x, float* y, const float* scale, const float* shift, int64_t n);
void scale_shift1(const float* x, float* y, float s, float t, int64_t n);

// Mean and M2 = Σ(x − mean)² of x[0, n), two passes in double (the tiled GroupNorm's partials).
struct Moments {
  double mean, m2;
};
Moments moments(const float* x, int64_t n);
// GroupNorm's per-channel affine for cpg channels from a group's mean and biased variance:
// scale[c] = gamma[c]·rstd, shift[c] = beta[c] − mean·scale[c] (mean and rstd rounded to float).
void group_norm_affine_from_moments(double mean, double var, int64_t cpg, double eps, const float* gamma,
                                    const float* beta, float* scale, float* shift);
// Half-split RoPE in place on x [L, heads, D] at row stride ld; cos/sin [L, D/2].
void rope_half(float* x, int64_t L, int64_t heads, int64_t D, int64_t ld, const float* cos,
               const float* sin);
// Interleaved RoPE on one head v[D]: pairs (2j, 2j+1) rotated by cos/sin[D] (angle per pair,
// repeated), as diffusers' apply_rotary_emb with use_real_unbind_dim=-1.
void rope_interleaved_head(float* v, int64_t D, const float* cos, const float* sin);
// RMSNorm of one head v[D] in place with weight w[D].
void rms_norm_head(float* v, int64_t D, const float* w, float eps);

}  // namespace klein::ops
