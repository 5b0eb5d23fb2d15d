#include "kernels/ref/elementwise.h"

#include <cmath>

namespace klein::ops {

namespace {

// LayerNorm / GroupNorm statistics of x[0, n): two passes in double (mean, then the centred
// biased variance, as torch), rounded to float at the end.
struct MeanRstd {
  float mean, rstd;
};
MeanRstd mean_rstd(const float* x, int64_t n, double eps) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const double mean = s / static_cast<double>(n);
  double v = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    v += d * d;
  }
  return {static_cast<float>(mean), static_cast<float>(1.0 / std::sqrt(v / static_cast<double>(n) + eps))};
}

// 1 / sqrt(mean(x²) + eps), the sum of squares in double.
float rms_inv(const float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
}

}  // namespace

void rms_norm(const float* x, float* y, const float* w, int64_t rows, int64_t n, float eps,
              ThreadPool* pool, int64_t ld) {
  if (ld == 0) ld = n;
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * ld;
      float* yr = y + r * ld;
      const float inv = rms_inv(xr, n, eps);
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
      const MeanRstd st = mean_rstd(xr, n, eps);
      for (int64_t i = 0; i < n; ++i) {
        float t = (xr[i] - st.mean) * st.rstd;
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

void exp(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

void gated_add(float* h, const float* o, const float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] += g[i] * o[i];
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add_scalar(const float* x, float c, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = c + x[i];
}

void scale_shift(const float* x, float* y, const float* scale, const float* shift, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale[i] + shift[i];
}

void scale_shift1(const float* x, float* y, float s, float t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s + t;
}

void gelu_tanh(float* x, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
  }
}

Moments moments(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const double mean = s / static_cast<double>(n);
  double m2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    m2 += d * d;
  }
  return {mean, m2};
}

// Rounded as mean_rstd does (LayerNorm), so tiled and whole-tensor GroupNorm agree.
void group_norm_affine_from_moments(double mean, double var, int64_t cpg, double eps, const float* gamma,
                                    const float* beta, float* scale, float* shift) {
  const float m = static_cast<float>(mean), rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
  for (int64_t c = 0; c < cpg; ++c) {
    scale[c] = gamma[c] * rstd;
    shift[c] = beta[c] - m * scale[c];
  }
}

void rope_half(float* x, int64_t L, int64_t heads, int64_t D, int64_t ld, const float* cosv,
               const float* sinv) {
  const int64_t half = D / 2;
  for (int64_t l = 0; l < L; ++l) {
    const float* c = cosv + l * half;
    const float* s = sinv + l * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + l * ld + h * D;
      for (int64_t d = 0; d < half; ++d) {
        const float a = v[d], b = v[d + half];
        v[d] = a * c[d] - b * s[d];
        v[d + half] = b * c[d] + a * s[d];
      }
    }
  }
}

void rope_interleaved_head(float* v, int64_t D, const float* c, const float* s) {
  // out = x * cos + rotate(x) * sin with rotate(x)[2j] = -x[2j+1], rotate(x)[2j+1] = x[2j].
  for (int64_t j = 0; j < D; j += 2) {
    const float a = v[j], b = v[j + 1];
    v[j] = a * c[j] + (-b) * s[j];
    v[j + 1] = b * c[j + 1] + a * s[j + 1];
  }
}

void rms_norm_head(float* v, int64_t D, const float* w, float eps) {
  const float inv = rms_inv(v, D, eps);
  for (int64_t i = 0; i < D; ++i) v[i] = (v[i] * inv) * w[i];
}

}  // namespace klein::ops
