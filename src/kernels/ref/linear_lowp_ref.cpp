// Scalar references of the fast linear kernels (bf16 dot products, int8 W8A8): the arithmetic
// each fast kernel promises, written as plainly as possible (see kernels.h for the exact
// definitions). The bf16 one sums in double, so tests bound the kernels' float32 summation
// error against it; the int8 one is integer arithmetic, so the kernels must match it exactly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "core/format.h"
#include "kernels/ggml_dot.h"
#include "kernels/kernels.h"

namespace klein::kernels::ref {
namespace {

std::vector<float> bias_f32(const Weight* bias, int64_t N) {
  std::vector<float> b(N, 0.0f);  // [N]
  if (bias && !bias->empty()) weight_to_f32(*bias, 0, N, b.data());
  return b;
}

}  // namespace

void linear_bf16(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  if (W.cols() != K) throw std::invalid_argument("ref::linear_bf16: K mismatch for " + W.name);
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  const std::vector<float> b = bias_f32(bias, N);
  std::vector<float> xr(M * K), w(K);  // x rounded to bf16 [M, K]; one W row [K]
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xr[m * K + k] = round_bf16(x[m * ldx + k]);
  for (int64_t n = 0; n < N; ++n) {
    weight_row_to_f32(W, n, w.data());
    for (float& v : w) v = round_bf16(v);
    for (int64_t m = 0; m < M; ++m) {
      double acc = b[n];
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xr[m * K + k]) * w[k];
      y[m * ldy + n] = static_cast<float>(acc);
    }
  }
}

void quantize_row_int8(const float* x, int64_t K, int8_t* q, float* s) {
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float a = std::fabs(x[k]);
    if (std::isnan(a)) {  // std::max would drop it
      amax = a;
      break;
    }
    amax = std::max(amax, a);
  }
  *s = amax / 127.0f;
  const bool finite = *s > 0.0f && *s < std::numeric_limits<float>::infinity();  // else q = 0 (kernels.h)
  for (int64_t k = 0; k < K; ++k) {
    const float r = finite ? std::nearbyint(x[k] / *s) : 0.0f;  // default mode: half to even
    q[k] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
}

void int8_accumulators(const int8_t* q, int64_t M, int64_t K, const Weight& W, int32_t* acc) {
  if (W.dtype != DType::kQ8Row) throw std::invalid_argument("ref::int8_accumulators: " + W.name + " is not Q8_ROW");
  const int64_t N = W.rows();
  const int8_t* w = static_cast<const int8_t*>(W.data);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      int32_t a = 0;
      for (int64_t k = 0; k < K; ++k) a += int32_t{q[m * K + k]} * int32_t{w[n * K + k]};
      acc[m * N + n] = a;
    }
}

void linear_w8a8(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  if (W.cols() != K) throw std::invalid_argument("ref::linear_w8a8: K mismatch for " + W.name);
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  const std::vector<float> b = bias_f32(bias, N);
  std::vector<int8_t> q(M * K);
  std::vector<float> sx(M);
  for (int64_t m = 0; m < M; ++m) quantize_row_int8(x + m * ldx, K, q.data() + m * K, &sx[m]);
  std::vector<int32_t> acc(M * N);
  int8_accumulators(q.data(), M, K, W, acc.data());
  for (int64_t n = 0; n < N; ++n) {
    const float sw = scale_at(W.scales, W.scale_dtype, n);
    for (int64_t m = 0; m < M; ++m) {
      const float t = static_cast<float>(acc[m * N + n]) * sx[m];
      y[m * ldy + n] = t * sw + b[n];
    }
  }
}

}  // namespace klein::kernels::ref

namespace klein::kernels::ref {

void linear_w4a8(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx, int64_t ldy) {
  if (W.dtype != DType::kQ4G64) throw std::invalid_argument("ref::linear_w4a8: " + W.name + " is not Q4_G64");
  const int64_t N = W.rows(), G = K / 64;
  if (W.cols() != K) throw std::invalid_argument("ref::linear_w4a8: K mismatch for " + W.name);
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  const std::vector<float> b = bias_f32(bias, N);
  std::vector<int8_t> q(K);
  const uint8_t* w = static_cast<const uint8_t*>(W.data);
  for (int64_t m = 0; m < M; ++m) {
    float sx;
    quantize_row_int8(x + m * ldx, K, q.data(), &sx);
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t g = 0; g < G; ++g) {
        int32_t a = 0, xs = 0;
        for (int64_t k = g * 64; k < g * 64 + 64; ++k) {
          const int nib = (w[n * (K / 2) + k / 2] >> (4 * (k % 2))) & 0xf;
          a += q[k] * nib;
          xs += q[k];
        }
        acc += static_cast<double>(scale_at(W.scales, W.scale_dtype, n * G + g)) * a +
               static_cast<double>(scale_at(W.offsets, W.scale_dtype, n * G + g)) * xs;
      }
      y[m * ldy + n] = static_cast<float>(static_cast<double>(sx) * acc + b[n]);
    }
  }
}

}  // namespace klein::kernels::ref


namespace klein::kernels::ref {

void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx, int64_t ldy) {
  ggml_dot::Form f;
  if (!ggml_dot::form_of(W.dtype, &f))
    throw std::invalid_argument("ref::linear_ggml: " + W.name + " is " + std::string(dtype_name(W.dtype)) +
                                ", not a ggml block format");
  const int64_t N = W.rows();
  if (W.cols() != K || K % f.act_block != 0)
    throw std::invalid_argument("ref::linear_ggml: K mismatch for " + W.name);
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  const std::vector<float> b = bias_f32(bias, N);
  const int64_t S = K / f.sub;
  std::vector<int8_t> w(N * K), q(K);  // the weight's codes [N, K]; one row of activation codes
  std::vector<float> fw(N * S), o(N * S, 0.0f), dx(S), xs(S);
  for (int64_t n = 0; n < N; ++n) ggml_dot::unpack_row(W, n, w.data() + n * K, fw.data() + n * S, o.data() + n * S);
  for (int64_t m = 0; m < M; ++m) {
    ggml_dot::quantize_act(f, x + m * ldx, K, q.data(), dx.data(), xs.data(), nullptr);
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* wn = w.data() + n * K;
      float acc = 0.0f;
      for (int64_t j = 0; j < S; ++j) {
        int32_t c = 0;
        for (int64_t k = j * f.sub; k < (j + 1) * f.sub; ++k) c += int32_t{q[k]} * int32_t{wn[k]};
        acc = std::fma(static_cast<float>(c), fw[n * S + j] * dx[j], acc);
        if (f.mins()) acc = std::fma(xs[j], o[n * S + j], acc);
      }
      y[m * ldy + n] = acc + b[n];
    }
  }
}

}  // namespace klein::kernels::ref
