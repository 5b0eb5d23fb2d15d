#include "core/dtype.h"

#include <cmath>

namespace klein {

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // subnormal or zero in half
    float a;
    std::memcpy(&a, &absu, 4);
    // a * 2^24 rounded to nearest even integer = half subnormal mantissa
    float m = std::nearbyint(a * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  uint32_t mant_odd = (absu >> 13) & 1u;
  absu += 0xfffu + mant_odd;
  absu -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (absu >> 13));
}

float f8e4m3_to_f32(uint8_t v) {
  // E4M3FN: bias 7, no infinities, 0x7f/0xff are NaN.
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, mant = v & 7;
  float r;
  if (exp == 0xf && mant == 7) return std::nanf("");
  if (exp == 0) r = std::ldexp(static_cast<float>(mant), -9);
  else r = std::ldexp(1.0f + mant / 8.0f, static_cast<int>(exp) - 7);
  return sign ? -r : r;
}

float f8e5m2_to_f32(uint8_t v) {
  // E5M2 is the top byte of an IEEE half: the same exponent width and bias.
  return f16_to_f32(static_cast<uint16_t>(v) << 8);
}

}  // namespace klein
