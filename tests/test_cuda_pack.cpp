// The CUDA backend's host-side weight packing (src/backend/cuda/pack.h), checked against the CPU's
// own dequantisation (weight_to_f32, which the CPU's fp32 kernels compute from): plain C++ with
// no CUDA in it, so it runs in every build. What it must give: f32 targets equal to the CPU's
// f32 values bit for bit (so the CUDA fp32 path multiplies the same weights as the CPU), bf16
// targets equal to those values rounded to nearest even, and stored bf16 copied untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/pack.h"
#include "core/quantize.h"

namespace klein {
namespace {

namespace cp = cuda_pack;

std::vector<float> randv(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A weight over caller-owned storage.
struct Owned {
  std::vector<uint8_t> data, scales, offsets;
  Weight w;
};

Owned plain(DType dt, const Shape& shape, const std::vector<float>& v) {
  Owned o;
  o.w.name = "test.weight";
  o.w.dtype = dt;
  o.w.shape = shape;
  const size_t es = dtype_size(dt);
  o.data.resize(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kF32) std::memcpy(&o.data[i * 4], &v[i], 4);
    if (dt == DType::kBF16) {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(&o.data[i * 2], &h, 2);
    }
    if (dt == DType::kF16) {
      const uint16_t h = f32_to_f16(v[i]);
      std::memcpy(&o.data[i * 2], &h, 2);
    }
  }
  o.w.data = o.data.data();
  o.w.nbytes = o.data.size();
  return o;
}

Owned q8(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Owned o;
  o.w.name = "q8.weight";
  o.w.dtype = DType::kQ8Row;
  o.w.shape = {rows, cols};
  o.data.resize(rows * cols);
  o.scales.resize(rows * 4);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = quantize_row_q8(v.data() + r * cols, cols, reinterpret_cast<int8_t*>(o.data.data() + r * cols));
    std::memcpy(&o.scales[r * 4], &s, 4);
  }
  o.w.data = o.data.data();
  o.w.nbytes = o.data.size();
  o.w.scales = o.scales.data();
  o.w.scale_dtype = DType::kF32;
  return o;
}

// MLX's Q4_G64 with bf16 scales and biases, as `klein quantize --type q4` writes it.
Owned q4(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Owned o;
  o.w.name = "q4.weight";
  o.w.dtype = DType::kQ4G64;
  o.w.shape = {rows, cols};
  const int64_t groups = cols / 64;
  o.data.resize(rows * cols / 2);
  o.scales.resize(rows * groups * 2);
  o.offsets.resize(rows * groups * 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0, b = 0;
      quantize_group_q4(v.data() + r * cols + g * 64, o.data.data() + (r * groups + g) * 32, &s, &b);
      const uint16_t sh = f32_to_bf16(s), bh = f32_to_bf16(b);
      std::memcpy(&o.scales[(r * groups + g) * 2], &sh, 2);
      std::memcpy(&o.offsets[(r * groups + g) * 2], &bh, 2);
    }
  o.w.data = o.data.data();
  o.w.nbytes = o.data.size();
  o.w.scales = o.scales.data();
  o.w.offsets = o.offsets.data();
  o.w.scale_dtype = DType::kBF16;
  return o;
}

std::vector<float> cpu_f32(const Weight& w) {
  std::vector<float> r(w.numel());
  weight_to_f32(w, 0, w.numel(), r.data());
  return r;
}

// Packs all of w as t, in chunks of `per` rows (the backend's staging), optionally on a pool.
std::vector<uint8_t> pack_all(const Weight& w, cp::Target t, int64_t per, ThreadPool* pool = nullptr) {
  std::vector<uint8_t> out(cp::packed_bytes(w, t));
  const int64_t rows = w.rows(), row_bytes = w.cols() * cp::target_size(t);
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t r1 = std::min(rows, r0 + per);
    const Status s = cp::pack_rows(w, r0, r1, t, out.data() + r0 * row_bytes, pool);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  return out;
}

void expect_matches_cpu(const Weight& w, int64_t per, ThreadPool* pool = nullptr) {
  SCOPED_TRACE(std::string(dtype_name(w.dtype)) + " in chunks of " + std::to_string(per) + " rows");
  const std::vector<float> ref = cpu_f32(w);
  const auto f = pack_all(w, cp::Target::kF32, per, pool);
  const auto b = pack_all(w, cp::Target::kBF16, per, pool);
  for (size_t i = 0; i < ref.size(); ++i) {
    float got;
    std::memcpy(&got, &f[i * 4], 4);
    ASSERT_EQ(std::memcmp(&got, &ref[i], 4), 0) << "f32 at " << i << ": " << got << " vs " << ref[i];
    uint16_t h;
    std::memcpy(&h, &b[i * 2], 2);
    ASSERT_EQ(h, f32_to_bf16(ref[i])) << "bf16 at " << i;
  }
}

TEST(CudaPack, EveryFormatMatchesTheCpuDequantisation) {
  const int64_t R = 7, C = 192;  // three Q4 groups per row
  const auto v = randv(R * C, 1);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Owned o = plain(dt, {R, C}, v);
    for (int64_t per : {int64_t{1}, int64_t{3}, R}) expect_matches_cpu(o.w, per);
  }
  Owned a = q8(R, C, v), b = q4(R, C, v);
  for (int64_t per : {int64_t{1}, int64_t{4}, R}) {
    expect_matches_cpu(a.w, per);
    expect_matches_cpu(b.w, per);
  }
}

TEST(CudaPack, StoredBf16IsCopiedBitForBit) {
  const auto v = randv(5 * 9, 2);
  Owned o = plain(DType::kBF16, {5, 9}, v);
  const auto b = pack_all(o.w, cp::Target::kBF16, 2);
  EXPECT_EQ(b, o.data);
  // A conv kernel [Cout, Cin, kh, kw] is rows of Cin·kh·kw: the GEMM's matrix as it is stored.
  Owned c = plain(DType::kF32, {4, 3, 3, 3}, randv(4 * 27, 3));
  EXPECT_EQ(c.w.cols(), 27);
  EXPECT_EQ(pack_all(c.w, cp::Target::kF32, 3), c.data);
}

TEST(CudaPack, ParallelPackingEqualsSerial) {
  // Over a million values, so pack_rows splits the rows over the pool.
  const int64_t R = 300, C = 4096;
  Owned o = q8(R, C, randv(R * C, 4));
  ThreadPool pool(4);
  const auto serial = pack_all(o.w, cp::Target::kBF16, R);
  EXPECT_EQ(pack_all(o.w, cp::Target::kBF16, R, &pool), serial);
  EXPECT_EQ(pack_all(o.w, cp::Target::kBF16, 77, &pool), serial);
}

TEST(CudaPack, TargetsSizesAndChunks) {
  Owned vec = plain(DType::kBF16, {16}, randv(16, 5));
  Owned mat = plain(DType::kBF16, {16, 8}, randv(128, 6));
  Owned conv = plain(DType::kF32, {2, 2, 3, 3}, randv(36, 7));
  // Biases and norms stay f32 (exact epilogues); matrices are bf16 only when asked.
  EXPECT_EQ(cp::target_for(vec.w, true), cp::Target::kF32);
  EXPECT_EQ(cp::target_for(mat.w, true), cp::Target::kBF16);
  EXPECT_EQ(cp::target_for(conv.w, true), cp::Target::kBF16);
  EXPECT_EQ(cp::target_for(mat.w, false), cp::Target::kF32);
  EXPECT_EQ(cp::packed_bytes(mat.w, cp::Target::kBF16), 256);
  EXPECT_EQ(cp::packed_bytes(conv.w, cp::Target::kF32), 144);
  EXPECT_EQ(cp::target_dtype(cp::Target::kBF16), DType::kBF16);
  EXPECT_EQ(cp::rows_per_chunk(mat.w, cp::Target::kF32, 100), 3);  // 32-byte rows
  EXPECT_EQ(cp::rows_per_chunk(mat.w, cp::Target::kF32, 1), 1);    // never zero
  // A 1-D tensor packs as one value per row.
  std::vector<float> out(16);
  ASSERT_TRUE(cp::pack_rows(vec.w, 0, 16, cp::Target::kF32, out.data()).ok());
  EXPECT_EQ(out, cpu_f32(vec.w));
}

TEST(CudaPack, WhatCannotBePackedIsAStatusNamingTheTensor) {
  Owned o = plain(DType::kF32, {4, 4}, randv(16, 8));
  std::vector<uint8_t> out(64);
  Status s = cp::pack_rows(o.w, 2, 5, cp::Target::kF32, out.data());  // rows past the end
  EXPECT_EQ(s.code(), Code::kInternal);
  EXPECT_NE(s.message().find("test.weight"), std::string::npos) << s.message();
  EXPECT_TRUE(cp::pack_rows(o.w, 2, 2, cp::Target::kF32, nullptr).ok());  // nothing to do

  Weight packed = o.w;
  packed.layout = Layout::kPacked;
  EXPECT_EQ(cp::check_packable(packed).code(), Code::kInternal);
  Weight dev = o.w;
  dev.device = Device::kCuda;
  EXPECT_EQ(cp::check_packable(dev).code(), Code::kInternal);
  Weight ints = o.w;  // raw int32 values are not a weight format the kernels compute with
  ints.dtype = DType::kI32;
  s = cp::check_packable(ints);
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_NE(s.message().find("test.weight"), std::string::npos) << s.message();
  Weight short_data = o.w;
  short_data.nbytes = 10;
  EXPECT_FALSE(cp::check_packable(short_data).ok());
}

}  // namespace
}  // namespace klein
