#include "core/quantize.h"

#include <algorithm>
#include <cmath>

namespace klein {

// Built with -ffp-contract=off (CMakeLists.txt): the recipes promise single float32 operations.

float quantize_row_q8(const float* w, int64_t n, int8_t* q) {
  float amax = 0.0f;
  for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::fabs(w[k]));
  const float s = amax / 127.0f;
  if (!(s > 0.0f)) {
    std::fill(q, q + n, int8_t{0});
    return 0.0f;
  }
  for (int64_t k = 0; k < n; ++k) {
    const float v = std::nearbyint(w[k] / s);  // default rounding mode: half to even
    q[k] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return s;
}

void quantize_group_q4(const float* w, uint8_t packed[32], float* scale_out, float* bias_out) {
  constexpr float kBins = 15.0f, kEps = 1e-7f;
  float lo = INFINITY, hi = -INFINITY;
  for (int k = 0; k < 64; ++k) {
    lo = std::min(lo, w[k]);
    hi = std::max(hi, w[k]);
  }
  const bool flip = std::fabs(lo) > std::fabs(hi);
  float scale = std::max((hi - lo) / kBins, kEps);
  scale = flip ? scale : -scale;
  const float edge = flip ? lo : hi;
  const float q0 = std::nearbyint(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  for (int k = 0; k < 64; k += 2) {
    uint8_t b = 0;
    for (int j = 0; j < 2; ++j) {
      const float v = std::clamp(std::nearbyint((w[k + j] - bias) / scale), 0.0f, kBins);
      b |= static_cast<uint8_t>(static_cast<unsigned>(v) << (4 * j));
    }
    packed[k / 2] = b;
  }
  *scale_out = scale;
  *bias_out = bias;
}

}  // namespace klein
