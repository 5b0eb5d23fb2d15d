// Scalar reference for kernels::linear: the obvious triple loop, accumulating in double so it is
// a trustworthy yardstick for the blocked float32 paths (tests bound |fast - ref| against it).
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/kernels.h"

namespace klein::kernels::ref {

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
            int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  if (W.cols() != K) throw std::invalid_argument("ref::linear: K mismatch for " + W.name);
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  std::vector<float> b(N, 0.0f);  // [N]
  if (bias && !bias->empty()) weight_to_f32(*bias, 0, N, b.data());
  std::vector<float> w(K);  // one row of W as float32: [K]
  for (int64_t n = 0; n < N; ++n) {
    weight_row_to_f32(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * ldx;
      double acc = b[n];
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xr[k]) * w[k];
      y[m * ldy + n] = static_cast<float>(acc);
    }
  }
}

void hadamard_groups(float* row, int64_t K, int64_t group) {
  int k = 0;
  for (int64_t n = group; n > 1; n /= 4) ++k;
  const float norm = std::ldexp(1.0f, -k);  // 1 / sqrt(4^k)
  for (float* g = row; g < row + K; g += group) {
    // Stage h applies h4 to the base-4 digit of stride h of every index.
    for (int64_t h = 1; h < group; h *= 4)
      for (int64_t i = 0; i < group; i += 4 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const float a = g[j], b = g[j + h], c = g[j + 2 * h], d = g[j + 3 * h];
          g[j] = a + b + c - d;
          g[j + h] = a + b - c + d;
          g[j + 2 * h] = a - b + c + d;
          g[j + 3 * h] = -a + b + c + d;
        }
    for (int64_t j = 0; j < group; ++j) g[j] *= norm;
  }
}

}  // namespace klein::kernels::ref
