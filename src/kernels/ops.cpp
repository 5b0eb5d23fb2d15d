#include "kernels/ops.h"

#include <cmath>

namespace klein::ops {

void rms_norm(const float* x, float* y, const float* w, int64_t rows, int64_t n, float eps,
              ThreadPool* pool, int64_t ld) {
  if (ld == 0) ld = n;
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * ld;
      float* yr = y + r * ld;
      double ss = 0.0;  // double keeps the statistic exact enough for 1e-6-level parity
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
      if (w) {
        for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
      } else {
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
      }
    }
  };
  if (pool && rows > 8) pool->parallel_for(rows, body, 8);
  else body(0, rows);
}

void layer_norm(const float* x, float* y, const float* w, const float* b, int64_t rows, int64_t n,
                float eps, ThreadPool* pool) {
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += xr[i];
      const double mean = s / n;
      double v = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = xr[i] - mean;
        v += d * d;
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(v / n + eps));
      const float m = static_cast<float>(mean);
      for (int64_t i = 0; i < n; ++i) {
        float t = (xr[i] - m) * inv;
        if (w) t *= w[i];
        if (b) t += b[i];
        yr[i] = t;
      }
    }
  };
  if (pool && rows > 8) pool->parallel_for(rows, body, 8);
  else body(0, rows);
}

void silu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void silu_mul(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

void gelu_tanh(float* x, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
  }
}

}  // namespace klein::ops
