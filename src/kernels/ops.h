// Small memory-bound operations (norms, activations, RoPE). They are a few percent of the run
// time next to the GEMMs, so one portable implementation serves as both reference and fast path.
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
// GELU with tanh approximation (as torch approximate="tanh").
void gelu_tanh(float* x, int64_t n);

}  // namespace klein::ops
