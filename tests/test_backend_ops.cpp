// The Backend contract: every named op of backend/backend.h against a plain double-precision
// formula written here, through the backend's own alloc/upload/download and prepare_weight, with
// strided views where the models use them. Parameterised over backends: the CPU backend at every
// ISA this machine has, and in -DKLEIN_CUDA=ON builds the CUDA backend in both precisions
// (those cases skip, saying so, where no CUDA device is present).
//
// Tolerance: the ops accumulate statistics in double and the rest in float, so results agree with
// the double formula to a few float ulps: max|got − want| ≤ 2e-6 · max(1, max|want|), looser (1e-5)
// for the reductions over K (linear, attention, conv). A backend whose GEMMs round their inputs
// to bf16 (CUDA under Precision::kFast, attention included) states its own bound for linear,
// attention and conv2d (gemm_tol): 2e-2, a bf16 rounding (2^-9 relative) of each of ~40
// products, summed.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "kernels/kernels.h"
#ifdef KLEIN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace klein {
namespace {

struct BackendCase {
  std::string name;
  std::function<Result<std::unique_ptr<Backend>>()> make;
  double gemm_tol = 1e-5;        // linear, attention and conv2d
  bool needs_cuda_device = false;  // skip (with the reason) where there is none
};

// gtest prints a failing case's parameter (and ctest lists it): its name is all that is needed.
void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

std::vector<BackendCase> all_backends() {
  std::vector<BackendCase> r;
  for (Isa isa : CpuFeatures::host().isas())
    r.push_back({"cpu_" + std::string(isa_name(isa)), [isa]() -> Result<std::unique_ptr<Backend>> {
                   return std::unique_ptr<Backend>(new CpuBackend(CpuBackendOptions{2, isa}));
                 }});
#ifdef KLEIN_HAS_CUDA
  for (auto [name, precision, tol] : {std::tuple{"cuda_fp32", CudaPrecision::kFp32, 1e-5},
                                      std::tuple{"cuda_bf16", CudaPrecision::kBf16, 2e-2}})
    r.push_back({name, [precision]() { return make_cuda_backend(CudaBackendOptions{0, precision, 2}); }, tol, true});
#endif
  return r;
}

std::vector<float> randv(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double max_abs(const std::vector<double>& v) {
  double m = 1.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

class BackendOps : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
#ifdef KLEIN_HAS_CUDA
    if (GetParam().needs_cuda_device) {
      auto n = cuda_device_count();
      if (!n.ok()) GTEST_SKIP() << "no CUDA device, so the CUDA backend is not tested here (" << n.status().message() << ")";
    }
#endif
    auto made = GetParam().make();
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    be = std::move(made).value();
  }
  double gemm_tol() const { return GetParam().gemm_tol; }
  // A weight over host data, made ready for this backend (a no-op on the CPU; an upload on a GPU).
  Weight prepared(Weight w) {
    const Status s = be->prepare_weight(w);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return w;
  }

  Tensor up(const std::vector<float>& v, const Shape& s) {
    auto t = be->upload(v.data(), s, "test input");
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }
  std::vector<float> down(const TensorView& x) {
    auto t = be->download(x);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::vector<float>(t->data(), t->data() + t->numel());
  }
  void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const double bound = tol * max_abs(want);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], bound) << what << " at " << i << " on " << GetParam().name;
  }

  std::unique_ptr<Backend> be;
};

Weight f32_weight(const std::vector<float>& v, const Shape& s, const char* name = "w") {
  Weight w;
  w.name = name;
  w.dtype = DType::kF32;
  w.shape = s;
  w.data = v.data();
  w.nbytes = v.size() * sizeof(float);
  return w;
}

TEST_P(BackendOps, LinearOnStridedViews) {
  const int64_t M = 7, K = 37, N = 21, ldx = 45, ldy = 30;
  const auto xs = randv(M * ldx, 1), ws = randv(N * K, 2), bs = randv(N, 3);
  const Weight W = prepared(f32_weight(ws, {N, K})), B = prepared(f32_weight(bs, {N}));
  Tensor x = up(xs, {M, ldx});
  Tensor y = up(std::vector<float>(M * ldy, 7.0f), {M, ldy});
  ASSERT_TRUE(be->linear(x.view().col_range(3, 3 + K), W, &B, y.view().col_range(2, 2 + N)).ok());
  const auto got = down(y);
  std::vector<double> want(M * ldy, 7.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bs[n];
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(xs[m * ldx + 3 + k]) * ws[n * K + k];
      want[m * ldy + 2 + n] = s;
    }
  expect_near(got, want, gemm_tol(), "linear");  // columns outside the view stay 7
}

TEST_P(BackendOps, LinearSwigluOnStridedViews) {
  // out = SiLU(x · W_gateᵀ + b_gate) · (x · W_upᵀ + b_up), W = [gate; up], into a column range of
  // a wider tensor (the single block's cat); u is the scratch a backend may use for x · Wᵀ.
  const int64_t M = 7, K = 37, F = 19, ldx = 45, ldo = 30;
  const auto xs = randv(M * ldx, 11), ws = randv(2 * F * K, 12), bs = randv(2 * F, 13);
  const Weight W = prepared(f32_weight(ws, {2 * F, K})), B = prepared(f32_weight(bs, {2 * F}));
  Tensor x = up(xs, {M, ldx});
  Tensor u = std::move(be->alloc({M, 2 * F}, "u")).value();
  Tensor out = up(std::vector<float>(M * ldo, 7.0f), {M, ldo});
  ASSERT_TRUE(be->linear_swiglu(x.view().col_range(3, 3 + K), W, &B, u, out.view().col_range(4, 4 + F)).ok());
  std::vector<double> want(M * ldo, 7.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < F; ++j) {
      double g = bs[j], v = bs[F + j];
      for (int64_t k = 0; k < K; ++k) {
        g += static_cast<double>(xs[m * ldx + 3 + k]) * ws[j * K + k];
        v += static_cast<double>(xs[m * ldx + 3 + k]) * ws[(F + j) * K + k];
      }
      want[m * ldo + 4 + j] = g / (1.0 + std::exp(-g)) * v;
    }
  expect_near(down(out), want, gemm_tol(), "linear_swiglu");  // columns outside the view stay 7
  // An odd row count (no [gate; up] split) and a u of the wrong shape are statuses.
  const Weight odd = prepared(f32_weight(ws, {2 * F - 1, K}));
  EXPECT_FALSE(be->linear_swiglu(x.view().col_range(3, 3 + K), odd, nullptr, u, out.view().col_range(4, 4 + F)).ok());
  Tensor small = std::move(be->alloc({M, F}, "u")).value();
  const Status s = be->linear_swiglu(x.view().col_range(3, 3 + K), W, nullptr, small, out.view().col_range(4, 4 + F));
  EXPECT_FALSE(s.ok());
}

// Under kFast the fused SwiGLU (where this CPU's kernels have one) gives the bits of linear then
// swiglu, on every ISA this CPU has; and its own shape checks return statuses.
TEST(CpuBackendPrecision, FastLinearSwigluEqualsLinearThenSwiglu) {
  const int64_t M = 37, K = 64, F = 40;
  const auto xs = randv(M * K, 21), ws = randv(2 * F * K, 22);
  std::vector<uint16_t> wb(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) wb[i] = f32_to_bf16(ws[i]);
  Weight W;
  W.name = "ff.linear_in.weight";
  W.dtype = DType::kBF16;
  W.shape = {2 * F, K};
  W.data = wb.data();
  W.nbytes = wb.size() * 2;
  for (Isa isa : CpuFeatures::host().isas()) {
    CpuBackend be(CpuBackendOptions{2, isa, kernels::Precision::kFast});
    auto x = be.upload(xs.data(), {M, K}, "x");
    auto u = be.alloc({M, 2 * F}, "u");
    auto a = be.alloc({M, F}, "a");
    auto b = be.alloc({M, F}, "b");
    ASSERT_TRUE(x.ok() && u.ok() && a.ok() && b.ok());
    ASSERT_TRUE(be.linear(x->view(), W, nullptr, u->view()).ok());
    ASSERT_TRUE(be.swiglu(u->view().col_range(0, F), u->view().col_range(F, 2 * F), a->view()).ok());
    ASSERT_TRUE(be.linear_swiglu(x->view(), W, nullptr, u->view(), b->view()).ok());
    for (int64_t i = 0; i < M * F; ++i) ASSERT_EQ(a->data()[i], b->data()[i]) << i << " on " << isa_name(isa);
    auto small = be.alloc({M, F}, "u");
    ASSERT_TRUE(small.ok());
    EXPECT_FALSE(be.linear_swiglu(x->view(), W, nullptr, small->view(), b->view()).ok()) << isa_name(isa);
    EXPECT_FALSE(be.linear_swiglu(x->view(), W, nullptr, u->view(), u->view()).ok()) << isa_name(isa);
  }
}

// The precision choice reaches the kernels: kFast computes a Q8_ROW linear as W8A8 (bit-equal
// to ref::linear_w8a8, see test_kernels.cpp) and says so in describe(); kFp32 computes it from the
// dequantised weights.
TEST(CpuBackendPrecision, FastComputesQ8RowAsW8A8) {
  const int64_t M = 9, K = 40, N = 13;
  const auto xs = randv(M * K, 4);
  std::vector<int8_t> q(N * K);
  std::mt19937 rng(5);
  for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  const auto sc = randv(N, 6, 0.01f, 0.02f);
  Weight W;
  W.name = "q8.weight";
  W.dtype = DType::kQ8Row;
  W.shape = {N, K};
  W.data = q.data();
  W.nbytes = q.size();
  W.scales = sc.data();
  std::vector<float> w8a8(M * N), exact(M * N);
  kernels::ref::linear_w8a8(xs.data(), M, K, W, nullptr, w8a8.data());
  kernels::ref::linear(xs.data(), M, K, W, nullptr, exact.data());
  for (auto precision : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
    CpuBackend be(CpuBackendOptions{2, Isa::kCount, precision});
    EXPECT_EQ(be.kernels().precision(), precision);
    EXPECT_NE(be.describe().find(precision == kernels::Precision::kFast ? "precision fast" : "precision fp32"),
              std::string::npos);
    auto x = be.upload(xs.data(), {M, K}, "x");
    auto y = be.alloc({M, N}, "y");
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_TRUE(be.linear(x->view(), W, nullptr, y->view()).ok());
    for (int64_t i = 0; i < M * N; ++i) {
      if (precision == kernels::Precision::kFast)
        ASSERT_EQ(y->data()[i], w8a8[i]) << i;
      else
        ASSERT_NEAR(y->data()[i], exact[i], 1e-5f * std::max(1.0f, std::fabs(exact[i]))) << i;
    }
  }
}

TEST_P(BackendOps, AttentionCausalMaskedGqa) {
  const int64_t S = 9, D = 8;
  const int Hq = 4, Hkv = 2;
  const auto qs = randv(S * Hq * D, 4), ks = randv(S * Hkv * D, 5), vs = randv(S * Hkv * D, 6);
  std::vector<uint8_t> valid(S, 1);
  valid[2] = 0;
  Tensor q = up(qs, {S, Hq * D}), k = up(ks, {S, Hkv * D}), v = up(vs, {S, Hkv * D});
  auto out = be->alloc({S, Hq * D}, "out");
  ASSERT_TRUE(out.ok());
  const float scale = 0.3f;
  ASSERT_TRUE(be->attention(q, k, v, *out, Hq, Hkv, scale, AttnMask{true, valid.data()}).ok());
  std::vector<double> want(S * Hq * D, 0.0);
  for (int h = 0; h < Hq; ++h) {
    const int g = h / (Hq / Hkv);
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> p(S, 0.0);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        if (!valid[j]) continue;
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += static_cast<double>(qs[(i * Hq + h) * D + d]) * ks[(j * Hkv + g) * D + d];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      for (int64_t j = 0; j <= i; ++j)
        if (valid[j]) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t j = 0; j <= i; ++j)
        if (valid[j])
          for (int64_t d = 0; d < D; ++d) want[(i * Hq + h) * D + d] += p[j] / sum * vs[(j * Hkv + g) * D + d];
    }
  }
  expect_near(down(*out), want, gemm_tol(), "attention");
}

// Non-finite scores (issue 41: a corrupt Q / K weight) must reach the output on every backend:
// a (query, head) row whose visible scores hold a NaN or make the softmax undefined (+inf) is
// NaN in all D values; a masked key's NaN never counts; a row the mask leaves no key is zeros;
// every other row is the formula's.
TEST_P(BackendOps, AttentionNonFiniteScoresGiveNaNRows) {
  const int64_t S = 9, D = 8;
  const int Hq = 4, Hkv = 2;
  auto qs = randv(S * Hq * D, 14), ks = randv(S * Hkv * D, 15);
  const auto vs = randv(S * Hkv * D, 16);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  qs[(3 * Hq + 1) * D + 2] = nan;                                 // query 3, head 1
  qs[(4 * Hq + 3) * D + 5] = std::numeric_limits<float>::infinity();  // query 4, head 3
  ks[(6 * Hkv + 0) * D + 1] = nan;                                // key 6 of kv head 0: queries ≥ 6, heads 0-1
  ks[(2 * Hkv + 1) * D + 4] = nan;                                // key 2, masked
  ks[(0 * Hkv + 1) * D + 0] = nan;                                // key 0, masked: query 0 sees no key
  std::vector<uint8_t> valid(S, 1);
  valid[0] = valid[2] = 0;
  auto nan_row = [](int64_t i, int h) { return (i == 3 && h == 1) || (i == 4 && h == 3) || (i >= 6 && h < 2); };
  Tensor q = up(qs, {S, Hq * D}), k = up(ks, {S, Hkv * D}), v = up(vs, {S, Hkv * D});
  auto out = be->alloc({S, Hq * D}, "out");
  ASSERT_TRUE(out.ok());
  const float scale = 0.3f;
  ASSERT_TRUE(be->attention(q, k, v, *out, Hq, Hkv, scale, AttnMask{true, valid.data()}).ok());
  const std::vector<float> got = down(*out);
  for (int h = 0; h < Hq; ++h) {
    const int g = h / (Hq / Hkv);
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> p(S, 0.0), want(D, 0.0);
      double mx = -1e300, sum = 0;
      for (int64_t j = 1; j <= i; ++j) {
        if (!valid[j]) continue;
        double sc = 0;
        for (int64_t d = 0; d < D; ++d) sc += static_cast<double>(qs[(i * Hq + h) * D + d]) * ks[(j * Hkv + g) * D + d];
        mx = std::max(mx, p[j] = sc * scale);
      }
      for (int64_t j = 1; j <= i; ++j)
        if (valid[j]) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t j = 1; j <= i; ++j)
        if (valid[j])
          for (int64_t d = 0; d < D; ++d) want[d] += p[j] / sum * vs[(j * Hkv + g) * D + d];
      for (int64_t d = 0; d < D; ++d) {
        const float o = got[(i * Hq + h) * D + d];
        if (nan_row(i, h)) {
          ASSERT_TRUE(std::isnan(o)) << "query " << i << " head " << h << " on " << GetParam().name << ": " << o;
        } else {
          ASSERT_TRUE(std::isfinite(o)) << "query " << i << " head " << h << " on " << GetParam().name;
          ASSERT_NEAR(o, want[d], gemm_tol()) << "query " << i << " head " << h << " on " << GetParam().name;
        }
      }
    }
  }
}

TEST_P(BackendOps, Conv2dWithPrologueUpsampleAndAccumulate) {
  const int64_t C = 3, H = 5, W = 4, Co = 2;
  const auto xs = randv(C * H * W, 7), ws = randv(Co * C * 9, 8), bs = randv(Co, 9);
  const auto sc = randv(C, 10, 0.5f, 1.5f), sh = randv(C, 11);
  const Weight Wt = prepared(f32_weight(ws, {Co, C, 3, 3})), B = prepared(f32_weight(bs, {Co}));
  ConvOptions o = ConvOptions::same(3);
  o.upsample2x = true;
  o.in_silu = true;
  o.accumulate = true;
  Tensor x = up(xs, {1, C, H, W}), scale = up(sc, {C}), shift = up(sh, {C});
  o.in_scale = scale;
  o.in_shift = shift;
  const auto init = randv(Co * 2 * H * 2 * W, 12);
  Tensor y = up(init, {1, Co, 2 * H, 2 * W});
  ASSERT_TRUE(be->conv2d(x, Wt, &B, y, o).ok());
  std::vector<double> want(init.begin(), init.end());
  auto in_at = [&](int64_t c, int64_t yy, int64_t xx) -> double {  // upsampled, prologue, zero pad
    if (yy < 0 || xx < 0 || yy >= 2 * H || xx >= 2 * W) return 0.0;
    const double v = sc[c] * static_cast<double>(xs[(c * H + yy / 2) * W + xx / 2]) + sh[c];
    return v / (1.0 + std::exp(-v));
  };
  for (int64_t co = 0; co < Co; ++co)
    for (int64_t yy = 0; yy < 2 * H; ++yy)
      for (int64_t xx = 0; xx < 2 * W; ++xx) {
        double s = bs[co];
        for (int64_t c = 0; c < C; ++c)
          for (int ky = 0; ky < 3; ++ky)
            for (int kx = 0; kx < 3; ++kx) s += ws[((co * C + c) * 3 + ky) * 3 + kx] * in_at(c, yy + ky - 1, xx + kx - 1);
        want[(co * 2 * H + yy) * 2 * W + xx] += s;
      }
  expect_near(down(y), want, gemm_tol(), "conv2d");
}

TEST_P(BackendOps, Norms) {
  const int64_t R = 5, C = 24;
  const auto xs = randv(R * C, 13, -3.0f, 3.0f), ws = randv(C, 14), bs = randv(C, 15);
  Tensor x = up(xs, {R, C}), w = up(ws, {C}), b = up(bs, {C});
  auto stats = [&](int64_t r, double* mean, double* var, double* ms) {
    double s = 0, ss = 0, q = 0;
    for (int64_t i = 0; i < C; ++i) s += xs[r * C + i], q += static_cast<double>(xs[r * C + i]) * xs[r * C + i];
    *mean = s / C;
    for (int64_t i = 0; i < C; ++i) ss += (xs[r * C + i] - *mean) * (xs[r * C + i] - *mean);
    *var = ss / C;
    *ms = q / C;
  };
  const float eps = 1e-5f;
  Tensor y = std::move(be->alloc({R, C}, "y")).value();
  std::vector<double> rms(R * C), ln(R * C), mod(R * C);
  for (int64_t r = 0; r < R; ++r) {
    double mean, var, ms;
    stats(r, &mean, &var, &ms);
    for (int64_t i = 0; i < C; ++i) {
      rms[r * C + i] = xs[r * C + i] / std::sqrt(ms + eps) * ws[i];
      const double n = (xs[r * C + i] - mean) / std::sqrt(var + eps);
      ln[r * C + i] = n * ws[i] + bs[i];
      mod[r * C + i] = n * ws[i] + bs[i];  // onep = w, shift = b
    }
  }
  ASSERT_TRUE(be->rms_norm(x, y, w, eps).ok());
  expect_near(down(y), rms, 2e-6, "rms_norm");
  ASSERT_TRUE(be->layer_norm(x, y, w, b, eps).ok());
  expect_near(down(y), ln, 2e-6, "layer_norm");
  ASSERT_TRUE(be->modulated_layer_norm(x, y, w, b, eps).ok());
  expect_near(down(y), mod, 2e-6, "modulated_layer_norm");
}

TEST_P(BackendOps, GroupNormAffine) {
  const int64_t C = 6, HW = 10, G = 3;
  const auto xs = randv(C * HW, 16, -2.0f, 4.0f), gs = randv(C, 17), bs = randv(C, 18);
  Tensor x = up(xs, {1, C, 2, 5}), scale = std::move(be->alloc({C}, "s")).value(),
         shift = std::move(be->alloc({C}, "s")).value();
  ASSERT_TRUE(be->group_norm_affine(x, prepared(f32_weight(gs, {C})), prepared(f32_weight(bs, {C})), G, 1e-6, scale,
                                    shift).ok());
  std::vector<double> want_s(C), want_b(C);
  for (int64_t g = 0; g < G; ++g) {
    double s = 0, ss = 0;
    const int64_t n = C / G * HW;
    for (int64_t i = 0; i < n; ++i) s += xs[g * n + i];
    const double mean = s / n;
    for (int64_t i = 0; i < n; ++i) ss += (xs[g * n + i] - mean) * (xs[g * n + i] - mean);
    const double rstd = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t c = g * C / G; c < (g + 1) * C / G; ++c) {
      want_s[c] = gs[c] * rstd;
      want_b[c] = bs[c] - mean * want_s[c];
    }
  }
  expect_near(down(scale), want_s, 2e-6, "group_norm scale");
  expect_near(down(shift), want_b, 2e-6, "group_norm shift");
}

// The tiled GroupNorm: statistics accumulated over three row bands of x (as tiles) give the
// affine of the whole tensor; the bands are uneven and the values offset (mean ≫ spread) so a
// naive Σx² formula would lose digits.
TEST_P(BackendOps, GroupNormStatsOverTiles) {
  const int64_t C = 6, H = 7, W = 5, G = 3, HW = H * W;
  const auto xs = randv(C * HW, 19, 99.0f, 101.0f), gs = randv(C, 20), bs = randv(C, 21);
  GroupStats acc;
  for (auto [y0, y1] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {3, 7}}) {
    std::vector<float> band;
    for (int64_t c = 0; c < C; ++c) band.insert(band.end(), xs.begin() + c * HW + y0 * W, xs.begin() + c * HW + y1 * W);
    ASSERT_TRUE(be->group_norm_stats(up(band, {1, C, y1 - y0, W}), G, acc).ok());
  }
  Tensor scale = std::move(be->alloc({C}, "s")).value(), shift = std::move(be->alloc({C}, "s")).value();
  ASSERT_TRUE(be->group_norm_affine_from_stats(acc, prepared(f32_weight(gs, {C})), prepared(f32_weight(bs, {C})), 1e-6,
                                               scale, shift).ok());
  std::vector<double> want_s(C), want_b(C);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = C / G * HW;
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i) s += xs[g * n + i];
    const double mean = s / n;
    for (int64_t i = 0; i < n; ++i) ss += (xs[g * n + i] - mean) * (xs[g * n + i] - mean);
    EXPECT_EQ(acc.count[g], n);
    EXPECT_NEAR(acc.mean[g], mean, 1e-12 * mean);
    EXPECT_NEAR(acc.m2[g], ss, 1e-9 * ss);
    const double rstd = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t c = g * C / G; c < (g + 1) * C / G; ++c) {
      want_s[c] = gs[c] * rstd;
      want_b[c] = bs[c] - mean * want_s[c];
    }
  }
  expect_near(down(scale), want_s, 2e-6, "group_norm_stats scale");
  expect_near(down(shift), want_b, 2e-6, "group_norm_stats shift");
  // Misuse is a status, not a crash: a group count the accumulator was not sized for.
  EXPECT_FALSE(be->group_norm_stats(up(xs, {1, C, H, W}), 2, acc).ok());
}

TEST_P(BackendOps, RopeHalfInterleavedAndQkNorm) {
  const int64_t L = 3, D = 8;
  const int H = 2;
  const auto xs = randv(L * H * D, 19), half_c = randv(L * D / 2, 20), half_s = randv(L * D / 2, 21);
  const auto full_c = randv(L * D, 22), full_s = randv(L * D, 23), nw = randv(D, 24);
  {
    Tensor x = up(xs, {L, H * D}), c = up(half_c, {L, D / 2}), s = up(half_s, {L, D / 2});
    ASSERT_TRUE(be->rope_half(x, H, c, s).ok());
    std::vector<double> want(xs.begin(), xs.end());
    for (int64_t l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int64_t d = 0; d < D / 2; ++d) {
          const double a = xs[(l * H + h) * D + d], b = xs[(l * H + h) * D + d + D / 2];
          const double cc = half_c[l * D / 2 + d], ss = half_s[l * D / 2 + d];
          want[(l * H + h) * D + d] = a * cc - b * ss;
          want[(l * H + h) * D + d + D / 2] = b * cc + a * ss;
        }
    expect_near(down(x), want, 2e-6, "rope_half");
  }
  auto interleaved = [&](std::vector<double> v) {
    for (int64_t l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int64_t j = 0; j < D; j += 2) {
          double* p = &v[(l * H + h) * D + j];
          const double a = p[0], b = p[1];
          p[0] = a * full_c[l * D + j] - b * full_s[l * D + j];
          p[1] = b * full_c[l * D + j + 1] + a * full_s[l * D + j + 1];
        }
    return v;
  };
  Tensor c = up(full_c, {L, D}), s = up(full_s, {L, D});
  {
    Tensor x = up(xs, {L, H * D});
    ASSERT_TRUE(be->rope_interleaved(x, H, c, s).ok());
    expect_near(down(x), interleaved(std::vector<double>(xs.begin(), xs.end())), 2e-6, "rope_interleaved");
  }
  {
    Tensor x = up(xs, {L, H * D}), w = up(nw, {D});
    ASSERT_TRUE(be->qk_norm_rope(x, H, w, 1e-6f, c, s).ok());
    std::vector<double> n(xs.size());
    for (int64_t r = 0; r < L * H; ++r) {
      double q = 0;
      for (int64_t d = 0; d < D; ++d) q += static_cast<double>(xs[r * D + d]) * xs[r * D + d];
      for (int64_t d = 0; d < D; ++d) n[r * D + d] = xs[r * D + d] / std::sqrt(q / D + 1e-6) * nw[d];
    }
    expect_near(down(x), interleaved(n), 2e-6, "qk_norm_rope");
  }
}

TEST_P(BackendOps, ElementWise) {
  const int64_t R = 4, C = 10;
  const auto as = randv(R * 2 * C, 25, -4.0f, 4.0f), bs = randv(R * C, 26), gs = randv(C, 27), rs = randv(R, 28);
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  {  // swiglu on the two halves of one [R, 2C] projection
    Tensor a = up(as, {R, 2 * C});
    Tensor out = std::move(be->alloc({R, C}, "o")).value();
    ASSERT_TRUE(be->swiglu(a.view().col_range(0, C), a.view().col_range(C, 2 * C), out).ok());
    std::vector<double> want(R * C);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < C; ++i) want[r * C + i] = silu(as[r * 2 * C + i]) * as[r * 2 * C + C + i];
    expect_near(down(out), want, 2e-6, "swiglu");
  }
  {  // gated_add, add, add_scalar, silu, scale_shift (both axes)
    Tensor h = up(bs, {R, C}), o = up(std::vector<float>(as.begin(), as.begin() + R * C), {R, C}), g = up(gs, {C});
    std::vector<double> want(R * C);
    for (int64_t i = 0; i < R * C; ++i) want[i] = bs[i] + static_cast<double>(gs[i % C]) * as[i];
    ASSERT_TRUE(be->gated_add(h, o, g).ok());
    expect_near(down(h), want, 2e-6, "gated_add");
    for (int64_t i = 0; i < R * C; ++i) want[i] += as[i];
    ASSERT_TRUE(be->add(h, o).ok());
    expect_near(down(h), want, 2e-6, "add");
    for (auto& v : want) v = 1.0 + v;
    ASSERT_TRUE(be->add_scalar(h, 1.0f, h).ok());
    expect_near(down(h), want, 2e-6, "add_scalar");
    for (auto& v : want) v = silu(v);
    ASSERT_TRUE(be->silu(h).ok());
    expect_near(down(h), want, 2e-6, "silu");
    Tensor sc = up(gs, {C}), sh = up(std::vector<float>(gs.rbegin(), gs.rend()), {C});
    const auto before = down(h);
    ASSERT_TRUE(be->scale_shift(h, h, sc, sh, false).ok());
    for (int64_t i = 0; i < R * C; ++i) want[i] = before[i] * static_cast<double>(gs[i % C]) + gs[C - 1 - i % C];
    expect_near(down(h), want, 2e-6, "scale_shift columns");
    Tensor rsc = up(rs, {R}), rsh = up(rs, {R});
    const auto before2 = down(h);
    ASSERT_TRUE(be->scale_shift(h, h, rsc, rsh, true).ok());
    for (int64_t i = 0; i < R * C; ++i) want[i] = before2[i] * static_cast<double>(rs[i / C]) + rs[i / C];
    expect_near(down(h), want, 2e-6, "scale_shift rows");
  }
}

// Every element-wise op on column windows of wider buffers (row stride ≠ width, a window that
// starts at an odd column), at widths that leave a tail for 8- and 16-lane vectors, and at a size
// the backend splits over its threads; cells outside the windows must keep their sentinel.
TEST_P(BackendOps, ElementWiseOddWidthsOnStridedViews) {
  constexpr float kSentinel = 9.0f;
  constexpr int64_t kOff = 3, kExtra = 6;  // window columns [3, 3 + C) of rows C + 6 wide
  for (const auto& shape : {std::tuple<int64_t, int, int64_t>{5, 3, 6}, {3, 1, 38}, {40, 5, 622}}) {
    // Plain variables, not a structured binding: the lambdas below capture them (clang 14).
    const int64_t R = std::get<0>(shape), D = std::get<2>(shape);
    const int heads = std::get<1>(shape);
    const int64_t C = heads * D, ld = C + kExtra;
    auto window = [&](const std::vector<float>& v) {  // [R, ld] with v in the window
      std::vector<float> full(R * ld, kSentinel);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) full[r * ld + kOff + c] = v[r * C + c];
      return full;
    };
    auto check = [&](const Tensor& t, const std::vector<double>& want, const char* what) {
      const auto got = down(t);
      std::vector<float> in(R * C);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < ld; ++c) {
          if (c >= kOff && c < kOff + C) in[r * C + c - kOff] = got[r * ld + c];
          else ASSERT_EQ(got[r * ld + c], kSentinel) << what << ": wrote outside the view, C=" << C;
        }
      expect_near(in, want, 2e-6, what);
    };
    const auto xs = randv(R * C, 40, -3.0f, 3.0f), os = randv(R * C, 41), ws = randv(C, 42), bs = randv(C, 43);
    Tensor xt = up(window(xs), {R, ld}), yt = up(std::vector<float>(R * ld, kSentinel), {R, ld});
    const TensorView x = xt.view().col_range(kOff, kOff + C), y = yt.view().col_range(kOff, kOff + C);
    Tensor w = up(ws, {C}), b = up(bs, {C});
    const float eps = 1e-6f;
    std::vector<double> want(R * C);
    // Norms (x → y, different buffers, both strided).
    for (int64_t r = 0; r < R; ++r) {
      double q = 0, s = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) q += double(xs[r * C + c]) * xs[r * C + c], s += xs[r * C + c];
      const double mean = s / C;
      for (int64_t c = 0; c < C; ++c) v += (xs[r * C + c] - mean) * (xs[r * C + c] - mean);
      for (int64_t c = 0; c < C; ++c) want[r * C + c] = xs[r * C + c] / std::sqrt(q / C + eps) * ws[c];
    }
    ASSERT_TRUE(be->rms_norm(x, y, w, eps).ok());
    check(yt, want, "rms_norm");
    for (int64_t r = 0; r < R; ++r) {
      double s = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) s += xs[r * C + c];
      const double mean = s / C;
      for (int64_t c = 0; c < C; ++c) v += (xs[r * C + c] - mean) * (xs[r * C + c] - mean);
      for (int64_t c = 0; c < C; ++c) want[r * C + c] = (xs[r * C + c] - mean) / std::sqrt(v / C + eps) * ws[c] + bs[c];
    }
    ASSERT_TRUE(be->layer_norm(x, y, w, b, eps).ok());
    check(yt, want, "layer_norm");
    ASSERT_TRUE(be->modulated_layer_norm(x, y, w, b, eps).ok());
    check(yt, want, "modulated_layer_norm");
    // RoPE: half-split tables [R, D/2], interleaved [R, D]; qk_norm_rope with weight [D].
    const auto ch = randv(R * D / 2, 44), sh = randv(R * D / 2, 45), cf = randv(R * D, 46), sf = randv(R * D, 47);
    {
      Tensor t = up(window(xs), {R, ld}), c = up(ch, {R, D / 2}), s = up(sh, {R, D / 2});
      ASSERT_TRUE(be->rope_half(t.view().col_range(kOff, kOff + C), heads, c, s).ok());
      for (int64_t r = 0; r < R; ++r)
        for (int h = 0; h < heads; ++h)
          for (int64_t d = 0; d < D / 2; ++d) {
            const int64_t i = r * C + h * D + d, j = i + D / 2;
            const double cc = ch[r * D / 2 + d], ss = sh[r * D / 2 + d];
            want[i] = xs[i] * cc - xs[j] * ss;
            want[j] = xs[j] * cc + xs[i] * ss;
          }
      check(t, want, "rope_half");
    }
    auto interleaved = [&](const std::vector<double>& v) {
      std::vector<double> o(v.size());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; c += 2) {
          const int64_t i = r * C + c, d = c % D;
          o[i] = v[i] * cf[r * D + d] - v[i + 1] * sf[r * D + d];
          o[i + 1] = v[i + 1] * cf[r * D + d + 1] + v[i] * sf[r * D + d + 1];
        }
      return o;
    };
    Tensor cft = up(cf, {R, D}), sft = up(sf, {R, D});
    {
      Tensor t = up(window(xs), {R, ld});
      ASSERT_TRUE(be->rope_interleaved(t.view().col_range(kOff, kOff + C), heads, cft, sft).ok());
      check(t, interleaved(std::vector<double>(xs.begin(), xs.end())), "rope_interleaved");
    }
    {
      Tensor t = up(window(xs), {R, ld}), hw = up(std::vector<float>(ws.begin(), ws.begin() + D), {D});
      ASSERT_TRUE(be->qk_norm_rope(t.view().col_range(kOff, kOff + C), heads, hw, eps, cft, sft).ok());
      std::vector<double> n(R * C);
      for (int64_t r = 0; r < R; ++r)
        for (int h = 0; h < heads; ++h) {
          double q = 0;
          for (int64_t d = 0; d < D; ++d) q += double(xs[r * C + h * D + d]) * xs[r * C + h * D + d];
          for (int64_t d = 0; d < D; ++d) n[r * C + h * D + d] = xs[r * C + h * D + d] / std::sqrt(q / D + eps) * ws[d];
        }
      check(t, interleaved(n), "qk_norm_rope");
    }
    // Activations and residuals, in place on the strided x window.
    auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
    Tensor ot = up(window(os), {R, ld});
    const TensorView o = ot.view().col_range(kOff, kOff + C);
    ASSERT_TRUE(be->swiglu(x, o, y).ok());
    for (int64_t i = 0; i < R * C; ++i) want[i] = silu(xs[i]) * os[i];
    check(yt, want, "swiglu");
    std::vector<double> h(xs.begin(), xs.end());
    ASSERT_TRUE(be->gated_add(x, o, w).ok());
    for (int64_t i = 0; i < R * C; ++i) h[i] += double(ws[i % C]) * os[i];
    check(xt, h, "gated_add");
    ASSERT_TRUE(be->add(x, o).ok());
    for (int64_t i = 0; i < R * C; ++i) h[i] += os[i];
    check(xt, h, "add");
    ASSERT_TRUE(be->add_scalar(x, -0.5f, y).ok());
    for (int64_t i = 0; i < R * C; ++i) want[i] = h[i] - 0.5;
    check(yt, want, "add_scalar");
    ASSERT_TRUE(be->silu(y).ok());
    for (auto& v : want) v = silu(v);
    check(yt, want, "silu");
    ASSERT_TRUE(be->scale_shift(x, y, w, b, false).ok());
    const auto hx = down(xt);
    for (int64_t i = 0; i < R * C; ++i) want[i] = double(hx[(i / C) * ld + kOff + i % C]) * ws[i % C] + bs[i % C];
    check(yt, want, "scale_shift columns");
    const auto rs = randv(R, 48), rt = randv(R, 49);
    ASSERT_TRUE(be->scale_shift(x, y, up(rs, {R}), up(rt, {R}), true).ok());
    for (int64_t i = 0; i < R * C; ++i) want[i] = double(hx[(i / C) * ld + kOff + i % C]) * rs[i / C] + rt[i / C];
    check(yt, want, "scale_shift rows");
  }
}

TEST_P(BackendOps, CopyTransposeGatherFinite) {
  const int64_t R = 5, C = 7;
  const auto xs = randv(R * C, 29);
  Tensor x = up(xs, {R, C});
  Tensor big = up(std::vector<float>(R * 12, 0.0f), {R, 12});
  ASSERT_TRUE(be->copy(x, big.view().col_range(4, 4 + C)).ok());
  const auto b = down(big);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < 12; ++c) ASSERT_EQ(b[r * 12 + c], (c >= 4 && c < 4 + C) ? xs[r * C + c - 4] : 0.0f);
  Tensor t = up(std::vector<float>(C * R, 1.0f), {C, R});
  ASSERT_TRUE(be->transpose(x, t, /*accumulate=*/true).ok());
  const auto tt = down(t);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(tt[c * R + r], 1.0f + xs[r * C + c]);
  // gather_rows from a bf16 table (an embedding lookup).
  std::vector<uint16_t> table(6 * C);
  for (size_t i = 0; i < table.size(); ++i) table[i] = f32_to_bf16(xs[i % xs.size()]);
  Weight tw;
  tw.name = "embed";
  tw.dtype = DType::kBF16;
  tw.shape = {6, C};
  tw.data = table.data();
  tw.nbytes = table.size() * 2;
  tw = prepared(tw);
  Tensor g = std::move(be->alloc({3, C}, "g")).value();
  ASSERT_TRUE(be->gather_rows(tw, {5, 0, 5}, g).ok());
  const auto gg = down(g);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(gg[c], bf16_to_f32(table[5 * C + c]));
    EXPECT_EQ(gg[C + c], bf16_to_f32(table[c]));
  }
  EXPECT_FALSE(be->gather_rows(tw, {6}, g.view().row_range(0, 1)).ok());  // out of range: a status
  EXPECT_TRUE(*be->all_finite(x));
  std::vector<float> nan = xs;
  nan[R * C - 1] = std::nanf("");
  Tensor xn = up(nan, {R, C});
  EXPECT_FALSE(*be->all_finite(xn));
  EXPECT_TRUE(*be->all_finite(xn.view().col_range(0, C - 1)));  // the NaN is outside the view
}

TEST_P(BackendOps, InconsistentViewsAreStatusesNotCrashes) {
  const auto xs = randv(12, 30), ws = randv(12, 31);
  Tensor x = up(xs, {3, 4}), y = up(xs, {4, 3});
  const Weight W = prepared(f32_weight(ws, {3, 4}));
  const Status s = be->linear(x, W, nullptr, y);  // y should be [3, 3]
  EXPECT_EQ(s.code(), Code::kInternal);
  EXPECT_NE(s.message().find("linear"), std::string::npos) << s.message();
  EXPECT_EQ(be->add(x, y).code(), Code::kInternal);
  EXPECT_EQ(be->rms_norm(x, x, y, 1e-6f).code(), Code::kInternal);  // weight of the wrong size
  auto overflow = be->alloc({int64_t{1} << 40, int64_t{1} << 30}, "an overflowing shape");
  EXPECT_FALSE(overflow.ok());
  // 4 TiB: more than any machine this runs on — refused with how much and what for. (Where the
  // kernel overcommits unconditionally the allocation would "succeed" and zero-filling it would
  // exhaust memory, so that configuration skips this part.)
  std::ifstream oc("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  if (oc >> mode && mode == 1) GTEST_SKIP() << "vm.overcommit_memory = 1";
  auto huge = be->alloc({int64_t{1} << 20, int64_t{1} << 20}, "an impossible tensor");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), Code::kOutOfMemory);
  EXPECT_EQ(huge.status().to_string(), "out of memory: 4096.00 GiB needed for an impossible tensor");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendOps, ::testing::ValuesIn(all_backends()),
                         [](const ::testing::TestParamInfo<BackendCase>& i) { return i.param.name; });

}  // namespace
}  // namespace klein
