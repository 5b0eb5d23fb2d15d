// The element-wise kernels (kernels/eltwise.h) of every ISA this CPU has against the kScalar
// table (the references of kernels/ref/elementwise.h), over sizes that leave every tail length
// of 8- and 16-lane vectors (n = 1 … 17, 31, 33, 127 … 129, 3077), head dims that are not
// multiples of the vector width, rows at odd offsets inside guard bands (nothing outside a row is
// read into the result or written), in-place calls, and special values.
//
// Tolerances follow from how the SIMD kernels differ from the reference (eltwise.h), with
// u = 2^-24 (float unit roundoff) and `mag` the sum of the magnitudes of the terms an output
// is made of (so cancellation does not make the bound meaningless):
//   add, add_scalar:          the same single rounding → bit-equal.
//   gated_add, scale_shift:   FMA vs product-then-add: ≤ u|product| + 2u|sum| → 3u·mag.
//   rope (both), rotations:   one product fused: 3u·(|a·c| + |b·s|).
//   rms_norm:                 the factor may differ by 1 ulp (double sums in another order,
//                             then rounded to float): ≤ 2u + the same 2 roundings → 8u·|y|.
//   layer_norm:               mean (1 ulp) and rstd (1 ulp) as above, FMA in the affine:
//                             8u·((|x| + |mean|)·rstd·|w| + |b|).
//   qk_norm_rope:             rms_norm's factor error inside the rotation: 6u·(|a'·c| + |b'·s|).
//   exp:                      the vector exp ≤ 1.01 ulp from exact, expf ≤ 0.5 ulp → ≤ 2 ulp.
//   silu, swiglu:             2 ulp in e^−v moves 1 + e^−v by ≤ 6u relative, the division and
//                             product add 2u each: 8u·|y| (silu), 10u·|y| (swiglu), plus the
//                             smallest subnormal for results that underflow.
//   moments (double):         both sum n terms in double: 4n·2^-53·Σ|terms|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/eltwise.h"
#include "kernels/registry.h"

namespace klein {
namespace {

constexpr double kU = 0x1p-24;
constexpr float kGuard = -12345.5f;  // the value of every float outside the row under test
constexpr int64_t kPad = 5;          // guard floats on each side: rows start at odd offsets

const std::vector<int64_t> kSizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                     17, 31, 33, 64, 100, 127, 128, 129, 3072, 3077};
const std::vector<int64_t> kHeadDims = {2, 4, 6, 8, 10, 14, 16, 18, 30, 32, 34, 64, 128, 130};

// n floats at an odd offset inside a buffer of guards.
struct Row {
  std::vector<float> buf;
  int64_t n;
  explicit Row(const std::vector<float>& v) : buf(v.size() + 2 * kPad, kGuard), n(static_cast<int64_t>(v.size())) {
    for (int64_t i = 0; i < n; ++i) buf[kPad + i] = v[i];  // (std::copy: a GCC 12 false -Wstringop-overflow)
  }
  float* p() { return buf.data() + kPad; }
  float operator[](int64_t i) const { return buf[kPad + i]; }
  bool guards_intact() const {
    for (int64_t i = 0; i < kPad; ++i)
      if (buf[i] != kGuard || buf[kPad + n + i] != kGuard) return false;
    return true;
  }
};

std::vector<float> randv(int64_t n, std::mt19937& rng, float lo = -3.0f, float hi = 3.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

class Eltwise : public ::testing::TestWithParam<Isa> {
 protected:
  const kernels::EltwiseFns& k = kernels::KernelSet::select(CpuFeatures::host(), GetParam()).eltwise();
  const kernels::EltwiseFns& ref = kernels::scalar::eltwise();
  std::mt19937 rng{2024};

  // |got[i] − want[i]| ≤ k_u · u · mag[i] + floor for every i, and the guards untouched.
  void expect_close(const Row& got, const Row& want, const std::vector<double>& mag, double k_u, const char* what,
                    int64_t n, double floor = 0.0) {
    ASSERT_TRUE(got.guards_intact()) << what << " n=" << n << ": wrote outside the row";
    for (int64_t i = 0; i < got.n; ++i) {
      const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
      ASSERT_LE(d, k_u * kU * mag[i] + floor)
          << what << " n=" << n << " at " << i << ": " << got[i] << " vs " << want[i] << " on " << isa_name(GetParam());
    }
  }
};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); }

INSTANTIATE_TEST_SUITE_P(Isa, Eltwise, ::testing::ValuesIn(CpuFeatures::host().isas()), isa_param_name);

TEST_P(Eltwise, TheSetPicksItsIsa) {
  const kernels::KernelEntry& e = kernels::KernelSet::select(CpuFeatures::host(), GetParam()).get(
      kernels::Op::kElementwise, DType::kF32);
  EXPECT_EQ(&k, e.eltwise);
  EXPECT_LE(e.isa, GetParam());
#if defined(KLEIN_X86)
  if (GetParam() >= Isa::kAvx512) EXPECT_EQ(e.name, "eltwise_avx512");
  else if (GetParam() >= Isa::kAvx2) EXPECT_EQ(e.name, "eltwise_avx2");
#endif
  if (GetParam() == Isa::kScalar) EXPECT_EQ(&k, &ref);
}

TEST_P(Eltwise, AddAndAddScalarAreBitEqual) {
  for (int64_t n : kSizes) {
    const auto x = randv(n, rng), y0 = randv(n, rng);
    Row y(y0), yr(y0), xr(x);
    k.add(y.p(), xr.p(), n);
    ref.add(yr.p(), xr.p(), n);
    ASSERT_TRUE(y.guards_intact() && xr.guards_intact()) << n;
    ASSERT_EQ(y.buf, yr.buf) << "add n=" << n;
    Row z(std::vector<float>(n, 0.0f)), zr(std::vector<float>(n, 0.0f));
    k.add_scalar(xr.p(), 0.37f, z.p(), n);
    ref.add_scalar(xr.p(), 0.37f, zr.p(), n);
    ASSERT_TRUE(z.guards_intact()) << n;
    ASSERT_EQ(z.buf, zr.buf) << "add_scalar n=" << n;
  }
}

TEST_P(Eltwise, GatedAddAndScaleShift) {
  for (int64_t n : kSizes) {
    const auto h0 = randv(n, rng), o = randv(n, rng), g = randv(n, rng), t = randv(n, rng);
    Row h(h0), hr(h0), orow(o), grow(g), trow(t);
    k.gated_add(h.p(), orow.p(), grow.p(), n);
    ref.gated_add(hr.p(), orow.p(), grow.p(), n);
    std::vector<double> mag(n);
    for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(h0[i]) + std::fabs(double(g[i]) * o[i]);
    expect_close(h, hr, mag, 3, "gated_add", n);

    Row y{std::vector<float>(n)}, yr{std::vector<float>(n)};
    k.scale_shift(orow.p(), y.p(), grow.p(), trow.p(), n);
    ref.scale_shift(orow.p(), yr.p(), grow.p(), trow.p(), n);
    for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(double(o[i]) * g[i]) + std::fabs(t[i]);
    expect_close(y, yr, mag, 3, "scale_shift", n);

    k.scale_shift1(orow.p(), y.p(), -1.7f, 0.25f, n);
    ref.scale_shift1(orow.p(), yr.p(), -1.7f, 0.25f, n);
    for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(1.7 * o[i]) + 0.25;
    expect_close(y, yr, mag, 3, "scale_shift1", n);
  }
}

TEST_P(Eltwise, RmsNorm) {
  for (int64_t n : kSizes)
    for (bool with_w : {true, false}) {
      const auto x = randv(n, rng), w = randv(n, rng, 0.5f, 1.5f);
      Row xr(x), wr(w), y{std::vector<float>(n)}, yr{std::vector<float>(n)};
      k.rms_norm(xr.p(), y.p(), with_w ? wr.p() : nullptr, n, 1e-6f);
      ref.rms_norm(xr.p(), yr.p(), with_w ? wr.p() : nullptr, n, 1e-6f);
      std::vector<double> mag(n);
      for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(yr[i]);
      expect_close(y, yr, mag, 8, "rms_norm", n);
      Row inplace(x);  // x == y, as the Qwen q/k norms call it
      k.rms_norm(inplace.p(), inplace.p(), with_w ? wr.p() : nullptr, n, 1e-6f);
      expect_close(inplace, yr, mag, 8, "rms_norm in place", n);
    }
}

TEST_P(Eltwise, LayerNormEveryAffine) {
  for (int64_t n : kSizes)
    for (float offset : {0.0f, 100.0f}) {  // 100 ± 3: the mean dominates, the variance must not cancel
      auto x = randv(n, rng);
      for (auto& v : x) v += offset;
      const auto w = randv(n, rng), b = randv(n, rng);
      Row xr(x), wr(w), br(b);
      double mean = 0, var = 0;
      for (float v : x) mean += v;
      mean /= n;
      for (float v : x) var += (v - mean) * (v - mean);
      const double rstd = 1.0 / std::sqrt(var / n + 1e-5);
      for (int affine = 0; affine < 4; ++affine) {
        const float* wp = affine & 1 ? wr.p() : nullptr;
        const float* bp = affine & 2 ? br.p() : nullptr;
        Row y{std::vector<float>(n)}, yr{std::vector<float>(n)};
        k.layer_norm(xr.p(), y.p(), wp, bp, n, 1e-5f);
        ref.layer_norm(xr.p(), yr.p(), wp, bp, n, 1e-5f);
        std::vector<double> mag(n);
        for (int64_t i = 0; i < n; ++i)
          mag[i] = (std::fabs(x[i]) + std::fabs(mean)) * rstd * (wp ? std::fabs(w[i]) : 1.0) +
                   (bp ? std::fabs(b[i]) : 0.0);
        expect_close(y, yr, mag, 8, affine == 3 ? "layer_norm (modulated)" : "layer_norm", n);
        if (affine == 3) {
          Row inplace(x);
          k.layer_norm(inplace.p(), inplace.p(), wp, bp, n, 1e-5f);
          expect_close(inplace, yr, mag, 8, "layer_norm in place", n);
        }
      }
    }
}

TEST_P(Eltwise, MomentsInDouble) {
  std::vector<int64_t> sizes = kSizes;
  // Whole chunks of the SIMD kernels' two-pass moments (2^15 values), one more value, several.
  for (int64_t n : {int64_t{1} << 15, (int64_t{1} << 15) + 1, 3 * (int64_t{1} << 15) + 5}) sizes.push_back(n);
  for (int64_t n : sizes) {
    auto x = randv(n, rng, 99.0f, 101.0f);
    const kernels::Moments got = k.moments(x.data(), n), want = ref.moments(x.data(), n);
    double abs_sum = 0, dev_sum = 0;
    for (float v : x) abs_sum += std::fabs(v), dev_sum += (v - want.mean) * (v - want.mean);
    const double bound = 4.0 * n * 0x1p-53;
    EXPECT_NEAR(got.mean, want.mean, bound * abs_sum / n) << n;
    // m2 from a mean that may differ by the bound above: its square enters n times.
    EXPECT_NEAR(got.m2, want.m2, bound * (dev_sum + abs_sum * abs_sum / n)) << n;
  }
}

TEST_P(Eltwise, RopeHalfAndInterleaved) {
  for (int64_t D : kHeadDims)
    for (int64_t heads : {1, 3}) {
      const int64_t n = heads * D;
      const auto x = randv(n, rng), c = randv(D, rng, -1, 1), s = randv(D, rng, -1, 1);
      Row cr(c), sr(s);
      {
        Row y(x), yr(x);
        k.rope_half(y.p(), heads, D, cr.p(), sr.p());
        ref.rope_half(yr.p(), heads, D, cr.p(), sr.p());
        std::vector<double> mag(n);
        const int64_t half = D / 2;
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < half; ++d) {
            const double a = x[h * D + d], b = x[h * D + d + half];
            mag[h * D + d] = mag[h * D + d + half] = std::fabs(a) * std::fabs(c[d]) + std::fabs(b) * std::fabs(s[d]) +
                                                     std::fabs(b) * std::fabs(c[d]) + std::fabs(a) * std::fabs(s[d]);
          }
        expect_close(y, yr, mag, 3, "rope_half", D);
      }
      {
        Row y(x), yr(x);
        k.rope_interleaved(y.p(), heads, D, cr.p(), sr.p());
        ref.rope_interleaved(yr.p(), heads, D, cr.p(), sr.p());
        std::vector<double> mag(n);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t d = i % D;
          const double a = x[i], b = x[i ^ 1];  // the pair partner
          mag[i] = std::fabs(a * c[d]) + std::fabs(b * s[d]);
        }
        expect_close(y, yr, mag, 3, "rope_interleaved", D);
      }
    }
}

TEST_P(Eltwise, QkNormRope) {
  for (int64_t D : kHeadDims)
    for (int64_t heads : {1, 3}) {
      const int64_t n = heads * D;
      const auto x = randv(n, rng), w = randv(D, rng, 0.5f, 1.5f), c = randv(D, rng, -1, 1),
                 s = randv(D, rng, -1, 1);
      Row y(x), yr(x), wr(w), cr(c), sr(s);
      k.qk_norm_rope(y.p(), heads, D, wr.p(), 1e-6f, cr.p(), sr.p());
      ref.qk_norm_rope(yr.p(), heads, D, wr.p(), 1e-6f, cr.p(), sr.p());
      std::vector<double> mag(n);
      for (int64_t h = 0; h < heads; ++h) {
        double ss = 0;
        for (int64_t d = 0; d < D; ++d) ss += double(x[h * D + d]) * x[h * D + d];
        const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = h * D + d;
          mag[i] = std::fabs(x[i] * inv * w[d] * c[d]) + std::fabs(x[i ^ 1] * inv * w[d ^ 1] * s[d]);
        }
      }
      expect_close(y, yr, mag, 6, "qk_norm_rope", D);
    }
}

// Inputs for the exp-based kernels: the random body plus the edges of the exp's range.
std::vector<float> activation_inputs(int64_t n, std::mt19937& rng) {
  auto v = randv(n, rng, -20.0f, 20.0f);
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -88.0f, 88.7f, -88.7f, 89.5f, -89.5f,
                         103.9f, -103.9f, 110.0f, -110.0f, 5e5f, -5e5f};
  for (int64_t i = 0; i < n; ++i)
    if (i % 3 == 1) v[i] = edges[(i / 3) % std::size(edges)];
  return v;
}

TEST_P(Eltwise, SiluAndSwiglu) {
  const double floor = 4 * std::numeric_limits<float>::denorm_min();
  for (int64_t n : kSizes) {
    const auto a = activation_inputs(n, rng), b = randv(n, rng);
    Row y(a), yr(a), br(b);
    k.silu(y.p(), n);
    ref.silu(yr.p(), n);
    std::vector<double> mag(n);
    for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(yr[i]);
    expect_close(y, yr, mag, 8, "silu", n, floor);

    Row ar(a), o{std::vector<float>(n)}, orf{std::vector<float>(n)};
    k.silu_mul(ar.p(), br.p(), o.p(), n);
    ref.silu_mul(ar.p(), br.p(), orf.p(), n);
    for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(orf[i]);
    expect_close(o, orf, mag, 10, "swiglu", n, floor);
    k.silu_mul(ar.p(), br.p(), ar.p(), n);  // out == gate, as the Qwen MLP calls it
    expect_close(ar, orf, mag, 10, "swiglu in place", n, floor);
  }
}

// ulps between two floats of the same sign (by their bit patterns).
int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<int32_t>::min() - ib;
  return std::abs(static_cast<int64_t>(ia) - ib);
}

// The vector exp on a dense sweep of its range, its specials, and every tail length.
TEST_P(Eltwise, ExpWithinTwoUlp) {
  std::vector<float> x;
  for (float v = -104.5f; v < 89.5f; v += 0.0037f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-38f, -1e-38f, 88.7228f, 88.7229f, 88.8f, -87.3f, -103.97f, -103.98f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  std::vector<float> y(x.size()), yr(x.size());
  for (int64_t n : {int64_t(x.size()), int64_t(1), int64_t(7), int64_t(15), int64_t(17)}) {
    k.exp(x.data(), y.data(), n);
    ref.exp(x.data(), yr.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isinf(yr[i]) || yr[i] == 0.0f) {
        ASSERT_EQ(y[i], yr[i]) << "exp(" << x[i] << ")";
        continue;
      }
      ASSERT_LE(ulp_distance(y[i], yr[i]), 2) << "exp(" << x[i] << ") = " << y[i] << " vs " << yr[i];
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  k.exp(&nan, y.data(), 1);
  EXPECT_TRUE(std::isnan(y[0]));
  k.silu(y.data(), 0);  // n = 0 touches nothing
}

}  // namespace
}  // namespace klein
