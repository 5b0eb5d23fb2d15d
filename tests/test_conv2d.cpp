// conv2d: the scalar reference against hand-computed values, then the kernel selected for every
// ISA this CPU has (the portable blocked path for scalar, AVX2 implicit GEMM above) against the
// reference over kernel sizes, strides, asymmetric padding, upsampling, prologues, accumulation,
// weight dtypes and thread counts.
// Tolerance as for the other kernels: max|fast − ref| ≤ 1e-5 · max(1, max|ref|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/conv2d.h"
#include "kernels/registry.h"
#include "testing.h"
#if defined(KLEIN_X86)
#include "kernels/cpu/conv2d_kernels.h"
#endif

namespace klein {
namespace {

struct OwnedWeight {
  Weight w;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<uint8_t> u8;
  std::vector<float> scales, offsets;
};

// The values in `vals` rounded to the weight format `dt`. The 8-bit and 4-bit formats take
// payload bytes derived from the values instead (their exact decoded values do not matter: the
// reference reads the same bytes): F8_E4M3 (and its scaled form) with the top exponent bit clear
// (|v| < 2, never NaN),
// Q8_ROW / Q4_G64 / Q8_G64 with small random-ish scales (and offsets).
OwnedWeight make_weight(DType dt, const Shape& shape, const std::vector<float>& vals) {
  OwnedWeight o;
  o.w.name = "test.conv.weight";
  o.w.dtype = dt;
  o.w.shape = shape;
  const bool f8 = dt == DType::kF8E4M3 || dt == DType::kF8E4M3Scaled;
  const bool ggml = format_traits(dt).scales == ScalePlace::kInBlock;
  if (f8 || dt == DType::kQ8Row || dt == DType::kQ4G64 || dt == DType::kQ8G64 || ggml) {
    const int64_t rows = o.w.rows(), cols = o.w.cols();
    o.u8.resize(rows * format_row_bytes(dt, cols));
    for (size_t i = 0; i < o.u8.size(); ++i) {
      const auto b = static_cast<uint8_t>(static_cast<int>(vals[i % vals.size()] * 1000.0f + 1000.0f) & 0xff);
      o.u8[i] = f8 ? (b & 0xbf) : b;
    }
    o.w.data = o.u8.data();
    o.w.nbytes = o.u8.size();
    testing::make_ggml_blocks_valid(dt, o.u8.data(), o.u8.size(), 5);  // finite fp16 scales in each block
    if (ggml) return o;
    const int64_t ns = dt == DType::kQ8Row ? rows : dt == DType::kF8E4M3Scaled ? 1 : rows * cols / 64;
    for (int64_t i = 0; i < ns; ++i) {
      o.scales.push_back(0.002f + 0.001f * static_cast<float>(i % 7));
      o.offsets.push_back(-0.05f + 0.01f * static_cast<float>(i % 11));
    }
    o.w.scales = o.scales.data();
    o.w.offsets = o.offsets.data();
    return o;
  }
  if (dt == DType::kF32) {
    o.f32 = vals;
    o.w.data = o.f32.data();
  } else {
    o.u16.resize(vals.size());
    for (size_t i = 0; i < vals.size(); ++i)
      o.u16[i] = dt == DType::kBF16 ? f32_to_bf16(vals[i]) : f32_to_f16(vals[i]);
    o.w.data = o.u16.data();
  }
  return o;
}

std::vector<float> random_vec(int64_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Conv2dRef, HandComputed) {
  // 1 channel 3×3 input 1..9, 3×3 kernel of ones with padding 1: each output is the sum of the
  // in-bounds neighbourhood. Bias 0.5.
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto w = make_weight(DType::kF32, {1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  auto b = make_weight(DType::kF32, {1}, {0.5f});
  std::vector<float> y(9);
  kernels::ref::conv2d(x.data(), 1, 1, 3, 3, w.w, &b.w, y.data(), kernels::Conv2dParams::same(3));
  EXPECT_EQ(y, (std::vector<float>{12.5f, 21.5f, 16.5f, 27.5f, 45.5f, 33.5f, 24.5f, 39.5f, 28.5f}));

  // Downsample2D: pad right/bottom by 1, stride 2, 3×3 ones: 4×4 input → 2×2 output.
  std::vector<float> x4(16);
  for (int i = 0; i < 16; ++i) x4[i] = static_cast<float>(i);
  kernels::Conv2dParams pd;
  pd.stride = 2;
  pd.pad_bottom = pd.pad_right = 1;
  ASSERT_EQ(kernels::conv2d_out_size(4, 3, 2, 0, 1, false), 2);
  std::vector<float> y2(4);
  kernels::ref::conv2d(x4.data(), 1, 1, 4, 4, w.w, nullptr, y2.data(), pd);
  // out(0,0) = rows 0-2 cols 0-2: 0+1+2+4+5+6+8+9+10 = 45; out(0,1) = cols 2-3 (+pad) rows 0-2:
  // 2+3+6+7+10+11 = 39; out(1,0) = rows 2-3: 8+9+10+12+13+14 = 66; out(1,1) = 10+11+14+15 = 50.
  EXPECT_EQ(y2, (std::vector<float>{45, 39, 66, 50}));

  // Upsample ×2 then 1×1 conv with weight 2: every input value appears in a 2×2 block, doubled.
  auto w1 = make_weight(DType::kF32, {1, 1, 1, 1}, {2.0f});
  kernels::Conv2dParams pu;
  pu.upsample2x = true;
  std::vector<float> x2 = {1, 2, 3, 4}, y4(16);
  kernels::ref::conv2d(x2.data(), 1, 1, 2, 2, w1.w, nullptr, y4.data(), pu);
  EXPECT_EQ(y4, (std::vector<float>{2, 2, 4, 4, 2, 2, 4, 4, 6, 6, 8, 8, 6, 6, 8, 8}));

  // Prologue: scale 2, shift -1, SiLU; padding stays zero (not silu(shift)).
  kernels::Conv2dParams pp = kernels::Conv2dParams::same(3);
  const float sc = 2.0f, sh = -1.0f;
  pp.in_scale = &sc;
  pp.in_shift = &sh;
  pp.in_silu = true;
  std::vector<float> x1 = {0.25f}, y1(1);
  kernels::ref::conv2d(x1.data(), 1, 1, 1, 1, w.w, nullptr, y1.data(), pp);
  const float v = 2.0f * 0.25f - 1.0f;
  EXPECT_NEAR(y1[0], v / (1 + std::exp(-v)), 1e-7);
}

struct ConvCase {
  int64_t N, Cin, H, W, Cout, KH, KW;
  int stride, pt, pb, pl, pr;
  bool up, prologue, silu, accumulate, bias;
};

float check_case(const kernels::KernelSet& set, const ConvCase& c, DType dt, ThreadPool& pool, std::mt19937& rng) {
  const auto x = random_vec(c.N * c.Cin * c.H * c.W, rng, -2, 2);
  auto w = make_weight(dt, {c.Cout, c.Cin, c.KH, c.KW}, random_vec(c.Cout * c.Cin * c.KH * c.KW, rng));
  auto b = make_weight(DType::kBF16, {c.Cout}, random_vec(c.Cout, rng));
  const auto scale = random_vec(c.Cin, rng, 0.5f, 1.5f), shift = random_vec(c.Cin, rng);
  kernels::Conv2dParams p;
  p.stride = c.stride;
  p.pad_top = c.pt, p.pad_bottom = c.pb, p.pad_left = c.pl, p.pad_right = c.pr;
  p.upsample2x = c.up;
  if (c.prologue) p.in_scale = scale.data(), p.in_shift = shift.data();
  p.in_silu = c.silu;
  p.accumulate = c.accumulate;
  const int64_t OH = kernels::conv2d_out_size(c.H, c.KH, c.stride, c.pt, c.pb, c.up);
  const int64_t OW = kernels::conv2d_out_size(c.W, c.KW, c.stride, c.pl, c.pr, c.up);
  EXPECT_GT(OH, 0);
  EXPECT_GT(OW, 0);
  const int64_t on = c.N * c.Cout * OH * OW;
  std::vector<float> y = random_vec(on, rng), yr(y);  // random start: checks accumulate/overwrite
  const Weight* bp = c.bias ? &b.w : nullptr;
  kernels::run_conv2d(set, x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, y.data(), p, pool);
  kernels::ref::conv2d(x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, yr.data(), p);
  float err = 0, mag = 0;
  for (int64_t i = 0; i < on; ++i) {
    err = std::isnan(y[i]) ? INFINITY : std::max(err, std::fabs(y[i] - yr[i]));
    mag = std::max(mag, std::fabs(yr[i]));
  }
  return err / std::max(1.0f, mag);
}

std::vector<ConvCase> cases() {
  std::vector<ConvCase> v;
  //        N Cin  H   W Cout KH KW s pt pb pl pr   up    pro    silu   acc    bias
  v.push_back({1, 3, 17, 19, 8, 3, 3, 1, 1, 1, 1, 1, false, false, false, false, true});
  v.push_back({1, 16, 16, 32, 20, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true});
  v.push_back({2, 5, 9, 7, 7, 3, 3, 1, 1, 1, 1, 1, false, true, true, true, true});
  v.push_back({1, 12, 20, 20, 9, 3, 3, 2, 0, 1, 0, 1, false, false, false, false, true});  // Downsample2D
  v.push_back({1, 7, 33, 18, 13, 3, 3, 2, 0, 1, 0, 1, false, true, false, false, false});
  v.push_back({1, 6, 8, 10, 11, 3, 3, 1, 1, 1, 1, 1, true, false, false, false, true});  // Upsample2D
  v.push_back({1, 4, 5, 17, 6, 3, 3, 1, 1, 1, 1, 1, true, true, true, true, true});
  v.push_back({1, 32, 16, 16, 32, 1, 1, 1, 0, 0, 0, 0, false, false, false, false, true});  // 1×1
  v.push_back({1, 24, 9, 13, 40, 1, 1, 1, 0, 0, 0, 0, false, true, false, true, true});
  v.push_back({1, 8, 6, 6, 5, 1, 1, 1, 0, 0, 0, 0, false, false, true, false, false});
  v.push_back({1, 40, 12, 12, 7, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true});  // K > 256
  v.push_back({1, 3, 11, 9, 4, 5, 3, 1, 2, 2, 1, 1, false, false, false, false, true});  // 5×3
  v.push_back({1, 2, 7, 7, 3, 3, 3, 3, 2, 0, 0, 2, false, true, true, false, true});  // stride 3, odd pads
  // Stride 2 with whole 32-pixel panels in one output row (the encoder's downsamplers: the
  // vectorised stride-2 gather of the im2col pack, full runs and the overlapping last 8).
  v.push_back({1, 4, 5, 128, 12, 3, 3, 2, 0, 1, 0, 1, false, true, true, false, true});
  v.push_back({1, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true});  // 1×1 image
  v.push_back({1, 64, 24, 40, 70, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true});  // many blocks
  // Small Cout (the direct path on x86): decoder conv_out, with and without extras.
  v.push_back({1, 16, 9, 70, 3, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true});
  v.push_back({1, 9, 5, 33, 3, 3, 3, 1, 1, 1, 1, 1, false, true, true, true, true});
  v.push_back({2, 5, 6, 7, 2, 3, 3, 1, 1, 1, 1, 1, true, true, false, false, true});
  v.push_back({1, 7, 8, 16, 6, 3, 3, 1, 0, 2, 2, 0, false, false, false, false, false});
  v.push_back({1, 4, 11, 40, 5, 3, 3, 1, 1, 1, 1, 1, false, false, true, false, true});
  // Upsampling convs past the direct path's Cout (the bf16 convs' sub-pixel form): several
  // channel chunks and pixel tiles, a partial tile and sliver, an odd Cin, two batch items.
  v.push_back({1, 130, 5, 37, 30, 3, 3, 1, 1, 1, 1, 1, true, true, true, true, true});
  v.push_back({2, 9, 7, 16, 17, 3, 3, 1, 1, 1, 1, 1, true, false, false, false, false});
  // Same-padded 3×3 convs of ≥ 16 channels (the bf16 convs' Winograd form): several
  // blocks of tiles with a partial last one, three slivers, an odd Cin; odd sizes (a dead tile
  // slot per row, a half panel), two batch items, no prologue; a tile row shorter than a group.
  v.push_back({1, 130, 40, 40, 30, 3, 3, 1, 1, 1, 1, 1, false, true, true, true, true});
  v.push_back({2, 17, 10, 29, 15, 3, 3, 1, 1, 1, 1, 1, false, false, false, false, false});
  v.push_back({1, 32, 7, 5, 24, 3, 3, 1, 1, 1, 1, 1, false, true, false, true, true});
  // A tile row longer than a block (256 channels: 64-slot blocks) whose last block is narrower
  // (80 tile columns: 64 + 16): its rows are laid out for its own width, not the first block's.
  v.push_back({1, 256, 4, 160, 8, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true});
  // An upsampling conv of ≥ 16 channels without a prologue (the float32 Winograd form on the
  // upsampled image): two batch items, an odd width (a dead tile slot), accumulation.
  v.push_back({2, 20, 3, 9, 13, 3, 3, 1, 1, 1, 1, 1, true, false, false, true, true});
  return v;
}

// The kernel tests, once per ISA of this CPU (test names end in the ISA: Conv2d.FastMatchesRef/avx2).
class Conv2d : public ::testing::TestWithParam<Isa> {
 protected:
  const kernels::KernelSet set = kernels::KernelSet::select(CpuFeatures::host(), GetParam());
};

INSTANTIATE_TEST_SUITE_P(Isa, Conv2d, ::testing::ValuesIn(CpuFeatures::host().isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST_P(Conv2d, FastMatchesRef) {
  std::mt19937 rng(77);
  ThreadPool pool1(1), pool2(2), pool3(3);
  int i = 0;
  for (const auto& c : cases())
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      ThreadPool& pool = (i++ % 3 == 0) ? pool1 : (i % 3 == 1 ? pool2 : pool3);
      const float e = check_case(set, c, dt, pool, rng);
      ASSERT_LE(e, 1e-5f) << "case Cin=" << c.Cin << " H=" << c.H << " W=" << c.W << " Cout=" << c.Cout
                          << " k=" << c.KH << "x" << c.KW << " s=" << c.stride << " up=" << c.up
                          << " dtype=" << dtype_name(dt) << " threads=" << pool.size();
    }
}

// Under Precision::kFast: the conv the set chose against the reference of its arithmetic. The
// AVX512_BF16 kernel rounds the transformed input and the weight to bf16: without a prologue both
// sides round the same floats, so it must equal ref::conv2d_bf16 to float32 summation error. With
// a prologue the kernel's vector exp / fused multiply-add may differ from the reference's by an
// ulp, which can move a value across a bf16 rounding boundary: each such flip changes one product
// by at most 2^-7·|w|·|v| (and every output that reads the input: ~1 % of them in the larger
// cases), so those cases allow two flips per output on top of 1e-5. The pack and strip code they
// share with the prologue-free cases is held to 1e-5 there, the prologue arithmetic in the exact
// kernels' test (FastMatchesRef). Exact kernels (what kFast keeps without AVX512_BF16) get 1e-5, and
// so do the convs with ≤ 6 output channels, which every x86 kernel computes in float32.
TEST_P(Conv2d, FastMatchesItsRef) {
  const auto fast = kernels::KernelSet::select(CpuFeatures::host(), GetParam(), kernels::Precision::kFast);
  std::mt19937 rng(81);
  ThreadPool pool1(1), pool3(3);
  int i = 0, n_bf16 = 0, n_subpixel = 0, n_winograd = 0, n_f32_winograd = 0;
  for (const auto& c : cases())
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      ThreadPool& pool = (i++ % 2 == 0) ? pool1 : pool3;
      // Which arithmetic the chosen conv has: bf16 operands (AVX512_BF16, AMX), the float32
      // Winograd form (the fast AVX2 / AVX-512F convs), or the exact float32 one.
      const std::string_view conv_name = fast.get(kernels::Op::kConv2d, dt).name;
      bool bf16 = conv_name == "conv2d_bf16_avx512bf16" || conv_name == "conv2d_bf16_amx";
      const bool f32_fast = conv_name == "conv2d_winograd_avx2" || conv_name == "conv2d_winograd_avx512";
      n_bf16 += bf16;
#if defined(KLEIN_X86)
      // Convs with a handful of output channels run the float32 direct path in every kernel.
      kernels::Conv2dParams shape_only;
      shape_only.stride = c.stride;
      if (kernels::avx2::conv2d_is_direct(c.Cout, shape_only)) bf16 = false;
#endif
      const auto x = random_vec(c.N * c.Cin * c.H * c.W, rng, -2, 2);
      auto w = make_weight(dt, {c.Cout, c.Cin, c.KH, c.KW}, random_vec(c.Cout * c.Cin * c.KH * c.KW, rng));
      auto b = make_weight(DType::kF32, {c.Cout}, random_vec(c.Cout, rng));
      const auto scale = random_vec(c.Cin, rng, 0.5f, 1.5f), shift = random_vec(c.Cin, rng);
      kernels::Conv2dParams p;
      p.stride = c.stride;
      p.pad_top = c.pt, p.pad_bottom = c.pb, p.pad_left = c.pl, p.pad_right = c.pr;
      p.upsample2x = c.up;
      if (c.prologue) p.in_scale = scale.data(), p.in_shift = shift.data();
      p.in_silu = c.silu;
      p.accumulate = c.accumulate;
      const int64_t on = c.N * c.Cout * kernels::conv2d_out_size(c.H, c.KH, c.stride, c.pt, c.pb, c.up) *
                         kernels::conv2d_out_size(c.W, c.KW, c.stride, c.pl, c.pr, c.up);
      std::vector<float> y = random_vec(on, rng), yr(y);
      const Weight* bp = c.bias ? &b.w : nullptr;
      kernels::run_conv2d(fast, x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, y.data(), p, pool);
      // The bf16 convs' sub-pixel form of an upsampling conv, and their Winograd form; the float32
      // Winograd form of the fast float32 convs.
      bool subpixel = false, winograd = false, f32_winograd = false;
#if defined(KLEIN_X86)
      subpixel = bf16 && kernels::avx512bf16::conv2d_subpixel(p, c.Cout, c.KH, c.KW);
      winograd = bf16 && kernels::avx512bf16::conv2d_winograd(p, c.Cin, c.Cout, c.KH, c.KW);
      f32_winograd = f32_fast && kernels::avx2::conv2d_winograd_f32(p, c.Cin, c.Cout, c.KH, c.KW);
      n_subpixel += subpixel;
      n_winograd += winograd;
      n_f32_winograd += f32_winograd;
#endif
      if (subpixel)
        kernels::ref::conv2d_bf16_subpixel(x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, yr.data(), p);
      else if (winograd)
        kernels::ref::conv2d_bf16_winograd(x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, yr.data(), p);
      else if (f32_winograd)
        kernels::ref::conv2d_winograd(x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, yr.data(), p);
      else if (bf16)
        kernels::ref::conv2d_bf16(x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, yr.data(), p);
      else
        kernels::ref::conv2d(x.data(), c.N, c.Cin, c.H, c.W, w.w, bp, yr.data(), p);
      float mag = 0;
      for (float v : yr) mag = std::max(mag, std::fabs(v));
      const float tight = 1e-5f * std::max(1.0f, mag);
      // |w| ≤ 1; |v| ≤ 2·1.5 + 1 after the prologue (|x| ≤ 2, scale ≤ 1.5, |shift| ≤ 1).
      const bool flips = bf16 && (c.prologue || c.silu);
      const float bound = flips ? tight + 2.0f * 0.0078125f * 4.0f : tight;
      for (int64_t k = 0; k < on; ++k) {
        const float e = std::fabs(y[k] - yr[k]);
        ASSERT_TRUE(e <= bound) << "output " << k << " error " << e << " bound " << bound << " Cin=" << c.Cin
                                << " Cout=" << c.Cout << " k=" << c.KH << "x" << c.KW << " up=" << c.up
                                << " dtype=" << dtype_name(dt) << " " << conv_name
                                << (bf16 ? " bf16" : f32_winograd ? " f32 winograd" : " exact");
      }
    }
  // The bf16 conv is the fast row exactly where the CPU (and this parameter) has AVX512_BF16.
  const bool has_bf16 = CpuFeatures::host().has(Isa::kAvx512Bf16) && GetParam() >= Isa::kAvx512Bf16;
  EXPECT_EQ(n_bf16 > 0, has_bf16);
  // ... and takes the sub-pixel and Winograd forms wherever it is (the AVX512_BF16 and AMX convs
  // both have them).
  EXPECT_EQ(n_subpixel > 0, has_bf16);
  EXPECT_EQ(n_winograd > 0, has_bf16);
  // Below it, from AVX2 up, the float32 Winograd form runs.
  EXPECT_EQ(n_f32_winograd > 0, !has_bf16 && GetParam() >= Isa::kAvx2);
}

// Operands of a 3×3 conv on which the reference forms are exact: inputs in quarters of [−2, 2],
// integer taps and bias in [−3, 3], prologue scale 1 or 2 and shift in halves.
struct ExactConv {
  std::vector<float> x, scale, shift;
  OwnedWeight w, b;  // (built in place: its data points into its own vectors)
};
ExactConv exact_conv(std::mt19937& rng, int64_t Cin, int64_t H, int64_t W, int64_t Cout) {
  std::uniform_int_distribution<int> small(-3, 3), quarters(-8, 8);
  std::vector<float> x(Cin * H * W), wv(Cout * Cin * 9), bv(Cout), scale(Cin), shift(Cin);
  for (auto& v : x) v = 0.25f * static_cast<float>(quarters(rng));
  for (auto& v : wv) v = static_cast<float>(small(rng));
  for (auto& v : bv) v = static_cast<float>(small(rng));
  for (auto& v : scale) v = static_cast<float>(1 + (small(rng) & 1));  // 1 or 2
  for (auto& v : shift) v = 0.5f * static_cast<float>(small(rng));
  return {x, scale, shift, make_weight(DType::kF32, {Cout, Cin, 3, 3}, wv), make_weight(DType::kF32, {Cout}, bv)};
}

// The sub-pixel form's reference against the upsampled conv's, on values for which every sum of
// taps, every bf16 rounding and every double sum is exact (small integers, quarters): the two
// must agree to the last bit, so any tap of a phase read from the wrong row or column, or summed
// from the wrong 3×3 taps, shows. Then on random values, within the bf16 rounding of the sums.
TEST(Conv2dRef, SubpixelFormEqualsUpsampledConv) {
  std::mt19937 rng(83);
  for (const bool prologue : {false, true}) {
    const int64_t Cin = 5, H = 6, W = 7, Cout = 4, on = Cout * 4 * H * W;
    const ExactConv e = exact_conv(rng, Cin, H, W, Cout);
    const auto &x = e.x, &scale = e.scale, &shift = e.shift;
    const auto &w = e.w, &b = e.b;
    kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
    p.upsample2x = true;
    if (prologue) p.in_scale = scale.data(), p.in_shift = shift.data();
    ASSERT_TRUE(kernels::conv2d_subpixel_form(3, 3, p));
    std::vector<float> ys(on, 1.0f), yr(on, 1.0f);
    p.accumulate = prologue;  // both ways
    kernels::ref::conv2d_bf16_subpixel(x.data(), 1, Cin, H, W, w.w, &b.w, ys.data(), p);
    kernels::ref::conv2d(x.data(), 1, Cin, H, W, w.w, &b.w, yr.data(), p);
    for (int64_t k = 0; k < on; ++k) ASSERT_EQ(ys[k], yr[k]) << "output " << k << " prologue " << prologue;
  }
  // Random values: the summed taps round once to bf16 where conv2d_bf16 rounds each tap.
  const int64_t Cin = 16, H = 5, W = 9, Cout = 6, on = Cout * 4 * H * W;
  const auto x = random_vec(Cin * H * W, rng, -2, 2);
  auto w = make_weight(DType::kBF16, {Cout, Cin, 3, 3}, random_vec(Cout * Cin * 9, rng));
  kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
  p.upsample2x = true;
  std::vector<float> ys(on), yb(on);
  kernels::ref::conv2d_bf16_subpixel(x.data(), 1, Cin, H, W, w.w, nullptr, ys.data(), p);
  kernels::ref::conv2d_bf16(x.data(), 1, Cin, H, W, w.w, nullptr, yb.data(), p);
  double num = 0, den = 0;
  for (int64_t k = 0; k < on; ++k) num += (ys[k] - yb[k]) * (ys[k] - yb[k]), den += yb[k] * yb[k];
  EXPECT_LT(std::sqrt(num / den), 4e-3);  // bf16's 2^-9 relative rounding, averaged over the sums
  EXPECT_GT(std::sqrt(num / den), 0.0);   // and not the same arithmetic
  // Only the sub-pixel shape is accepted.
  kernels::Conv2dParams q = kernels::Conv2dParams::same(3);
  EXPECT_FALSE(kernels::conv2d_subpixel_form(3, 3, q));
  q.upsample2x = true;
  EXPECT_FALSE(kernels::conv2d_subpixel_form(1, 1, q));
  q.pad_right = 0;
  EXPECT_FALSE(kernels::conv2d_subpixel_form(3, 3, q));
  EXPECT_THROW(kernels::ref::conv2d_bf16_subpixel(x.data(), 1, Cin, H, W, w.w, nullptr, ys.data(), q),
               std::invalid_argument);
}

// The Winograd form's reference against the plain conv's, on values for which every transform,
// bf16 rounding and double sum is exact (quarters in, small integers as taps: |V| ≤ 88 in quarters,
// U in quarters of ≤ 27): the two must agree to the last bit, so a wrong entry of Bᵀ, G or Aᵀ, a
// window read one row or column off, or a lost edge tile (odd sizes) shows. Then on random values:
// within a small multiple of conv2d_bf16's own rounding error.
TEST(Conv2dRef, WinogradFormEqualsConv) {
  std::mt19937 rng(89);
  for (const bool prologue : {false, true}) {
    const int64_t Cin = 5, H = prologue ? 7 : 6, W = prologue ? 9 : 8, Cout = 4, on = Cout * H * W;
    const ExactConv e = exact_conv(rng, Cin, H, W, Cout);
    const auto &x = e.x, &scale = e.scale, &shift = e.shift;
    const auto &w = e.w, &b = e.b;
    kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
    if (prologue) p.in_scale = scale.data(), p.in_shift = shift.data();
    ASSERT_TRUE(kernels::conv2d_winograd_form(3, 3, p));
    std::vector<float> ys(on, 1.0f), yr(on, 1.0f);
    p.accumulate = prologue;  // both ways
    kernels::ref::conv2d_bf16_winograd(x.data(), 1, Cin, H, W, w.w, &b.w, ys.data(), p);
    kernels::ref::conv2d(x.data(), 1, Cin, H, W, w.w, &b.w, yr.data(), p);
    for (int64_t k = 0; k < on; ++k) ASSERT_EQ(ys[k], yr[k]) << "output " << k << " prologue " << prologue;
  }
  // Random values (GroupNorm + SiLU prologue, as the VAE's): the transformed operands round to
  // bf16 where conv2d_bf16 rounds the input and the taps themselves.
  const int64_t Cin = 32, H = 9, W = 11, Cout = 6, on = Cout * H * W;
  const auto x = random_vec(Cin * H * W, rng, -2, 2);
  const auto scale = random_vec(Cin, rng, 0.5f, 1.5f), shift = random_vec(Cin, rng);
  auto w = make_weight(DType::kBF16, {Cout, Cin, 3, 3}, random_vec(Cout * Cin * 9, rng));
  kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
  p.in_scale = scale.data(), p.in_shift = shift.data(), p.in_silu = true;
  std::vector<float> yw(on), yb(on), yf(on);
  kernels::ref::conv2d_bf16_winograd(x.data(), 1, Cin, H, W, w.w, nullptr, yw.data(), p);
  kernels::ref::conv2d_bf16(x.data(), 1, Cin, H, W, w.w, nullptr, yb.data(), p);
  kernels::ref::conv2d(x.data(), 1, Cin, H, W, w.w, nullptr, yf.data(), p);
  double ew = 0, eb = 0, den = 0;
  for (int64_t k = 0; k < on; ++k)
    ew += (yw[k] - yf[k]) * (yw[k] - yf[k]), eb += (yb[k] - yf[k]) * (yb[k] - yf[k]), den += yf[k] * yf[k];
  ew = std::sqrt(ew / den), eb = std::sqrt(eb / den);
  std::printf("relative RMS error against float32: winograd %.3g, direct bf16 %.3g\n", ew, eb);
  EXPECT_GT(ew, 0.0);        // not the float32 arithmetic
  EXPECT_LT(ew, 4.0 * eb);   // and within a few times the direct bf16 conv's rounding
  // Only the stride-1, padding-1, 3×3 shape without upsampling is accepted.
  kernels::Conv2dParams q = kernels::Conv2dParams::same(3);
  EXPECT_FALSE(kernels::conv2d_winograd_form(1, 1, q));
  EXPECT_FALSE(kernels::conv2d_winograd_form(3, 5, q));
  q.upsample2x = true;
  EXPECT_FALSE(kernels::conv2d_winograd_form(3, 3, q));
  q.upsample2x = false, q.stride = 2;
  EXPECT_FALSE(kernels::conv2d_winograd_form(3, 3, q));
  q.stride = 1, q.pad_left = 0;
  EXPECT_FALSE(kernels::conv2d_winograd_form(3, 3, q));
  EXPECT_THROW(kernels::ref::conv2d_bf16_winograd(x.data(), 1, Cin, H, W, w.w, nullptr, yw.data(), q),
               std::invalid_argument);
}

// The float32 Winograd form's reference against the plain conv's, with and without the ×2
// upsampling: exact on exact operands (as above), so a window or tile of the upsampled image read
// off by one shows; then on random values, within float32 rounding of U and V (the only roundings
// the double-summed reference makes that ref::conv2d does not).
TEST(Conv2dRef, WinogradF32FormEqualsConv) {
  std::mt19937 rng(91);
  for (const bool up : {false, true})
    for (const bool prologue : {false, true}) {
      const int64_t Cin = 5, H = prologue ? 5 : 4, W = prologue ? 7 : 6, Cout = 3, u = up ? 2 : 1;
      const int64_t on = Cout * H * u * W * u;
      const ExactConv e = exact_conv(rng, Cin, H, W, Cout);
      kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
      p.upsample2x = up;
      if (prologue) p.in_scale = e.scale.data(), p.in_shift = e.shift.data();
      ASSERT_TRUE(kernels::conv2d_winograd_f32_form(3, 3, p));
      std::vector<float> ys(on, 1.0f), yr(on, 1.0f);
      p.accumulate = prologue;  // both ways
      kernels::ref::conv2d_winograd(e.x.data(), 1, Cin, H, W, e.w.w, &e.b.w, ys.data(), p);
      kernels::ref::conv2d(e.x.data(), 1, Cin, H, W, e.w.w, &e.b.w, yr.data(), p);
      for (int64_t k = 0; k < on; ++k)
        ASSERT_EQ(ys[k], yr[k]) << "output " << k << " up " << up << " prologue " << prologue;
    }
  const int64_t Cin = 32, H = 9, W = 11, Cout = 6;
  const auto x = random_vec(Cin * H * W, rng, -2, 2);
  const auto scale = random_vec(Cin, rng, 0.5f, 1.5f), shift = random_vec(Cin, rng);
  auto w = make_weight(DType::kBF16, {Cout, Cin, 3, 3}, random_vec(Cout * Cin * 9, rng));
  for (const bool up : {false, true}) {
    kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
    p.in_scale = scale.data(), p.in_shift = shift.data(), p.in_silu = true, p.upsample2x = up;
    const int64_t on = Cout * H * W * (up ? 4 : 1);
    std::vector<float> yw(on), yf(on);
    kernels::ref::conv2d_winograd(x.data(), 1, Cin, H, W, w.w, nullptr, yw.data(), p);
    kernels::ref::conv2d(x.data(), 1, Cin, H, W, w.w, nullptr, yf.data(), p);
    double ew = 0, den = 0;
    for (int64_t k = 0; k < on; ++k) ew += (yw[k] - yf[k]) * (yw[k] - yf[k]), den += yf[k] * yf[k];
    ew = std::sqrt(ew / den);
    std::printf("relative RMS error of the float32 Winograd form (up %d): %.3g\n", up, ew);
    EXPECT_GT(ew, 0.0);   // not the same arithmetic
    EXPECT_LT(ew, 1e-6);  // but float32's: U and V round at 2^-24 relative
  }
  // Strided or other-padded 3×3 convs are not accepted.
  kernels::Conv2dParams q = kernels::Conv2dParams::same(3);
  q.stride = 2;
  EXPECT_FALSE(kernels::conv2d_winograd_f32_form(3, 3, q));
  q.stride = 1, q.pad_bottom = 0;
  EXPECT_FALSE(kernels::conv2d_winograd_f32_form(3, 3, q));
  EXPECT_FALSE(kernels::conv2d_winograd_f32_form(1, 1, kernels::Conv2dParams::same(1)));
  std::vector<float> y(Cout * H * W);
  EXPECT_THROW(kernels::ref::conv2d_winograd(x.data(), 1, Cin, H, W, w.w, nullptr, y.data(), q),
               std::invalid_argument);
}

TEST_P(Conv2d, EveryWeightFormat) {
  // The quantized formats reach the conv kernels through weight_row_to_f32; Q4_G64 needs a
  // reduction length Cin·kh·kw that is a multiple of 64.
  std::mt19937 rng(79);
  ThreadPool pool(2);
  //                           N Cin  H   W Cout KH KW s pt pb pl pr   up    pro    silu   acc    bias
  const ConvCase cs[] = {{1, 64, 9, 11, 12, 3, 3, 1, 1, 1, 1, 1, false, true, true, false, true},
                         {1, 64, 7, 6, 3, 1, 1, 1, 0, 0, 0, 0, false, false, false, true, true},
                         {1, 128, 5, 9, 5, 3, 3, 2, 0, 1, 0, 1, true, true, false, false, false}};
  for (const FormatTraits& f : format_table()) {
    if (!f.is_weight) continue;
    for (const ConvCase& c : cs) {
      if ((c.Cin * c.KH * c.KW) % f.block_elems) continue;  // a row of whole blocks only
      const float e = check_case(set, c, f.id, pool, rng);
      ASSERT_LE(e, 1e-5f) << "format " << f.name << " Cin=" << c.Cin << " Cout=" << c.Cout << " k=" << c.KH;
    }
  }
}

TEST(Conv2dBlocked, BlockedMatchesRef) {
  // The portable path, whatever this CPU has: it is the scalar row of every weight format.
  const auto set = kernels::KernelSet::select(CpuFeatures::host(), Isa::kScalar);
  ASSERT_EQ(set.get(kernels::Op::kConv2d, DType::kBF16).conv2d, &kernels::blocked::conv2d);
  std::mt19937 rng(78);
  ThreadPool pool(2);
  for (const auto& c : cases()) {
    const float e = check_case(set, c, DType::kBF16, pool, rng);
    ASSERT_LE(e, 1e-5f) << "case Cin=" << c.Cin << " H=" << c.H << " W=" << c.W << " Cout=" << c.Cout;
  }
}

TEST(Conv2dShape, OutSize) {
  EXPECT_EQ(kernels::conv2d_out_size(64, 3, 1, 1, 1, false), 64);
  EXPECT_EQ(kernels::conv2d_out_size(64, 3, 2, 0, 1, false), 32);
  EXPECT_EQ(kernels::conv2d_out_size(65, 3, 2, 0, 1, false), 32);
  EXPECT_EQ(kernels::conv2d_out_size(8, 3, 1, 1, 1, true), 16);
  EXPECT_EQ(kernels::conv2d_out_size(1, 3, 1, 0, 0, false), 0);
}

TEST_P(Conv2d, RejectsMismatchedWeight) {
  std::vector<float> x(2 * 4 * 4), y(16);
  auto w = make_weight(DType::kF32, {1, 3, 3, 3}, std::vector<float>(27, 1.0f));
  ThreadPool pool(1);
  EXPECT_THROW(kernels::run_conv2d(set, x.data(), 1, 2, 4, 4, w.w, nullptr, y.data(),
                                   kernels::Conv2dParams::same(3), pool),
               std::invalid_argument);
}

}  // namespace
}  // namespace klein
