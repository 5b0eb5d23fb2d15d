// Scalar reference for kernels::attention: per (head, query) it materialises one row of scores
// [Sk], applies the mask, and does a max-subtracted softmax in double. Memory is O(Sk), not
// O(H·Sq·Sk), but speed is irrelevant here: it exists to check the flash-style fast paths.
// Non-finite scores (kernels.h): the mask decides visibility, never a score's value, so a NaN
// score (or an undefined softmax: +inf − +inf, every visible score −inf) makes the row NaN.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "kernels/kernels.h"

namespace klein::kernels::ref {

namespace {

inline double bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// max that keeps a NaN from either side (std::max drops one in its second operand).
inline double max_nan(double a, double b) { return std::isnan(a) || a > b ? a : b; }

// Both references; bf16: the operands rounded as attention_bf16 documents (kernels.h).
void attention_impl(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
                    int Hkv, int D, float scale, const AttnMask& mask, int64_t ldq, int64_t ldk, int64_t ldv,
                    int64_t ldo, bool bf16) {
  if (Hkv <= 0 || Hq % Hkv != 0) throw std::invalid_argument("ref::attention: Hq % Hkv != 0");
  if (ldq == 0) ldq = static_cast<int64_t>(Hq) * D;
  if (ldo == 0) ldo = static_cast<int64_t>(Hq) * D;
  if (ldk == 0) ldk = static_cast<int64_t>(Hkv) * D;
  if (ldv == 0) ldv = static_cast<int64_t>(Hkv) * D;
  const int group = Hq / Hkv;
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> s(Sk);  // scores of one query row: [Sk]
  std::vector<double> o(D);   // [D]
  std::vector<double> qr(D);  // one query row as used: q, or bf16(q · scale · log2 e)
  const float qmul = scale * 1.44269504088896341f;
  for (int h = 0; h < Hq; ++h) {
    const int g = h / group;
    for (int64_t i = 0; i < Sq; ++i) {
      const float* qi = q + i * ldq + static_cast<int64_t>(h) * D;
      for (int d = 0; d < D; ++d) qr[d] = bf16 ? bf16r(qi[d] * qmul) : qi[d];
      double mx = ninf;
      bool any_visible = false;
      for (int64_t j = 0; j < Sk; ++j) {
        const bool visible = (!mask.causal || j <= i) && (!mask.key_valid || mask.key_valid[j]);
        if (!visible) {
          s[j] = ninf;
          continue;
        }
        any_visible = true;
        const float* kj = k + j * ldk + static_cast<int64_t>(g) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qr[d] * (bf16 ? bf16r(kj[d]) : kj[d]);
        s[j] = bf16 ? dot : dot * scale;  // bf16: log2 units
        mx = max_nan(mx, s[j]);
      }
      float* oi = out + i * ldo + static_cast<int64_t>(h) * D;
      if (!any_visible) {  // no visible key: defined as zeros
        for (int d = 0; d < D; ++d) oi[d] = 0.0f;
        continue;
      }
      if (!std::isfinite(mx)) {  // a NaN, +inf (inf − inf) or only −inf scores: undefined
        for (int d = 0; d < D; ++d) oi[d] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      double sum = 0;
      for (int d = 0; d < D; ++d) o[d] = 0;
      if (bf16) {
        // Online softmax over key blocks, as the kernel: p against the running max, in bf16.
        double m = ninf;
        for (int64_t j0 = 0; j0 < Sk; j0 += kAttnBf16KeyBlock) {
          const int64_t j1 = std::min(Sk, j0 + kAttnBf16KeyBlock);
          double bm = ninf;
          for (int64_t j = j0; j < j1; ++j) bm = max_nan(bm, s[j]);
          if (bm == ninf) continue;
          const double mnew = std::max(m, bm), corr = m == ninf ? 0.0 : std::exp2(m - mnew);
          sum *= corr;
          for (int d = 0; d < D; ++d) o[d] *= corr;
          for (int64_t j = j0; j < j1; ++j) {
            if (s[j] == ninf) continue;
            const double p = std::exp2(s[j] - mnew);
            sum += p;
            const double pr = bf16r(static_cast<float>(p));
            const float* vj = v + j * ldv + static_cast<int64_t>(g) * D;
            for (int d = 0; d < D; ++d) o[d] += pr * bf16r(vj[d]);
          }
          m = mnew;
        }
      } else {
        for (int64_t j = 0; j < Sk; ++j) {
          if (s[j] == ninf) continue;
          const double p = std::exp(s[j] - mx);
          sum += p;
          const float* vj = v + j * ldv + static_cast<int64_t>(g) * D;
          for (int d = 0; d < D; ++d) o[d] += p * vj[d];
        }
      }
      for (int d = 0; d < D; ++d) oi[d] = static_cast<float>(o[d] / sum);
    }
  }
}

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
               int Hkv, int D, float scale, const AttnMask& mask, int64_t ldq, int64_t ldk, int64_t ldv,
               int64_t ldo) {
  attention_impl(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, ldq, ldk, ldv, ldo, false);
}

void attention_bf16(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
                    int Hkv, int D, float scale, const AttnMask& mask, int64_t ldq, int64_t ldk, int64_t ldv,
                    int64_t ldo) {
  attention_impl(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, ldq, ldk, ldv, ldo, true);
}

}  // namespace klein::kernels::ref
