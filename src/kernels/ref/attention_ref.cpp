// Scalar reference for kernels::attention: per (head, query) it materialises one row of scores
// [Sk], applies the mask, and does a max-subtracted softmax in double. Memory is O(Sk), not
// O(H·Sq·Sk), but speed is irrelevant here: it exists to check the flash-style fast path.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/kernels.h"

namespace klein::kernels::ref {

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo) {
  if (Hkv <= 0 || Hq % Hkv != 0) throw std::invalid_argument("ref::attention: Hq % Hkv != 0");
  if (ldq == 0) ldq = static_cast<int64_t>(Hq) * D;
  if (ldo == 0) ldo = static_cast<int64_t>(Hq) * D;
  if (ldk == 0) ldk = static_cast<int64_t>(Hkv) * D;
  if (ldv == 0) ldv = static_cast<int64_t>(Hkv) * D;
  const int group = Hq / Hkv;
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> s(Sk);  // scores of one query row: [Sk]
  std::vector<double> o(D);   // [D]
  for (int h = 0; h < Hq; ++h) {
    const int g = h / group;
    for (int64_t i = 0; i < Sq; ++i) {
      const float* qi = q + i * ldq + static_cast<int64_t>(h) * D;
      double mx = ninf;
      for (int64_t j = 0; j < Sk; ++j) {
        const bool visible = (!mask.causal || j <= i) && (!mask.key_valid || mask.key_valid[j]);
        if (!visible) {
          s[j] = ninf;
          continue;
        }
        const float* kj = k + j * ldk + static_cast<int64_t>(g) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
        s[j] = dot * scale;
        if (s[j] > mx) mx = s[j];
      }
      float* oi = out + i * ldo + static_cast<int64_t>(h) * D;
      if (mx == ninf) {  // no visible key: defined as zeros
        for (int d = 0; d < D; ++d) oi[d] = 0.0f;
        continue;
      }
      double sum = 0;
      for (int d = 0; d < D; ++d) o[d] = 0;
      for (int64_t j = 0; j < Sk; ++j) {
        if (s[j] == ninf) continue;
        const double p = std::exp(s[j] - mx);
        sum += p;
        const float* vj = v + j * ldv + static_cast<int64_t>(g) * D;
        for (int d = 0; d < D; ++d) o[d] += p * vj[d];
      }
      for (int d = 0; d < D; ++d) oi[d] = static_cast<float>(o[d] / sum);
    }
  }
}

}  // namespace klein::kernels::ref
