#include "core/dtype.h"

#include <cmath>

namespace klein {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kQ8Row: return "Q8_ROW";
    case DType::kQ4G64: return "Q4_G64";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kI8: case DType::kU8: case DType::kBool: case DType::kF8E4M3: return 1;
    case DType::kQ8Row: case DType::kQ4G64: return 0;
  }
  return 0;
}

bool dtype_from_safetensors(std::string_view s, DType* out) {
  struct Entry { std::string_view name; DType t; };
  static constexpr Entry kTable[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16},   {"BF16", DType::kBF16},
      {"F64", DType::kF64}, {"I8", DType::kI8},     {"U8", DType::kU8},
      {"I16", DType::kI16}, {"I32", DType::kI32},   {"I64", DType::kI64},
      {"BOOL", DType::kBool}, {"F8_E4M3", DType::kF8E4M3},
  };
  for (const auto& e : kTable) {
    if (e.name == s) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

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

}  // namespace klein
