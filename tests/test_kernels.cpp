// Kernel tests: the scalar references against hand-computed values, then the kernels selected for
// every ISA this CPU has (KernelSet::select with that ISA as the ceiling; an ISA without kernels
// of its own runs the next lower ones) against the references over many shapes, dtypes, strides
// and masks; and the ISA table / kernel registry themselves.
//
// Tolerances: references accumulate in double, fast paths in float32 with a different summation
// order, so we bound  max|fast - ref| ≤ 1e-5 · max(1, max|ref|)  — a few float ulps scaled by the
// output magnitude (inputs are O(1), K ≤ 300, so the true float error is ~1e-6 relative).
// Precision::kFast kernels are compared against the reference of their own arithmetic: the bf16
// GEMM against ref::linear_bf16 (the same bf16-rounded operands, double sums), so only float32
// summation error remains and the same bound applies; the int8 W8A8 GEMMs against
// ref::linear_w8a8 EXACTLY (integer sums, then the same float32 rescale steps).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/ggml_dot.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "kernels/scratch.h"
#include "testing.h"

namespace klein {
namespace {

// A Weight plus the storage it points to.
struct OwnedWeight {
  Weight w;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<int8_t> i8;
  std::vector<float> scales;
  std::vector<float> offsets;
};

// [rows, cols] weight of the given dtype with values from `vals` (rounded to that dtype).
OwnedWeight make_weight(DType dt, int64_t rows, int64_t cols, const std::vector<float>& vals) {
  OwnedWeight o;
  o.w.name = "test.weight";
  o.w.dtype = dt;
  o.w.shape = cols > 0 ? Shape{rows, cols} : Shape{rows};
  const int64_t n = static_cast<int64_t>(vals.size());
  if (dt == DType::kF32) {
    o.f32 = vals;
    o.w.data = o.f32.data();
  } else if (dt == DType::kBF16 || dt == DType::kF16) {
    o.u16.resize(n);
    for (int64_t i = 0; i < n; ++i)
      o.u16[i] = dt == DType::kBF16 ? f32_to_bf16(vals[i]) : f32_to_f16(vals[i]);
    o.w.data = o.u16.data();
  } else if (dt == DType::kQ8Row) {
    o.i8.resize(n);
    o.scales.resize(rows);
    for (int64_t r = 0; r < rows; ++r) {
      float mx = 1e-8f;
      for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, std::fabs(vals[r * cols + c]));
      o.scales[r] = mx / 127.0f;
      for (int64_t c = 0; c < cols; ++c)
        o.i8[r * cols + c] = static_cast<int8_t>(std::lround(vals[r * cols + c] / o.scales[r]));
    }
    o.w.data = o.i8.data();
    o.w.scales = o.scales.data();
  }
  return o;
}

std::vector<float> random_vec(int64_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// [rows, cols] weight of any format the kernels compute with, random O(1) values: through
// make_weight where it can quantize, else random payload bytes (F8_E4M3 with the top exponent
// bit clear: |v| < 2, never NaN, and F8_E4M3_SCALED so with one random scale; Q4_G64 nibbles and
// Q8_G64 bytes with random scales and offsets; ggml blocks with finite fp16 scales).
OwnedWeight random_weight(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  const bool f8 = dt == DType::kF8E4M3 || dt == DType::kF8E4M3Scaled;
  const bool ggml = format_traits(dt).scales == ScalePlace::kInBlock;  // random bytes, valid fp16 scales
  const bool mlx = dt == DType::kQ4G64 || dt == DType::kQ8G64;  // codes + a scale and offset per 64
  if (!f8 && !mlx && !ggml) return make_weight(dt, rows, cols, random_vec(rows * cols, rng));
  OwnedWeight o;
  o.w.name = "test.weight";
  o.w.dtype = dt;
  o.w.shape = {rows, cols};
  o.i8.resize(rows * format_row_bytes(dt, cols));
  for (auto& b : o.i8) b = static_cast<int8_t>(rng() & (f8 ? 0xbf : 0xff));
  o.w.data = o.i8.data();
  o.w.nbytes = o.i8.size();
  testing::make_ggml_blocks_valid(dt, o.i8.data(), o.i8.size(), static_cast<unsigned>(rng()));
  if (mlx) {
    o.scales = random_vec(rows * cols / 64, rng, 0.01f, 0.2f);
    o.offsets = random_vec(rows * cols / 64, rng);
    o.w.scales = o.scales.data();
    o.w.offsets = o.offsets.data();
  } else if (dt == DType::kF8E4M3Scaled) {
    o.scales = random_vec(1, rng, 0.01f, 0.2f);
    o.w.scales = o.scales.data();
  }
  return o;
}

// max|a - b| over the valid [rows, cols] part of two row-strided buffers, and max|b|.
void compare(const float* a, const float* b, int64_t rows, int64_t cols, int64_t ld, float* err,
             float* mag) {
  *err = 0;
  *mag = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = a[r * ld + c], y = b[r * ld + c];
      *err = std::isnan(x) ? INFINITY : std::max(*err, std::fabs(x - y));
      *mag = std::max(*mag, std::fabs(y));
    }
}

TEST(KernelsRef, LinearHandComputed) {
  // x = [[1, 2], [3, 4]], W = [[1, 0], [0, 1], [1, 1]], bias = [0.5, 0, -1]
  const std::vector<float> x = {1, 2, 3, 4};
  auto W = make_weight(DType::kF32, 3, 2, {1, 0, 0, 1, 1, 1});
  auto b = make_weight(DType::kF32, 3, 0, {0.5f, 0, -1});
  std::vector<float> y(6);
  kernels::ref::linear(x.data(), 2, 2, W.w, &b.w, y.data());
  EXPECT_EQ(y, (std::vector<float>{1.5f, 2, 2, 3.5f, 4, 6}));
}

TEST(KernelsRef, AttentionHandComputed) {
  // One head, D = 2: q = k = identity rows, v = [[1, 2], [3, 4]], scale 1.
  const std::vector<float> q = {1, 0, 0, 1}, k = {1, 0, 0, 1}, v = {1, 2, 3, 4};
  const float e = std::exp(1.0f);
  std::vector<float> out(4);
  kernels::ref::attention(q.data(), k.data(), v.data(), out.data(), 2, 2, 1, 1, 2, 1.0f, {});
  // Row 0 scores [1, 0] → weights [e, 1]/(e+1); row 1 scores [0, 1] → [1, e]/(e+1).
  const float w0 = e / (e + 1), w1 = 1 / (e + 1);
  EXPECT_NEAR(out[0], w0 * 1 + w1 * 3, 1e-6);
  EXPECT_NEAR(out[1], w0 * 2 + w1 * 4, 1e-6);
  EXPECT_NEAR(out[2], w1 * 1 + w0 * 3, 1e-6);
  EXPECT_NEAR(out[3], w1 * 2 + w0 * 4, 1e-6);
  // Causal: row 0 sees only key 0.
  kernels::ref::attention(q.data(), k.data(), v.data(), out.data(), 2, 2, 1, 1, 2, 1.0f,
                          {.causal = true});
  EXPECT_FLOAT_EQ(out[0], 1);
  EXPECT_FLOAT_EQ(out[1], 2);
  EXPECT_NEAR(out[2], w1 * 1 + w0 * 3, 1e-6);
  // key 0 invalid and causal: row 0 sees nothing → zeros; row 1 sees only key 1.
  const uint8_t valid[2] = {0, 1};
  kernels::ref::attention(q.data(), k.data(), v.data(), out.data(), 2, 2, 1, 1, 2, 1.0f,
                          {.causal = true, .key_valid = valid});
  EXPECT_EQ(out, (std::vector<float>{0, 0, 3, 4}));
}

// The kernel tests, once per ISA of this CPU (test names end in the ISA: Kernels.LinearMatchesRef/avx2).
class Kernels : public ::testing::TestWithParam<Isa> {
 protected:
  const kernels::KernelSet set = kernels::KernelSet::select(CpuFeatures::host(), GetParam());
  const kernels::KernelSet fast =
      kernels::KernelSet::select(CpuFeatures::host(), GetParam(), kernels::Precision::kFast);
};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); }

INSTANTIATE_TEST_SUITE_P(Isa, Kernels, ::testing::ValuesIn(CpuFeatures::host().isas()), isa_param_name);

void check_linear(const kernels::KernelSet& set, DType dt, int64_t M, int64_t N, int64_t K, bool bias,
                  int64_t pad, ThreadPool& pool, std::mt19937& rng) {
  const int64_t ldx = K + pad, ldy = N + 2 * pad;
  const auto x = random_vec(M * ldx, rng);
  auto W = random_weight(dt, N, K, rng);
  auto B = make_weight(DType::kBF16, N, 0, random_vec(N, rng));
  std::vector<float> y(M * ldy, 7.0f), yr(M * ldy, 7.0f);  // 7 = sentinel in the row padding
  kernels::run_linear(set, x.data(), M, K, W.w, bias ? &B.w : nullptr, y.data(), pool, pad ? ldx : 0,
                      pad ? ldy : 0);
  kernels::ref::linear(x.data(), M, K, W.w, bias ? &B.w : nullptr, yr.data(), pad ? ldx : 0,
                       pad ? ldy : 0);
  float err, mag;
  compare(y.data(), yr.data(), M, N, ldy, &err, &mag);
  ASSERT_LE(err, 1e-5f * std::max(1.0f, mag))
      << dtype_name(dt) << " M=" << M << " N=" << N << " K=" << K << " bias=" << bias
      << " pad=" << pad << " threads=" << pool.size() << " kernel=" << set.get(kernels::Op::kLinear, dt).name;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], 7.0f) << "wrote past row end";
}

TEST_P(Kernels, LinearMatchesRef) {
  std::mt19937 rng(1234);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t M : {1, 3, 7, 64, 130})
      for (int64_t N : {1, 5, 16, 33, 100})
        for (int64_t K : {1, 7, 64, 300}) {
          const bool bias = (M + N + K) % 2 == 0;
          check_linear(set, dt, M, N, K, bias, 0, pool2, rng);
          check_linear(set, dt, M, N, K, !bias, 3, pool2, rng);
        }
  for (ThreadPool* p : {&pool1, &pool3})
    for (int64_t M : {1, 4, 5, 130})
      for (int64_t N : {33, 100}) check_linear(set, DType::kBF16, M, N, 300, true, 1, *p, rng);
}

TEST_P(Kernels, LinearLargeShapes) {
  // Crosses the K-slice (256) and N-slab (256) blocking and both thread-split strategies.
  std::mt19937 rng(99);
  ThreadPool pool(2);
  check_linear(set, DType::kBF16, 37, 530, 700, true, 0, pool, rng);
  check_linear(set, DType::kF16, 200, 40, 520, false, 5, pool, rng);
  check_linear(set, DType::kF32, 13, 260, 257, true, 0, pool, rng);
}

TEST_P(Kernels, LinearQuantizedFallback) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (int64_t M : {1, 9, 70}) check_linear(set, DType::kQ8Row, M, 50, 128, true, 2, pool, rng);
}

TEST_P(Kernels, LinearEveryWeightFormat) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  for (const FormatTraits& f : format_table()) {
    if (!f.is_weight) continue;
    for (int64_t M : {1, 5, 40})
      for (int64_t K : {64, 320, 512}) {
        if (K % f.block_elems) continue;  // ggml's K-quants: super-blocks of 256
        check_linear(set, f.id, M, 37, K, M != 5, M == 40 ? 3 : 0, pool, rng);
      }
  }
}

// Under Precision::kFast: the chosen kernel against the reference of its arithmetic (see top).
void check_linear_fast(const kernels::KernelSet& set, DType dt, int64_t M, int64_t N, int64_t K, bool bias,
                       int64_t pad, ThreadPool& pool, std::mt19937& rng, const OwnedWeight* given = nullptr,
                       const std::vector<float>* given_x = nullptr) {
  const int64_t ldx = K + pad, ldy = N + 2 * pad;
  const auto x = given_x ? *given_x : random_vec(M * ldx, rng);
  const OwnedWeight W = given ? *given : random_weight(dt, N, K, rng);
  auto B = make_weight(DType::kBF16, N, 0, random_vec(N, rng));
  std::vector<float> y(M * ldy, 7.0f), yr(M * ldy, 7.0f);
  const kernels::KernelEntry& e = set.get(kernels::Op::kLinear, dt);
  kernels::run_linear(set, x.data(), M, K, W.w, bias ? &B.w : nullptr, y.data(), pool, ldx, ldy);
  kernels::ggml_dot::Form gf;
  const bool ggml = e.fast && kernels::ggml_dot::form_of(dt, &gf);
  const bool w8a8 = (e.fast && dt == DType::kQ8Row) || ggml;  // both exact: integer sums, same float steps
  if (ggml)
    kernels::ref::linear_ggml(x.data(), M, K, W.w, bias ? &B.w : nullptr, yr.data(), ldx, ldy);
  else if (w8a8)
    kernels::ref::linear_w8a8(x.data(), M, K, W.w, bias ? &B.w : nullptr, yr.data(), ldx, ldy);
  else if (e.fast && dt == DType::kQ4G64)
    kernels::ref::linear_w4a8(x.data(), M, K, W.w, bias ? &B.w : nullptr, yr.data(), ldx, ldy);
  else if (e.fast)
    kernels::ref::linear_bf16(x.data(), M, K, W.w, bias ? &B.w : nullptr, yr.data(), ldx, ldy);
  else
    kernels::ref::linear(x.data(), M, K, W.w, bias ? &B.w : nullptr, yr.data(), ldx, ldy);
  const auto what = [&] {
    return std::string(dtype_name(dt)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
           " K=" + std::to_string(K) + " bias=" + std::to_string(bias) + " threads=" +
           std::to_string(pool.size()) + " kernel=" + std::string(e.name);
  };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n)
      if (w8a8)  // bit-exact: same int32 sums, same float32 steps
        ASSERT_EQ(std::bit_cast<uint32_t>(y[m * ldy + n]), std::bit_cast<uint32_t>(yr[m * ldy + n]))
            << what() << " at " << m << "," << n << ": " << y[m * ldy + n] << " vs " << yr[m * ldy + n];
    for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], 7.0f) << "wrote past row end " << what();
  }
  if (!w8a8) {
    float err, mag;
    compare(y.data(), yr.data(), M, N, ldy, &err, &mag);
    ASSERT_LE(err, 1e-5f * std::max(1.0f, mag)) << what();
  }
}

TEST(KernelsRef, QuantizeRowInt8RoundsHalfToEven) {
  // amax = 127 → s = 1 exactly, so q = rne(x): ties go to the even integer.
  const std::vector<float> x = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.4999f, -127.0f};
  std::vector<int8_t> q(x.size());
  float s = -1;
  kernels::ref::quantize_row_int8(x.data(), static_cast<int64_t>(x.size()), q.data(), &s);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, 2, 4, -2, -4, 0, 0, 1, -127}));
  // An all-zero row: scale 0, zeros (no division by zero).
  const std::vector<float> z(5, 0.0f);
  std::vector<int8_t> qz(5, 9);
  kernels::ref::quantize_row_int8(z.data(), 5, qz.data(), &s);
  EXPECT_EQ(s, 0.0f);
  EXPECT_EQ(qz, std::vector<int8_t>(5, 0));
  // s = amax / 127 in float32; q = rne(x / s) in float32.
  const std::vector<float> r = {0.3f, -1.7f, 0.011f};
  std::vector<int8_t> qr(3);
  kernels::ref::quantize_row_int8(r.data(), 3, qr.data(), &s);
  EXPECT_EQ(s, 1.7f / 127.0f);
  EXPECT_EQ(qr[0], static_cast<int8_t>(std::nearbyint(0.3f / s)));
  EXPECT_EQ(qr[1], -127);
  EXPECT_EQ(qr[2], 1);  // 0.011 / 0.013386 = 0.82 → 1
}

TEST(KernelsRef, QuantizeRowInt8NonFinite) {
  // A NaN anywhere gives s = NaN, else a ±inf s = +inf; q = 0 for both (kernels.h).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<int8_t> q(4, 9);
  float s = 0;
  for (const std::vector<float>& x : {std::vector<float>{nan, 1, 2, 3}, {1, 2, nan, -inf}, {-inf, 1, 2, nan}}) {
    std::fill(q.begin(), q.end(), 9);
    kernels::ref::quantize_row_int8(x.data(), 4, q.data(), &s);
    EXPECT_TRUE(std::isnan(s)) << x[0] << " " << x[1] << " " << x[2] << " " << x[3];
    EXPECT_EQ(q, std::vector<int8_t>(4, 0));
  }
  const std::vector<float> xi = {1, -inf, 2, inf};
  kernels::ref::quantize_row_int8(xi.data(), 4, q.data(), &s);
  EXPECT_EQ(s, inf);
  EXPECT_EQ(q, std::vector<int8_t>(4, 0));
}

TEST(KernelsRef, W8A8HandComputed) {
  // x row [127, -63.5] → s = 1, q = [127, -64 (−63.5 → even)]; W = [[1, 2], [-128, 127]], scales [0.5, 1].
  const std::vector<float> x = {127.0f, -63.5f};
  OwnedWeight W;
  W.i8 = {1, 2, -128, 127};
  W.scales = {0.5f, 1.0f};
  W.w.name = "w";
  W.w.dtype = DType::kQ8Row;
  W.w.shape = {2, 2};
  W.w.data = W.i8.data();
  W.w.scales = W.scales.data();
  std::vector<int8_t> q(2);
  float s;
  kernels::ref::quantize_row_int8(x.data(), 2, q.data(), &s);
  EXPECT_EQ(q, (std::vector<int8_t>{127, -64}));
  std::vector<int32_t> acc(2);
  kernels::ref::int8_accumulators(q.data(), 1, 2, W.w, acc.data());
  EXPECT_EQ(acc, (std::vector<int32_t>{127 - 128, -128 * 127 - 64 * 127}));
  std::vector<float> y(2);
  kernels::ref::linear_w8a8(x.data(), 1, 2, W.w, nullptr, y.data());
  EXPECT_EQ(y[0], (static_cast<float>(acc[0]) * s) * 0.5f);
  EXPECT_EQ(y[1], (static_cast<float>(acc[1]) * s) * 1.0f);
}

TEST_P(Kernels, LinearFastMatchesItsRef) {
  std::mt19937 rng(77);
  ThreadPool pool2(2), pool3(3);
  for (const FormatTraits& f : format_table()) {
    if (!f.is_weight) continue;
    for (int64_t M : {1, 5, 14, 29, 130})
      for (int64_t N : {1, 17, 33, 100})
        for (int64_t K : {64, 300, 517}) {
          if (K % f.block_elems) continue;
          check_linear_fast(fast, f.id, M, N, K, (M + N) % 2 == 0, (M + K) % 3, pool2, rng);
        }
  }
  for (DType dt : {DType::kQ8Row, DType::kBF16, DType::kF32})
    for (int64_t K : {1, 3, 4, 7, 9}) check_linear_fast(fast, dt, 20, 40, K, true, 1, pool3, rng);
}

TEST_P(Kernels, LinearRowStridesOfWholeCacheSets) {
  // Activation rows a multiple of 2 KB apart (ldx = 512 or 1024 floats, also with K < ldx), and
  // under kFast K = 2048 / 4096: the AVX-512 GEMMs then copy the slivers or the weight slab to a
  // stride of one more cache line (gemm_avx512_common.h, gemm_direct.h) or pad the rows of
  // their bf16 copy of x (gemm_avx512bf16.cpp). The copies must hold exactly the same operands.
  std::mt19937 rng(17);
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    check_linear(set, dt, 45, 70, 512, true, 0, pool, rng);
    check_linear(set, dt, 31, 40, 1000, false, 24, pool, rng);  // ldx = 1024
  }
  for (DType dt : {DType::kQ8Row, DType::kBF16, DType::kF32})
    for (int64_t K : {2048, 4096}) check_linear_fast(fast, dt, 45, 70, K, K == 2048, 0, pool, rng);
  check_linear_fast(fast, DType::kQ8Row, 40, 50, 4000, true, 96, pool, rng);  // ldx = 4096
}

TEST_P(Kernels, LinearFastLargeShapes) {
  // Crosses the K slices (512 int8 / 512 bf16 / 256 f32 per slice) and N slabs of the fast GEMMs.
  std::mt19937 rng(8);
  ThreadPool pool(2), pool1(1);
  check_linear_fast(fast, DType::kQ8Row, 45, 530, 1100, true, 0, pool, rng);
  check_linear_fast(fast, DType::kQ8Row, 200, 40, 1030, false, 3, pool, rng);
  // The AVX512_VNNI kernel's slabs of columns (L2 / 4 of weight rows: 48 at K = 9216 with a 2 MB
  // L2, so 48 + 48 + 48 + 6 here, each prefetching the next) and a partial 32-row block.
  check_linear_fast(fast, DType::kQ8Row, 200, 150, 9216, true, 1, pool, rng);
  check_linear_fast(fast, DType::kBF16, 37, 530, 1100, true, 0, pool, rng);
  // The AVX512_BF16 direct kernel's slabs at a long K: rows of 12 KB (a multiple of 2 KB: the
  // slab is copied to a spread stride), 12-row slabs, 13 of them, two 32-row blocks and a part.
  check_linear_fast(fast, DType::kBF16, 70, 150, 6144, true, 0, pool, rng);
  check_linear_fast(fast, DType::kQ4G64, 45, 530, 1088, true, 0, pool, rng);  // 17 groups: 3 K slices
  check_linear_fast(fast, DType::kQ4G64, 200, 40, 1024, false, 3, pool, rng);
  check_linear_fast(fast, DType::kF16, 200, 40, 521, false, 5, pool1, rng);
  // Float weights the bf16 GEMMs round and pair while packing, at an odd K (the last unit's high
  // half zero) and across several 16-unit groups of a slice.
  check_linear_fast(fast, DType::kBF16, 37, 70, 523, true, 0, pool, rng);
  check_linear_fast(fast, DType::kF32, 37, 70, 523, false, 3, pool, rng);
  check_linear_fast(fast, DType::kF32, 45, 40, 1100, true, 0, pool, rng);
}

TEST_P(Kernels, LinearScratchStaysWithinItsBound) {
  // Memory budgets count the kernels' scratch with scratch_bound_bytes (kernels/scratch.h).
  // Whatever a GEMM family grows must stay within it: here the scratch that threads (a fresh
  // pool's workers, and the caller) add while every linear format runs (plain and with the
  // fused SwiGLU), under both precisions,
  // at a K and N that cross the slices and slabs, and at an M whose copies of x outgrow the
  // per-thread part of the bound.
  std::mt19937 rng(31);
  uint64_t most = 0;
  const int64_t K = 3008;  // 47 groups of 64, 1504 int8 pairs
  for (const auto [M, N] : {std::pair<int64_t, int64_t>{100, 300}, {1000, 40}}) {
    const auto x = random_vec(M * K, rng);
    std::vector<float> y(M * N);
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8Row, DType::kQ4G64}) {
      const OwnedWeight W = random_weight(dt, N, K, rng);
      for (const kernels::KernelSet* ks : {&set, &fast}) {
        ThreadPool pool(3);
        const uint64_t before = kernels::scratch_bytes();
        kernels::run_linear(*ks, x.data(), M, K, W.w, nullptr, y.data(), pool, K, N);
        // And the same weight as the SwiGLU's [gate; up] (the fused forms split each slab in two).
        std::vector<float> out(M * N / 2);
        kernels::run_linear_swiglu(*ks, x.data(), M, K, W.w, nullptr, out.data(), y.data(), pool);
        const uint64_t grown = kernels::scratch_bytes() - before;
        kernels::ScratchShape shape;
        shape.max_k = K;
        shape.max_x = M * K;
        // The float32 and bf16 GEMMs read f32 / bf16 / f16 weights from storage (converting per
        // K slice while packing), the int8 ones q8 / q4 (memory_needs.cpp counts only the first).
        const bool fp32 = ks == &set;
        const bool plain = dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16 ||
                           (!fp32 && (dt == DType::kQ8Row || dt == DType::kQ4G64));
        shape.converts_weights = !plain;
        EXPECT_LE(grown, kernels::scratch_bound_bytes(shape, pool.size()))
            << M << "x" << K << " " << dtype_name(dt) << " " << ks->get(kernels::Op::kLinear, dt).name;
        most = std::max(most, grown);
      }
    }
  }
  // The SIMD GEMMs' fresh workers did grow scratch, so the check above saw real buffers (the
  // scalar reference kernels keep none).
  if (GetParam() != Isa::kScalar) EXPECT_GT(most, 0u);
}

// W's payload moved into `store` at `offset` bytes past a 64-byte boundary (W.w.data points there):
// 0 as klein's own writers place tensors, 16 as other safetensors may.
void place_at_line_offset(OwnedWeight& W, int offset, std::vector<uint8_t>& store) {
  const size_t bytes = static_cast<size_t>(W.w.rows() * format_row_bytes(W.w.dtype, W.w.cols()));
  store.assign(bytes + 128, 0);
  uint8_t* p = store.data() + (64 - reinterpret_cast<uintptr_t>(store.data()) % 64) % 64 + offset;
  std::memcpy(p, W.w.data, bytes);
  W.w.data = p;
}

TEST_P(Kernels, LinearFastWeightsAlignedAndNot) {
  // The weights where a model's mapped file has them: 64-byte aligned rows (klein's own writers;
  // the AMX GEMMs then read whole slabs in place) and 16 bytes off (other safetensors: copied per
  // slab). K long enough for several K chunks of the AMX GEMMs (128 tile steps of 64 bytes each
  // with a 2 MB L2, Q4 64 groups: Q8 10240 B, BF16 20480 B, Q4 160 groups per row), N = one full
  // 128-row slab and a 32-row rest, M a partial 32-row block. Every ISA must give its
  // reference's result.
  std::mt19937 rng(91);
  ThreadPool pool(2);
  const int64_t M = 70, N = 160, K = 10240;
  for (DType dt : {DType::kQ8Row, DType::kBF16, DType::kQ4G64})
    for (int offset : {0, 16}) {
      OwnedWeight W = random_weight(dt, N, K, rng);
      std::vector<uint8_t> store;
      place_at_line_offset(W, offset, store);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " offset " + std::to_string(offset));
      check_linear_fast(fast, dt, M, N, K, offset == 0, 0, pool, rng, &W);
    }
}

TEST_P(Kernels, LinearW8A8ExtremesAreExact) {
  // The AVX2 kernel's vpmaddubsw pairs are at their largest with |q| = 127 and w = -128 or 127:
  // 2 · 128 · 127 = 32512 must not saturate. Rows of ±amax give q = ±127; weights all -128 / 127.
  std::mt19937 rng(9);
  ThreadPool pool(2);
  const int64_t M = 19, N = 35, K = 260;
  OwnedWeight W;
  W.i8.resize(N * K);
  for (int64_t i = 0; i < N * K; ++i) W.i8[i] = (i / K) % 3 == 0 ? -128 : (i / K) % 3 == 1 ? 127 : (rng() % 2 ? -128 : 127);
  W.scales = random_vec(N, rng, 0.001f, 0.01f);
  W.w.name = "extreme.weight";
  W.w.dtype = DType::kQ8Row;
  W.w.shape = {N, K};
  W.w.data = W.i8.data();
  W.w.scales = W.scales.data();
  std::vector<float> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = (i / K) % 2 ? ((rng() % 2) ? 3.0f : -3.0f) : -3.0f;
  check_linear_fast(fast, DType::kQ8Row, M, N, K, true, 0, pool, rng, &W, &x);
  // And an all-zero row of x among the others (scale 0 → y = bias).
  std::fill(x.begin() + 3 * K, x.begin() + 4 * K, 0.0f);
  check_linear_fast(fast, DType::kQ8Row, M, N, K, true, 0, pool, rng, &W, &x);
}

TEST_P(Kernels, LinearBf16DenormalAndNaNInputs) {
  // Under kFast the bf16 GEMMs round x by vcvtne2ps2bf16 (avx512_convert.h), which takes a
  // denormal input as zero: as the dot products treat a denormal bf16, and f32_to_bf16 keeps it.
  // Denormals among normal values must give ref::linear_bf16's result, a row of denormals only
  // the bias exactly, and a NaN must stay in its own row (NaN there, every other row finite).
  std::mt19937 rng(31);
  ThreadPool pool(2);
  const int64_t M = 37, N = 70, K = 300;
  const float big_denormal = std::bit_cast<float>(0x007FFFFFu), small_denormal = std::bit_cast<float>(0x00000101u);
  std::vector<float> x = random_vec(M * K, rng);
  for (int64_t i = 0; i < M * K; i += 7) x[i] = (i / 7) % 2 ? big_denormal : -small_denormal;
  check_linear_fast(fast, DType::kBF16, M, N, K, true, 0, pool, rng, nullptr, &x);

  std::fill(x.begin() + 5 * K, x.begin() + 6 * K, -big_denormal);
  x[20 * K + 299] = std::numeric_limits<float>::quiet_NaN();
  const OwnedWeight W = random_weight(DType::kBF16, N, K, rng);
  const auto bias = random_vec(N, rng);
  auto B = make_weight(DType::kBF16, N, 0, bias);
  std::vector<float> y(M * N);
  kernels::run_linear(fast, x.data(), M, K, W.w, &B.w, y.data(), pool);
  const auto name = std::string(fast.get(kernels::Op::kLinear, DType::kBF16).name);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float v = y[m * N + n];
      if (m == 5)
        ASSERT_EQ(v, bf16_to_f32(f32_to_bf16(bias[n]))) << name << " denormal row, column " << n;
      else if (m == 20)
        ASSERT_TRUE(std::isnan(v)) << name << " NaN row, column " << n;
      else
        ASSERT_TRUE(std::isfinite(v)) << name << " row " << m << ", column " << n;
    }
}

TEST_P(Kernels, LinearNaNAndInfRowsStayNonFinite) {
  // Under kFast the Q8_ROW / Q4_G64 kernels quantize x per row (W8A8 / W4A8). A NaN in a row —
  // early in it, where a max over the later vectors dropped it, and it quantized to -127 — must
  // make that row's outputs NaN, a ±inf one non-finite, as a float GEMM's (kernels.h); every
  // other row stays finite and as the reference computes it.
  std::mt19937 rng(37);
  ThreadPool pool(2);
  const int64_t M = 23, N = 40, K = 320;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::kQ8Row, DType::kQ4G64}) {
    const kernels::KernelEntry& e = fast.get(kernels::Op::kLinear, dt);
    std::vector<float> x = random_vec(M * K, rng);
    x[7 * K + 5] = nan;
    x[15 * K + 9] = inf;
    x[18 * K + 300] = -inf;
    x[19 * K + 2] = nan;
    x[19 * K + 200] = inf;
    const OwnedWeight W = random_weight(dt, N, K, rng);
    auto B = make_weight(DType::kBF16, N, 0, random_vec(N, rng));
    std::vector<float> y(M * N), yr(M * N);
    kernels::run_linear(fast, x.data(), M, K, W.w, &B.w, y.data(), pool);
    if (e.fast && dt == DType::kQ8Row)
      kernels::ref::linear_w8a8(x.data(), M, K, W.w, &B.w, yr.data());
    else if (e.fast)
      kernels::ref::linear_w4a8(x.data(), M, K, W.w, &B.w, yr.data());
    else
      kernels::ref::linear(x.data(), M, K, W.w, &B.w, yr.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const float v = y[m * N + n];
        if (m == 7 || m == 19) {
          ASSERT_TRUE(std::isnan(v)) << e.name << " NaN row " << m << ", column " << n << ": " << v;
          ASSERT_TRUE(std::isnan(yr[m * N + n])) << "the reference, NaN row " << m;
        } else if (m == 15 || m == 18) {
          ASSERT_FALSE(std::isfinite(v)) << e.name << " inf row " << m << ", column " << n << ": " << v;
        } else {
          ASSERT_TRUE(std::isfinite(v)) << e.name << " row " << m << ", column " << n;
          ASSERT_NEAR(v, yr[m * N + n], 1e-5f * std::max(1.0f, std::fabs(yr[m * N + n]))) << e.name << " row " << m;
        }
      }
  }
}

TEST_P(Kernels, LinearSwigluEqualsLinearThenSiluMul) {
  // run_linear_swiglu (the DiT's feed-forward input: W = [gate; up]) against run_linear into
  // [M, 2F] followed by the set's element-wise silu_mul: bit for bit, by the fused kernels (AMX)
  // and by the fallback alike. Weights 64-byte aligned (the AMX GEMMs read gate and up rows in
  // place, 16 columns per tile pair) and 16 bytes off (a per-slab copy); F a multiple of 16 and
  // not (a copied last slab); K = 2048 rows a multiple of 2 KB (the direct driver copies them);
  // K = 10240 has several K chunks; an odd K (the bf16 direct driver declines it); M partial
  // 32-row blocks; strides.
  std::mt19937 rng(57);
  ThreadPool pool(2);
  struct Shape {
    int64_t M, F, K;
  };
  for (const kernels::KernelSet* ks : {&set, &fast})
    for (DType dt : {DType::kBF16, DType::kQ8Row, DType::kF32, DType::kQ4G64})
      for (Shape sh : {Shape{1, 1, 64}, Shape{31, 16, 256}, Shape{33, 70, 256}, Shape{70, 144, 320},
                       Shape{20, 40, 2048}, Shape{40, 48, 10240}, Shape{9, 30, 65}})
        for (int offset : {0, 16}) {
          if (sh.K % format_traits(dt).block_elems) continue;  // Q4_G64: whole groups of 64
          const int64_t M = sh.M, F = sh.F, K = sh.K, N = 2 * F, ldx = K + 3, ldo = F + 5;
          OwnedWeight W = random_weight(dt, N, K, rng);
          std::vector<uint8_t> store;
          place_at_line_offset(W, offset, store);
          const bool with_bias = (M + offset) % 2 == 1;
          auto B = make_weight(DType::kBF16, N, 0, random_vec(N, rng));
          const auto x = random_vec(M * ldx, rng);
          std::vector<float> u(M * N), want(M * ldo, 7.0f), got(M * ldo, 7.0f), scratch(M * N);
          kernels::run_linear(*ks, x.data(), M, K, W.w, with_bias ? &B.w : nullptr, u.data(), pool, ldx, N);
          for (int64_t m = 0; m < M; ++m)
            ks->eltwise().silu_mul(u.data() + m * N, u.data() + m * N + F, want.data() + m * ldo, F);
          kernels::run_linear_swiglu(*ks, x.data(), M, K, W.w, with_bias ? &B.w : nullptr, got.data(), scratch.data(),
                                     pool, ldx, ldo, N);
          const auto& e = ks->get(kernels::Op::kLinear, dt);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < ldo; ++j)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[m * ldo + j]), std::bit_cast<uint32_t>(want[m * ldo + j]))
                  << e.name << (e.linear_swiglu ? " (fused)" : " (fallback)") << " " << dtype_name(dt) << " M=" << M
                  << " F=" << F << " K=" << K << " offset " << offset << " at " << m << "," << j;
        }
}

TEST(KernelsRegistry, LinearSwigluRejectsAnOddRowCount) {
  const kernels::KernelSet ks = kernels::KernelSet::select(CpuFeatures::host(), CpuFeatures::host().isas().back(),
                                                           kernels::Precision::kFast);
  std::mt19937 rng(3);
  ThreadPool pool(1);
  const OwnedWeight W = random_weight(DType::kBF16, 5, 64, rng);
  std::vector<float> x(64, 1.0f), u(5), out(2);
  EXPECT_THROW(kernels::run_linear_swiglu(ks, x.data(), 1, 64, W.w, nullptr, out.data(), u.data(), pool),
               std::invalid_argument);
}

TEST_P(Kernels, LinearW8A8QuantizesNearTiesExactly) {
  // Activations whose quotients x / s lie at and beside q + 0.5 (the rounding boundary of q =
  // rne(x / s)), at several magnitudes: a kernel that forms x / s any other way than as the
  // float32 quotient (e.g. x · (1 / s) in float) rounds some of them the other way.
  std::mt19937 rng(29);
  ThreadPool pool(2);
  const int64_t K = 640, N = 37;
  const float amaxes[] = {1.0f, 3.7f, 0.013f, 1e-30f, 2.5e30f, 127.0f, 1e-3f};
  const int64_t M = std::size(amaxes);
  std::vector<float> x(M * K);
  for (int64_t m = 0; m < M; ++m) {
    const float amax = amaxes[m], s = amax / 127.0f;
    float* row = x.data() + m * K;
    row[0] = amax;
    for (int64_t k = 1; k < K; ++k) {
      const int j = static_cast<int>(rng() % 254) - 127;  // q + 0.5 for q in [-127, 126]
      float v = (static_cast<float>(j) + 0.5f) * s;
      for (int step = static_cast<int>(k % 5) - 2; step != 0; step += step > 0 ? -1 : 1)
        v = std::nextafter(v, step > 0 ? INFINITY : -INFINITY);
      row[k] = std::clamp(v, -amax, amax);
    }
  }
  check_linear_fast(fast, DType::kQ8Row, M, N, K, true, 0, pool, rng, nullptr, &x);
}

TEST_P(Kernels, LinearW4A8ExtremesAreExact) {
  // The AVX2 kernel adds 8 vpmaddubsw pairs in int16 before widening: with nibbles 15 and
  // |q| = 127 a pair is 3810 and the chain 30480, just inside int16 (a 9th would wrap). Rows of
  // ±amax give q = ±127; weight rows all 15, all 0 or random nibbles.
  std::mt19937 rng(19);
  ThreadPool pool(2);
  const int64_t M = 19, N = 35, K = 640;
  OwnedWeight W = random_weight(DType::kQ4G64, N, K, rng);
  for (int64_t n = 0; n < N; ++n)
    if (n % 3 < 2) std::fill(W.i8.begin() + n * K / 2, W.i8.begin() + (n + 1) * K / 2, n % 3 ? 0 : -1);
  W.scales = random_vec(N * K / 64, rng, 0.05f, 0.1f);
  W.offsets = random_vec(N * K / 64, rng, -0.01f, 0.01f);
  W.w.scales = W.scales.data();
  W.w.offsets = W.offsets.data();
  std::vector<float> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = (i / K) % 2 ? ((rng() % 2) ? 3.0f : -3.0f) : (i / K) % 4 ? -3.0f : 3.0f;
  check_linear_fast(fast, DType::kQ4G64, M, N, K, true, 0, pool, rng, &W, &x);
}

TEST_P(Kernels, LinearW4A8With16BitScales) {
  // Scales and offsets as bf16 (what `klein quantize` and MLX write) and as f16: the kernels
  // convert them per slab (the AMX one with its own zmm conversion); odd N and a K of 5 groups
  // leave partial vectors of scales.
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (DType sd : {DType::kBF16, DType::kF16}) {
    const int64_t M = 37, N = 45, K = 320;
    OwnedWeight W = random_weight(DType::kQ4G64, N, K, rng);
    std::vector<uint16_t> s16(W.scales.size()), o16(W.offsets.size());
    for (size_t i = 0; i < s16.size(); ++i) {
      const float sc = W.scales[i] * (i % 3 ? 1.0f : -1.0f), of = W.offsets[i];
      s16[i] = sd == DType::kBF16 ? f32_to_bf16(sc) : f32_to_f16(sc);
      o16[i] = sd == DType::kBF16 ? f32_to_bf16(of) : f32_to_f16(of);
    }
    W.w.scales = s16.data();
    W.w.offsets = o16.data();
    W.w.scale_dtype = sd;
    check_linear_fast(fast, DType::kQ4G64, M, N, K, true, 0, pool, rng, &W);
  }
}

// The SIMD W4A8 kernels promise the same float32 steps in the same order (gemm_w4a8_common.h),
// so one q4 model gives the same bits on every CPU; the double reference cannot check that, so
// the kernels of every ISA this CPU has are held to each other. Shapes cover edge rows and
// columns, several K slices and a strided x / y.
TEST(KernelsAcrossIsas, W4A8GivesTheSameBitsOnEveryIsa) {
  std::vector<std::pair<std::string, kernels::KernelSet>> sets;
  for (Isa isa : CpuFeatures::host().isas()) {
    auto s = kernels::KernelSet::select(CpuFeatures::host(), isa, kernels::Precision::kFast);
    const std::string name(s.get(kernels::Op::kLinear, DType::kQ4G64).name);
    if (name.starts_with("gemm_w4a8") && std::none_of(sets.begin(), sets.end(), [&](auto& p) { return p.first == name; }))
      sets.emplace_back(name, std::move(s));
  }
  if (sets.size() < 2) GTEST_SKIP() << "fewer than two SIMD W4A8 kernels on this CPU";
  std::mt19937 rng(23);
  ThreadPool pool(2);
  struct Shape3 { int64_t M, N, K, pad; };
  // K = 4096: the VNNI kernel's unpacked rows at a stride of one line more than K (2 KB
  // multiples share L1 sets); N = 520: work items of 132 columns, with a 1 MB L2 three slabs
  // each (the next one prefetched).
  for (const Shape3 c : {Shape3{1, 70, 64, 0}, Shape3{13, 35, 640, 3}, Shape3{40, 300, 1088, 0}, Shape3{300, 64, 3072, 1},
                         Shape3{70, 520, 4096, 2}}) {
    const int64_t ldx = c.K + c.pad, ldy = c.N + c.pad;
    const OwnedWeight W = random_weight(DType::kQ4G64, c.N, c.K, rng);
    const auto x = random_vec(c.M * ldx, rng, -4, 4);
    const auto B = make_weight(DType::kBF16, c.N, 0, random_vec(c.N, rng));
    std::vector<float> y0(c.M * ldy, 7.0f);
    kernels::run_linear(sets[0].second, x.data(), c.M, c.K, W.w, &B.w, y0.data(), pool, ldx, ldy);
    for (size_t i = 1; i < sets.size(); ++i) {
      std::vector<float> y(c.M * ldy, 7.0f);
      kernels::run_linear(sets[i].second, x.data(), c.M, c.K, W.w, &B.w, y.data(), pool, ldx, ldy);
      for (int64_t j = 0; j < c.M * ldy; ++j)
        ASSERT_EQ(std::bit_cast<uint32_t>(y[j]), std::bit_cast<uint32_t>(y0[j]))
            << sets[i].first << " vs " << sets[0].first << " M=" << c.M << " N=" << c.N << " K=" << c.K
            << " at " << j / ldy << "," << j % ldy << ": " << y[j] << " vs " << y0[j];
    }
  }
}

struct AttnCase {
  int64_t Sq, Sk;
  int Hq, Hkv, D;
  bool causal;
  int valid_mode;  // 0: no key_valid, 1: random with key 0 invalid, 2: all invalid, 3: a prefix
                   // of ~Sk/9 valid keys, padding after (a padded prompt)
};

void check_attention(const kernels::KernelSet& set, const AttnCase& c, ThreadPool& pool, std::mt19937& rng,
                     bool fused) {
  const int64_t qw = int64_t{c.Hq} * c.D, kw = int64_t{c.Hkv} * c.D;
  // fused: q, k, v interleaved in one [S, qw + 2 kw] buffer (as a fused QKV Linear writes it).
  const int64_t S = std::max(c.Sq, c.Sk), ld = qw + 2 * kw;
  std::vector<float> qkv, qs, ks, vs;
  const float *q, *k, *v;
  int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0;
  if (fused) {
    qkv = random_vec(S * ld, rng, -2, 2);
    q = qkv.data(), k = qkv.data() + qw, v = qkv.data() + qw + kw;
    ldq = ldk = ldv = ld;
    ldo = qw + 3;
  } else {
    qs = random_vec(c.Sq * qw, rng, -2, 2);
    ks = random_vec(c.Sk * kw, rng, -2, 2);
    vs = random_vec(c.Sk * kw, rng);
    q = qs.data(), k = ks.data(), v = vs.data();
  }
  std::vector<uint8_t> valid(c.Sk, 1);
  if (c.valid_mode == 1) {
    for (auto& b : valid) b = rng() % 4 != 0;
    valid[0] = 0;  // with causal, query 0 then has no visible key
  } else if (c.valid_mode == 2) {
    std::fill(valid.begin(), valid.end(), 0);
  } else if (c.valid_mode == 3) {
    std::fill(valid.begin() + (c.Sk + 8) / 9, valid.end(), 0);
  }
  const kernels::AttnMask mask{c.causal, c.valid_mode ? valid.data() : nullptr};
  const int64_t ldo_r = ldo ? ldo : qw;
  std::vector<float> o(c.Sq * ldo_r, NAN), r(c.Sq * ldo_r, NAN);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  kernels::run_attention(set, q, k, v, o.data(), c.Sq, c.Sk, c.Hq, c.Hkv, c.D, scale, mask, pool, ldq,
                         ldk, ldv, ldo);
  // A fast (bf16) kernel against the reference of its arithmetic: a p on a bf16 rounding boundary
  // may round the other way, ≤ 2^-8 · max|v| (kernels.h), plus float32 sums.
  const bool bf16 = set.get(kernels::Op::kAttention, DType::kF32).fast;
  float vmax = 0;
  if (bf16) {
    kernels::ref::attention_bf16(q, k, v, r.data(), c.Sq, c.Sk, c.Hq, c.Hkv, c.D, scale, mask, ldq, ldk, ldv, ldo);
    for (int64_t j = 0; j < c.Sk; ++j)
      for (int64_t d = 0; d < kw; ++d) vmax = std::max(vmax, std::fabs(v[j * (ldv ? ldv : kw) + d]));
  } else {
    kernels::ref::attention(q, k, v, r.data(), c.Sq, c.Sk, c.Hq, c.Hkv, c.D, scale, mask, ldq, ldk, ldv, ldo);
  }
  float err, mag;
  compare(o.data(), r.data(), c.Sq, qw, ldo_r, &err, &mag);
  ASSERT_LE(err, 1e-5f * std::max(1.0f, mag) + 1.01f * vmax / 256)
      << "Sq=" << c.Sq << " Sk=" << c.Sk << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
      << " causal=" << c.causal << " valid=" << c.valid_mode << " fused=" << fused;
  if (c.valid_mode == 2 || (c.valid_mode == 1 && c.causal))
    for (int64_t d = 0; d < qw; ++d) ASSERT_EQ(o[d], 0.0f) << "masked row must be zeros";
}

TEST_P(Kernels, AttentionMatchesRef) {
  std::mt19937 rng(42);
  ThreadPool pool(2);
  int n = 0;
  for (int D : {8, 16, 128})
    for (auto [Hq, Hkv] : {std::pair{2, 2}, {4, 2}, {4, 1}})
      for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {5, 3}, {50, 50}, {37, 150},
                            {130, 70}})
        for (bool causal : {false, true})
          for (int vm : {0, 1}) {
            if (D == 128 && (Sq + Sk) % 3 != 0 && !(vm == 1 && causal)) continue;  // keep fast
            check_attention(set, {Sq, Sk, Hq, Hkv, D, causal, vm}, pool, rng, ++n % 2 == 0);
          }
  check_attention(set, {40, 40, 2, 1, 24, true, 2}, pool, rng, false);   // everything masked
  check_attention(set, {300, 300, 3, 3, 20, true, 1}, pool, rng, true);  // D % 16 != 0, many blocks
  // Several query blocks without a causal mask (the fast path uses larger blocks then).
  check_attention(set, {400, 130, 2, 1, 16, false, 1}, pool, rng, false);
  check_attention(set, {250, 100, 2, 2, 128, false, 0}, pool, rng, true);
  ThreadPool pool1(1);
  check_attention(set, {100, 260, 4, 2, 64, false, 1}, pool1, rng, false);
  // Padded prompts (the text encoder's mask): causal or not, the tail of keys never visible.
  check_attention(set, {512, 512, 4, 1, 128, true, 3}, pool, rng, false);
  check_attention(set, {300, 301, 2, 2, 24, false, 3}, pool, rng, true);
}

// The same cases under Precision::kFast: the bf16 kernel where the CPU has AVX512_BF16 (against
// ref::attention_bf16), else the exact one again.
TEST_P(Kernels, AttentionFastMatchesItsRef) {
  const auto fast = kernels::KernelSet::select(CpuFeatures::host(), GetParam(), kernels::Precision::kFast);
  EXPECT_EQ(fast.get(kernels::Op::kAttention, DType::kF32).fast,
            CpuFeatures::host().has(Isa::kAvx512Bf16) && GetParam() >= Isa::kAvx512Bf16);
  std::mt19937 rng(43);
  ThreadPool pool(2), pool3(3);
  int n = 0;
  for (int D : {8, 17, 128})
    for (auto [Hq, Hkv] : {std::pair{2, 2}, {4, 1}})
      for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {5, 3}, {50, 50}, {37, 150}, {130, 71}})
        for (bool causal : {false, true})
          for (int vm : {0, 1}) {
            if (D == 128 && (Sq + Sk) % 3 != 0 && !(vm == 1 && causal)) continue;  // keep fast
            check_attention(fast, {Sq, Sk, Hq, Hkv, D, causal, vm}, ++n % 3 ? pool : pool3, rng, n % 2 == 0);
          }
  check_attention(fast, {40, 40, 2, 1, 24, true, 2}, pool, rng, false);   // everything masked
  check_attention(fast, {300, 301, 3, 3, 20, true, 1}, pool, rng, true);  // odd Sk
  // More than one key block (kAttnBf16KeyBlock keys): the running max and the rescaled sums.
  check_attention(fast, {70, 2 * kernels::ref::kAttnBf16KeyBlock + 45, 2, 1, 16, false, 1}, pool, rng, false);
  check_attention(fast, {kernels::ref::kAttnBf16KeyBlock + 90, kernels::ref::kAttnBf16KeyBlock + 90, 2, 2, 24, true, 0},
                  pool3, rng, true);
  check_attention(fast, {400, 130, 2, 1, 16, false, 1}, pool, rng, false);
  check_attention(fast, {250, 100, 2, 2, 128, false, 0}, pool3, rng, true);
  // Padded prompts (the text encoder's mask): the keys past the last valid one are left out.
  check_attention(fast, {512, 512, 4, 1, 128, true, 3}, pool, rng, false);  // 57 valid keys
  check_attention(fast, {300, 301, 2, 2, 24, false, 3}, pool3, rng, true);  // 34
  check_attention(fast, {70, 2 * kernels::ref::kAttnBf16KeyBlock + 45, 2, 1, 16, false, 3}, pool, rng, false);
  // K / V panels over half the L2 (with 2 MB, Sk > 2048 at D = 128): the AMX kernel's tasks of
  // several query sub-blocks sharing each key block (attention_bf16_run), their last one partial
  // (600 queries = 2 tasks of 256 and one of 3 sub-blocks, the last of 24 rows); causal (each
  // sub-block's own last key), padded, plain.
  check_attention(fast, {600, 2100, 2, 1, 128, true, 1}, pool, rng, false);
  check_attention(fast, {600, 2100, 2, 1, 128, false, 3}, pool3, rng, true);
  check_attention(fast, {600, 2100, 1, 1, 128, false, 0}, pool, rng, false);
}

TEST_P(Kernels, AttentionLargeScoresStayFinite) {
  // Scores of ±1e3 would overflow a naive exp; online softmax must subtract the running max.
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t S = 200;
  const int D = 16;
  auto q = random_vec(S * D, rng, -10, 10), k = random_vec(S * D, rng, -10, 10),
       v = random_vec(S * D, rng);
  std::vector<float> o(S * D), r(S * D);
  kernels::run_attention(set, q.data(), k.data(), v.data(), o.data(), S, S, 1, 1, D, 1.0f, {}, pool);
  kernels::ref::attention(q.data(), k.data(), v.data(), r.data(), S, S, 1, 1, D, 1.0f, {});
  float err, mag;
  compare(o.data(), r.data(), S, D, D, &err, &mag);
  // Scores are sums of terms up to 100, so float32 rounding alone moves them by ~1e-5 (ref is
  // double); the softmax weights inherit that relative error, hence the looser bound.
  EXPECT_LE(err, 1e-4f * std::max(1.0f, mag));
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return std::isfinite(x); }));
}

// A non-finite q or k element (issue 41: a corrupt Q / K projection): the (query, head) rows
// whose visible scores include a NaN, or make the softmax undefined (+inf; all -inf), must be
// NaN in all D values, and every other row finite and equal to the reference — a masked key's
// score never counts, a row the mask leaves no key is zeros, and -inf scores beside finite ones
// weigh 0. Once for the exact kernel and once for the fast one; 600 keys span several key
// blocks of every kernel (96 for AVX2, kAttnBf16KeyBlock for the bf16 ones).
TEST_P(Kernels, AttentionNonFiniteScoresGiveNaNRows) {
  constexpr int64_t S = 600;
  constexpr int Hq = 2, D = 16;  // one kv head
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* what;
    bool causal;
    int64_t masked_key;  // key_valid hides this key (-1: no key_valid)
    std::function<void(std::vector<float>& q, std::vector<float>& k)> poke;
    std::function<bool(int64_t i, int h)> nan_row;
  };
  auto qat = [](int64_t i, int h, int d) { return (i * Hq + h) * D + d; };
  const std::vector<Case> cases = {
      {"NaN in q", false, -1, [&](auto& q, auto&) { q[qat(5, 1, 3)] = nan; },
       [](int64_t i, int h) { return i == 5 && h == 1; }},
      {"NaN in k, causal", true, -1, [&](auto&, auto& k) { k[300 * D + 2] = nan; },
       [](int64_t i, int) { return i >= 300; }},
      {"NaN in a masked key", false, 300, [&](auto&, auto& k) { k[300 * D + 2] = nan; },
       [](int64_t, int) { return false; }},
      {"NaN in masked key 0, causal: query 0 sees no key", true, 0, [&](auto&, auto& k) { k[1] = nan; },
       [](int64_t, int) { return false; }},
      {"+inf in q", false, -1, [&](auto& q, auto&) { q[qat(7, 0, 0)] = inf; },
       [](int64_t i, int h) { return i == 7 && h == 0; }},
      {"every score -inf", false, -1,
       [&](auto& q, auto& k) {
         q[qat(9, 1, 4)] = inf;
         for (int64_t j = 0; j < S; ++j) k[j * D + 4] = -0.5f;
       },
       [](int64_t i, int h) { return i == 9 && h == 1; }},
      {"-inf scores beside finite ones", true, -1,
       [&](auto& q, auto& k) {
         q[qat(400, 0, 4)] = 1e30f;
         for (int64_t j = 0; j < S; ++j) k[j * D + 4] = j % 2 ? -1e30f : 0.0f;  // -1e60: -inf in float32
       },
       [](int64_t, int) { return false; }},
  };
  ThreadPool pool(2);
  for (const kernels::KernelSet* ks : {&set, &fast}) {
    const kernels::KernelEntry& e = ks->get(kernels::Op::kAttention, DType::kF32);
    for (const Case& c : cases) {
      std::mt19937 rng(11);
      auto q = random_vec(S * Hq * D, rng), k = random_vec(S * D, rng), v = random_vec(S * D, rng);
      c.poke(q, k);
      std::vector<uint8_t> valid(S, 1);
      if (c.masked_key >= 0) valid[c.masked_key] = 0;
      const kernels::AttnMask mask{c.causal, c.masked_key >= 0 ? valid.data() : nullptr};
      const float scale = 0.25f;
      std::vector<float> o(S * Hq * D), r(S * Hq * D);
      kernels::run_attention(*ks, q.data(), k.data(), v.data(), o.data(), S, S, Hq, 1, D, scale, mask, pool);
      if (e.fast)
        kernels::ref::attention_bf16(q.data(), k.data(), v.data(), r.data(), S, S, Hq, 1, D, scale, mask);
      else
        kernels::ref::attention(q.data(), k.data(), v.data(), r.data(), S, S, Hq, 1, D, scale, mask);
      const float tol = 1e-5f + (e.fast ? 1.01f / 256 : 0.0f);  // |v| ≤ 1 (check_attention's bound)
      for (int64_t i = 0; i < S; ++i)
        for (int h = 0; h < Hq; ++h) {
          const bool want_nan = c.nan_row(i, h);
          for (int d = 0; d < D; ++d) {
            const float got = o[qat(i, h, d)];
            if (want_nan) {
              ASSERT_TRUE(std::isnan(got)) << c.what << ": " << e.name << " row " << i << " head " << h << " = " << got;
              ASSERT_TRUE(std::isnan(r[qat(i, h, d)])) << c.what << ": the reference, row " << i << " head " << h;
            } else {
              ASSERT_TRUE(std::isfinite(got)) << c.what << ": " << e.name << " row " << i << " head " << h;
              ASSERT_NEAR(got, r[qat(i, h, d)], tol) << c.what << ": " << e.name << " row " << i << " head " << h;
            }
          }
        }
      if (c.masked_key == 0 && c.causal)  // query 0 sees no key: zeros
        for (int d = 0; d < Hq * D; ++d) ASSERT_EQ(o[d], 0.0f) << c.what << ": " << e.name;
    }
  }
}

TEST_P(Kernels, Q4G64UnpackIsBitExact) {
  // x = identity rows: with no bias, y[m, n] = 1 · W[n, m] + 0 · … is the expanded weight itself,
  // so the SIMD unpack (q4_unpack.h) must give the format table's row → f32 bit for bit (fp32),
  // or its bf16 rounding (fast). bf16 scales and offsets, as `klein quantize` and MLX store them.
  std::mt19937 rng(21);
  const int64_t N = 40, K = 192;
  OwnedWeight o = random_weight(DType::kQ4G64, N, K, rng);
  std::vector<uint16_t> sb(o.scales.size()), ob(o.offsets.size());
  for (size_t i = 0; i < sb.size(); ++i) {
    sb[i] = f32_to_bf16(o.scales[i] * (i % 2 ? -1.0f : 1.0f));  // MLX scales may be negative
    ob[i] = f32_to_bf16(o.offsets[i]);
  }
  o.w.scales = sb.data();
  o.w.offsets = ob.data();
  o.w.scale_dtype = DType::kBF16;
  std::vector<float> x(K * K, 0.0f), y(K * N), y2(K * N), row(K);
  for (int64_t m = 0; m < K; ++m) x[m * K + m] = 1.0f;
  ThreadPool pool(2);
  kernels::run_linear(set, x.data(), K, K, o.w, nullptr, y.data(), pool);
  kernels::run_linear(fast, x.data(), K, K, o.w, nullptr, y2.data(), pool);
  // The fast Q4_G64 kernel is W4A8 on every ISA (checked against ref::linear_w4a8 elsewhere:
  // it quantizes x, so it does not reproduce the rows); a bf16 one would round them.
  const kernels::KernelEntry& fq4 = fast.get(kernels::Op::kLinear, DType::kQ4G64);
  const bool fast_is_bf16 = fq4.name == "gemm_bf16_avx512bf16";
  if (fq4.fast && !fast_is_bf16) y2 = y;
  for (int64_t n = 0; n < N; ++n) {
    weight_row_to_f32(o.w, n, row.data());
    for (int64_t m = 0; m < K; ++m) {
      ASSERT_EQ(std::bit_cast<uint32_t>(y[m * N + n]), std::bit_cast<uint32_t>(row[m])) << n << "," << m;
      const float want = fast_is_bf16 ? round_bf16(row[m]) : row[m];
      ASSERT_EQ(std::bit_cast<uint32_t>(y2[m * N + n]), std::bit_cast<uint32_t>(want)) << n << "," << m;
    }
  }
}

// ggml block weights (GGUF) under Precision::kFast: llama.cpp's per-block int8 activations and
// integer dot products (kernels/ggml_dot.h, ref::linear_ggml).
constexpr DType kGgmlFormats[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                  DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

TEST(KernelsRef, GgmlActivationsQuantizedAsLlamaCpp) {
  namespace gd = kernels::ggml_dot;
  gd::Form f;
  // block_q8_0 (x86 form): id = 127 / amax = 1 here, q = round half to even, d = fp16(amax / 127).
  ASSERT_TRUE(gd::form_of(DType::kQ8_0, &f));
  std::vector<float> x(32, 0.0f);
  const float v[] = {127.0f, 2.5f, 3.5f, -2.5f, 0.5f, -127.0f, 1.4999f};
  std::copy(std::begin(v), std::end(v), x.begin());
  std::vector<int8_t> q(32);
  float dx = -1, xs = -1;
  int32_t bs = -1;
  gd::quantize_act(f, x.data(), 32, q.data(), &dx, &xs, &bs);
  EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 7), (std::vector<int8_t>{127, 2, 4, -2, 0, -127, 1}));
  EXPECT_EQ(dx, 1.0f);
  EXPECT_EQ(bs, 5);
  EXPECT_EQ(xs, 5.0f);
  std::fill(x.begin(), x.end(), 0.0f);
  x[3] = -0.3f, x[4] = 0.1f;  // d = 0.3 / 127 rounded to fp16; q from 127 / 0.3 in float32
  gd::quantize_act(f, x.data(), 32, q.data(), &dx, &xs, &bs);
  EXPECT_EQ(dx, f16_to_f32(f32_to_f16(0.3f / 127.0f)));
  EXPECT_NE(dx, 0.3f / 127.0f);
  EXPECT_EQ(q[3], -127);
  EXPECT_EQ(q[4], static_cast<int8_t>(std::nearbyint(0.1f * (127.0f / 0.3f))));  // 42.33 → 42
  // block_q8_K: iscale = −127 / max for the element of largest |x| (its sign kept), q =
  // min(127, rne(iscale · x)), d = 1 / iscale; Σq per 16 (Q6_K's sub-blocks).
  ASSERT_TRUE(gd::form_of(DType::kQ6_K, &f));
  std::vector<float> k(256, 0.0f);
  k[0] = 2.0f, k[1] = 1.0f, k[5] = -4.0f, k[16] = 0.5f;
  std::vector<int8_t> qk(256);
  std::vector<float> dk(16), xk(16);
  std::vector<int32_t> bk(16);
  gd::quantize_act(f, k.data(), 256, qk.data(), dk.data(), xk.data(), bk.data());
  EXPECT_EQ(qk[5], -127);
  EXPECT_EQ(qk[0], 64);  // 31.75 · 2 = 63.5 → 64 (even)
  EXPECT_EQ(qk[1], 32);  // 31.75 → 32
  EXPECT_EQ(qk[16], 16);  // 15.875 → 16
  EXPECT_EQ(dk[0], 1.0f / 31.75f);
  EXPECT_EQ(dk[15], dk[0]);
  EXPECT_EQ(bk[0], 64 + 32 - 127);
  EXPECT_EQ(bk[1], 16);
  k[5] = 4.0f;  // a positive max flips the codes' sign: iscale < 0
  gd::quantize_act(f, k.data(), 256, qk.data(), dk.data(), xk.data(), bk.data());
  EXPECT_EQ(qk[5], -127);
  EXPECT_EQ(qk[0], -64);
  EXPECT_EQ(dk[0], -1.0f / 31.75f);
  // A NaN: the block's codes 0 and its scale NaN (the outputs are NaN); a zero block: d = 0.
  k[7] = std::numeric_limits<float>::quiet_NaN();
  gd::quantize_act(f, k.data(), 256, qk.data(), dk.data(), xk.data(), bk.data());
  EXPECT_TRUE(std::isnan(dk[0]));
  EXPECT_EQ(qk[5], 0);
  std::fill(k.begin(), k.end(), 0.0f);
  gd::quantize_act(f, k.data(), 256, qk.data(), dk.data(), xk.data(), bk.data());
  EXPECT_EQ(dk[0], 0.0f);
}

TEST(KernelsRef, GgmlUnpackGivesTheDequantizedRow) {
  // fw · w + o is the format table's row → f32 (ggml's dequantisation) for every element.
  std::mt19937 rng(12);
  for (DType dt : kGgmlFormats) {
    kernels::ggml_dot::Form f;
    ASSERT_TRUE(kernels::ggml_dot::form_of(dt, &f));
    const int64_t K = 512;
    const OwnedWeight W = random_weight(dt, 3, K, rng);
    std::vector<int8_t> w(K);
    std::vector<float> fw(K / f.sub), o(K / f.sub, 0.0f), ref(K);
    for (int64_t r = 0; r < 3; ++r) {
      kernels::ggml_dot::unpack_row(W.w, r, w.data(), fw.data(), o.data());
      weight_row_to_f32(W.w, r, ref.data());
      for (int64_t k = 0; k < K; ++k) {
        const float got = fw[k / f.sub] * static_cast<float>(w[k]) + o[k / f.sub];
        ASSERT_NEAR(got, ref[k], 1e-6f * std::max(1.0f, std::fabs(ref[k]))) << dtype_name(dt) << " row " << r << " k " << k;
      }
    }
  }
}

TEST(KernelsRef, GgmlLinearIsNearTheDequantizedGemm) {
  // The int8 activations cost ~0.5 % (relative L2) against the float32 GEMM of the dequantized
  // weights; a wrong scale, offset or code order costs far more than the bound.
  std::mt19937 rng(21);
  const int64_t M = 9, N = 23, K = 512;
  for (DType dt : kGgmlFormats) {
    const OwnedWeight W = random_weight(dt, N, K, rng);
    const auto x = random_vec(M * K, rng);
    std::vector<float> y(M * N), yr(M * N);
    kernels::ref::linear_ggml(x.data(), M, K, W.w, nullptr, y.data());
    kernels::ref::linear(x.data(), M, K, W.w, nullptr, yr.data());
    double dot = 0, n2 = 0, r2 = 0, e2 = 0;
    for (int64_t i = 0; i < M * N; ++i) {
      dot += double(y[i]) * yr[i], n2 += double(y[i]) * y[i], r2 += double(yr[i]) * yr[i];
      e2 += (double(y[i]) - yr[i]) * (double(y[i]) - yr[i]);
    }
    const double rel = std::sqrt(e2 / r2), cosine = dot / std::sqrt(n2 * r2);
    EXPECT_LT(rel, 0.02) << dtype_name(dt);
    EXPECT_GT(cosine, 0.9995) << dtype_name(dt);
    EXPECT_GT(rel, 0.0) << dtype_name(dt) << ": the activations were not quantized";
  }
}

TEST_P(Kernels, GgmlLinearFastIsItsRefBitForBit) {
  // Every SIMD kernel of this ISA against ref::linear_ggml, bit for bit: odd M and N, partial
  // activation blocks, several slabs of weight rows, strided x and y, 1-3 threads.
  std::mt19937 rng(55);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (DType dt : kGgmlFormats) {
    const kernels::KernelEntry& e = fast.get(kernels::Op::kLinear, dt);
    EXPECT_TRUE(e.fast) << dtype_name(dt) << " " << e.name;
    EXPECT_TRUE(e.name.find("ggml") != std::string_view::npos) << dtype_name(dt) << " " << e.name;
    EXPECT_FALSE(set.get(kernels::Op::kLinear, dt).fast) << dtype_name(dt);  // fp32: the dequantized GEMM
    const int64_t kb = format_traits(dt).block_elems;
    check_linear_fast(fast, dt, 1, 1, kb, true, 0, pool1, rng);
    check_linear_fast(fast, dt, 5, 7, 2 * kb, false, 3, pool2, rng);
    check_linear_fast(fast, dt, 70, 203, 512, true, 1, pool2, rng);  // 203 rows: > 2 slabs of 96
    check_linear_fast(fast, dt, 33, 13, 768, true, 0, pool3, rng);
  }
}

TEST_P(Kernels, GgmlLinearFastExtremesAreExact) {
  // Every code at its largest (all payload bits set) against activations all at ±127: the int16
  // sums the AVX2 kernel chains before widening are at their bound and must not saturate.
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t M = 9, N = 11, K = 512;
  for (DType dt : kGgmlFormats)
    for (float v : {1.0f, -1.0f}) {
      OwnedWeight W = random_weight(dt, N, K, rng);
      std::fill(W.i8.begin(), W.i8.end(), int8_t{-1});
      testing::make_ggml_blocks_valid(dt, W.i8.data(), W.i8.size(), 4);
      const std::vector<float> x(M * K, v);
      SCOPED_TRACE(std::string(dtype_name(dt)) + (v > 0 ? " +" : " -"));
      check_linear_fast(fast, dt, M, N, K, false, 0, pool, rng, &W, &x);
    }
}

TEST_P(Kernels, GgmlLinearFastNaNStaysInItsRow) {
  std::mt19937 rng(8);
  ThreadPool pool(2);
  const int64_t M = 11, N = 9, K = 512;
  for (DType dt : {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const OwnedWeight W = random_weight(dt, N, K, rng);
    auto x = random_vec(M * K, rng);
    x[4 * K + 300] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y(M * N), yr(M * N);
    kernels::run_linear(fast, x.data(), M, K, W.w, nullptr, y.data(), pool);
    kernels::ref::linear_ggml(x.data(), M, K, W.w, nullptr, yr.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        if (m == 4) EXPECT_TRUE(std::isnan(y[m * N + n])) << dtype_name(dt);
        else EXPECT_EQ(y[m * N + n], yr[m * N + n]) << dtype_name(dt) << " " << m << "," << n;
      }
  }
}

}  // namespace
}  // namespace klein
