#include "core/quantize_gguf.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace klein::ggml_quant {
namespace {

constexpr int kQK = 32;
constexpr int kQKK = 256;
constexpr float kGroupMaxEps = 1e-15f;  // ggml-quants.c GROUP_MAX_EPS

void put_half(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}
float get_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// ggml's nearest_int: round half to even through the 1.5·2^23 trick (|fval| ≤ 4194303).
int nearest_int(float fval) {
  const float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

// roundf (half away from zero) for |x| < 2^31, inline: a libm call per element made Q8_0 5x
// slower than Q4_0. x - trunc(x) is exact, so the comparisons decide exactly as roundf does.
int round_away(float x) {
  int i = static_cast<int>(x);  // truncation
  const float f = x - static_cast<float>(i);
  if (f >= 0.5f) ++i;
  else if (f <= -0.5f) --i;
  return i;
}

// ---- 32-element blocks (ggml-quants.c quantize_row_q{4,5}_{0,1}_ref, quantize_row_q8_0_ref).

void q4_0(const float* x, int64_t nb, uint8_t* y) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 18) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[j] * id, x1 = x[kQK / 2 + j] * id;
      const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 8.5f)));
      const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 8.5f)));
      y[2 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void q4_1(const float* x, int64_t nb, uint8_t* y) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 20) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    put_half(y + 2, min);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[j] - min) * id, x1 = (x[kQK / 2 + j] - min) * id;
      const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 0.5f)));
      const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 0.5f)));
      y[4 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void q5_0(const float* x, int64_t nb, uint8_t* y) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 22) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[j] * id, x1 = x[kQK / 2 + j] * id;
      const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(31, static_cast<int8_t>(x0 + 16.5f)));
      const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(31, static_cast<int8_t>(x1 + 16.5f)));
      y[6 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y + 2, &qh, 4);
  }
}

void q5_1(const float* x, int64_t nb, uint8_t* y) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 24) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    put_half(y + 2, min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[j] - min) * id, x1 = (x[kQK / 2 + j] - min) * id;
      const uint8_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
      const uint8_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
      y[8 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y + 4, &qh, 4);
  }
}

void q8_0(const float* x, int64_t nb, uint8_t* y) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    for (int j = 0; j < kQK; ++j) y[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(round_away(x[j] * id)));
  }
}

// ---- K-quant helpers (ggml-quants.c make_qx_quants, make_q3_quants, make_qkx2_quants).

// rmse_type 1 and no importance weights: the only form quantize_row_q6_K_ref uses.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// do_rmse true: the only form quantize_row_q3_K_ref uses.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ---- K-quants. Offsets are ggml-common.h's block_q*_K layouts.

// block_q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}
void q2_k(const float* x, int64_t nb, uint8_t* y) {
  uint8_t L[kQKK], Laux[16];
  float weights[16], mins[kQKK / 16], scales[kQKK / 16];
  const float q4scale = 15.f;
  for (int64_t i = 0; i < nb; ++i, x += kQKK, y += 84) {
    uint8_t* sc = y;
    uint8_t* qs = y + 16;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < kQKK / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < kQKK / 16; ++j) sc[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      put_half(y + 80, max_scale / q4scale);
    } else {
      for (int j = 0; j < kQKK / 16; ++j) sc[j] = 0;
      put_half(y + 80, 0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < kQKK / 16; ++j) sc[j] = static_cast<uint8_t>(sc[j] | (nearest_int(iscale * mins[j]) << 4));
      put_half(y + 82, max_min / q4scale);
    } else {
      put_half(y + 82, 0.f);
    }
    for (int j = 0; j < kQKK / 16; ++j) {
      const float d = get_half(y + 80) * (sc[j] & 0xF);
      if (!d) continue;
      const float dm = get_half(y + 82) * (sc[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    for (int j = 0; j < kQKK; j += 128)
      for (int l = 0; l < 32; ++l)
        qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

// block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
void q3_k(const float* x, int64_t nb, uint8_t* y) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  for (int64_t i = 0; i < nb; ++i, x += kQKK, y += 110) {
    uint8_t* hmask = y;
    uint8_t* qs = y + 32;
    uint8_t* sc = y + 96;
    float max_scale = 0, amax = 0;
    for (int j = 0; j < kQKK / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(sc, 0, 12);
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < kQKK / 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>(std::max<int>(-32, std::min<int>(31, l)) + 32);
        if (j < 8) sc[j] = l & 0xF;
        else sc[j - 8] = static_cast<uint8_t>(sc[j - 8] | ((l & 0xF) << 4));
        l = static_cast<int8_t>(l >> 4);
        sc[j % 4 + 8] = static_cast<uint8_t>(sc[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      put_half(y + 108, 1 / iscale);
    } else {
      put_half(y + 108, 0.f);
    }
    for (int j = 0; j < kQKK / 16; ++j) {
      int8_t s = static_cast<int8_t>(j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4);
      s = static_cast<int8_t>((s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
      const float d = get_half(y + 108) * s;
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-4, std::min(3, l));
        L[16 * j + ii] = static_cast<int8_t>(l + 4);
      }
    }
    std::memset(hmask, 0, kQKK / 8);
    // The high bit of the first 32 quants goes to bit 0 of hmask[0..31], the next 32 to bit 1, ...
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < kQKK; ++j) {
      if (L[j] > 3) {
        hmask[m] |= hm;
        L[j] = static_cast<int8_t>(L[j] - 4);
      }
      if (++m == kQKK / 8) {
        m = 0;
        hm = static_cast<uint8_t>(hm << 1);
      }
    }
    for (int j = 0; j < kQKK; j += 128)
      for (int l = 0; l < 32; ++l)
        qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

// Q4_K and Q5_K share the scale search and packing of the 8 sub-blocks' 6-bit scales and mins
// (block {f16 d; f16 dmin; u8 scales[12]; ...}); nmax 15 / 31, rmin -1 / -0.5, nstep 20 / 15.
void k4_scales(const float* x, int nmax, float rmin, int nstep, uint8_t* y, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[kQKK / 32], scales[kQKK / 32];
  uint8_t* sc = y + 4;
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] = static_cast<uint8_t>(sc[j - 4] | ((ls >> 4) << 6));
      sc[j - 0] = static_cast<uint8_t>(sc[j - 0] | ((lm >> 4) << 6));
    }
  }
  put_half(y, max_scale / 63.f);
  put_half(y + 2, max_min / 63.f);
  uint8_t s, m;
  for (int j = 0; j < kQKK / 32; ++j) {
    get_scale_min_k4(j, sc, &s, &m);
    const float d = get_half(y) * s;
    if (!d) continue;
    const float dm = get_half(y + 2) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

// block_q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
void q4_k(const float* x, int64_t nb, uint8_t* y) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < nb; ++i, x += kQKK, y += 144) {
    std::memset(y, 0, 144);
    k4_scales(x, 15, -1.f, 20, y, L);
    uint8_t* q = y + 16;
    for (int j = 0; j < kQKK; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

// block_q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
void q5_k(const float* x, int64_t nb, uint8_t* y) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < nb; ++i, x += kQKK, y += 176) {
    std::memset(y, 0, 176);
    k4_scales(x, 31, -0.5f, 15, y, L);
    uint8_t* qh = y + 16;
    uint8_t* ql = y + 48;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < kQKK; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

// block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
void q6_k(const float* x, int64_t nb, uint8_t* y) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  for (int64_t i = 0; i < nb; ++i, x += kQKK, y += 210) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQKK / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(y, 0, 210);
      continue;
    }
    int8_t* sc = reinterpret_cast<int8_t*>(y + 192);
    const float iscale = -128.f / max_scale;
    put_half(y + 208, 1 / iscale);
    for (int ib = 0; ib < kQKK / 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < kQKK / 16; ++j) {
      const float d = get_half(y + 208) * sc[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = static_cast<int8_t>(l + 32);
      }
    }
    uint8_t* ql = y;
    uint8_t* qh = y + 128;
    for (int j = 0; j < kQKK; j += 128, ql += 64, qh += 32)
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
  }
}

// ggml_compute_fp32_to_bf16: NaNs made quiet, otherwise round to nearest even.
uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace

bool writable(DType t) { return block_bytes(t) > 0; }

int64_t block_elems(DType t) {
  switch (t) {
    case DType::kQ8_0: case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1: return kQK;
    case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: return kQKK;
    default: return 1;
  }
}

int64_t block_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kQ2_K: return 84;
    case DType::kQ3_K: return 110;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    default: return 0;
  }
}

void quantize_row(DType t, const float* x, int64_t n, uint8_t* out) {
  const int64_t nb = n / block_elems(t);
  switch (t) {
    case DType::kF32: std::memcpy(out, x, static_cast<size_t>(n) * 4); break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = bf16_of(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DType::kQ8_0: q8_0(x, nb, out); break;
    case DType::kQ4_0: q4_0(x, nb, out); break;
    case DType::kQ4_1: q4_1(x, nb, out); break;
    case DType::kQ5_0: q5_0(x, nb, out); break;
    case DType::kQ5_1: q5_1(x, nb, out); break;
    case DType::kQ2_K: q2_k(x, nb, out); break;
    case DType::kQ3_K: q3_k(x, nb, out); break;
    case DType::kQ4_K: q4_k(x, nb, out); break;
    case DType::kQ5_K: q5_k(x, nb, out); break;
    case DType::kQ6_K: q6_k(x, nb, out); break;
    default: break;
  }
}

}  // namespace klein::ggml_quant
