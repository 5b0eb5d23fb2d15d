// Checked integer arithmetic for sizes that come from files and configs (shapes, dimensions,
// offsets, products). A file may claim any number: every size computed from one goes through
// these, so an overflow is a named error instead of undefined behaviour or a wrapped size.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/status.h"

namespace klein {

// false (and *out untouched) when a*b or a+b does not fit in int64.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// a*b, or a format error "<where>: <what> (a x b) overflows".
inline Result<int64_t> checked_mul(int64_t a, int64_t b, const std::string& where, const std::string& what) {
  int64_t r = 0;
  if (!checked_mul(a, b, &r))
    return format_error(where + ": " + what + " (" + std::to_string(a) + " x " + std::to_string(b) +
                        ") is too large");
  return r;
}
inline Result<int64_t> checked_add(int64_t a, int64_t b, const std::string& where, const std::string& what) {
  int64_t r = 0;
  if (!checked_add(a, b, &r))
    return format_error(where + ": " + what + " (" + std::to_string(a) + " + " + std::to_string(b) +
                        ") is too large");
  return r;
}

// The product of non-negative dimensions, or false on a negative entry or an overflow.
inline bool checked_numel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || !checked_mul(n, d, &n)) return false;
  *out = n;
  return true;
}

// A double truncated to int64 as Python's int() does, or false when it is NaN or out of range
// (the cast itself would be undefined behaviour).
inline bool checked_trunc(double v, int64_t* out) {
  if (!std::isfinite(v) || v >= 9223372036854775808.0 || v < -9223372036854775808.0) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

// The largest dimension a config may give (a width, a head count, a channel count): products of
// two such values fit in int64 with room, and nothing real comes near it.
inline constexpr int64_t kMaxConfigDim = int64_t{1} << 31;

}  // namespace klein
