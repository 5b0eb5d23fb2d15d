// Helpers of the tests that run the transformer on a reference's inputs (.npy files written by the
// oracle scripts): reading an array with a test failure on error, and position ids as Flux2Ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include "io/npy.h"
#include "models/flux2_dit.h"

namespace klein::testing {

// The array at `p`; an empty one (and a failed expectation naming the file) when it does not read.
inline NpyArray must_read_npy(const std::filesystem::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << p << ": " << r.status().to_string();
  return r.ok() ? std::move(*r) : NpyArray{};
}

// The array at `p` as float32 (empty, with a failed expectation, when it does not read).
inline std::vector<float> must_read_f32(const std::filesystem::path& p) { return must_read_npy(p).to_f32(); }

// max |a - b| / max |b|: the relative error the reference tests bound. Arrays of different sizes,
// or empty ones (an unread file), give 1e30, so a missing dump fails the bound instead of passing it.
inline double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 1e30;
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::fabs(b[i])));
  }
  return m > 0 ? d / m : d;
}

// The share of equal bytes of two 8-bit pictures and their largest difference ({0, 255} when the
// sizes differ or nothing was read, so a missing picture fails the bounds).
inline std::pair<double, int> u8_agreement(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size() || a.empty()) return {0.0, 255};
  size_t diff = 0;
  int maxd = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int d = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    diff += d != 0;
    maxd = std::max(maxd, d);
  }
  return {1.0 - static_cast<double>(diff) / a.size(), maxd};
}

// An [n, 4] integer array (diffusers' img_ids / txt_ids) as position ids.
inline Flux2Ids flux2_ids_of(const NpyArray& a) {
  const auto v = a.to_i64();
  Flux2Ids ids(v.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int k = 0; k < 4; ++k) ids[i][k] = v[4 * i + k];
  return ids;
}

}  // namespace klein::testing
