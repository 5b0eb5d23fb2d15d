// Helpers of the tests that run the transformer on a reference's inputs (.npy files written by the
// oracle scripts): reading an array with a test failure on error, and position ids as Flux2Ids.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <utility>

#include "io/npy.h"
#include "models/flux2_dit.h"

namespace klein::testing {

// The array at `p`; an empty one (and a failed expectation naming the file) when it does not read.
inline NpyArray must_read_npy(const std::filesystem::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << p << ": " << r.status().to_string();
  return r.ok() ? std::move(*r) : NpyArray{};
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
