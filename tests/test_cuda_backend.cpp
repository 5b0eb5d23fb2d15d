// The CUDA backend on a GPU (compiled in -DKLEIN_CUDA=ON builds; every test skips, saying why,
// where no CUDA device is present). The op contract against double-precision formulas is
// test_backend_ops.cpp (instantiated for cuda_fp32 and cuda_bf16); here:
//   * CudaOps: ops on shapes large and ragged enough to cross every tile, chunk and warp
//     boundary of the kernels (attention head dims 8..512, conv im2col in several chunks,
//     GroupNorm over many chunks), against the CPU backend;
//   * CudaComponents: the text encoder, transformer and VAE of the tiny model against the
//     diffusers fixtures, as the CPU tests check them (fp32: 1e-4; bf16: 5e-2);
//   * CudaEndToEnd: whole requests through the public API against the CPU's float32 image
//     (PSNR: fp32 ≥ 50 dB, bf16 ≥ 40 dB, the bar).
// The tolerances for the GPU are stated here before any GPU run: a first run on a device
// (scripts/cuda_device_check.sh) measures the real margins.
#include <gtest/gtest.h>

#ifdef KLEIN_HAS_CUDA

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/run_context.h"
#include "backend/transfer.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "pipeline/image_compare.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein {
namespace cuda_backend_test {  // named: in a unity group its helpers must not meet other files' (cmake/unity.cmake)
namespace {

std::vector<float> randv(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return m > 0 ? d / m : d;
}

std::vector<float> host(Backend& be, const TensorView& v) {
  auto t = be.download(v);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::vector<float>(t->data(), t->data() + t->numel()) : std::vector<float>{};
}

NpyArray must_read(const fs::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : NpyArray{};
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = cuda_device_count();
    if (!n.ok())
      GTEST_SKIP() << "no CUDA device (" << n.status().message()
                   << "): the CUDA backend's GPU tests run on a GPU machine (scripts/cuda_device_check.sh)";
  }
  static std::unique_ptr<Backend> cuda(CudaPrecision p, size_t col_bytes = size_t{256} << 20) {
    CudaBackendOptions o;
    o.precision = p;
    o.host_threads = 2;
    o.conv_col_bytes = col_bytes;
    auto b = make_cuda_backend(o);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    return b.ok() ? std::move(b).value() : nullptr;
  }
};

// The same op on the CPU and the GPU backend, inputs uploaded to each.
struct Pair {
  CpuBackend cpu{CpuBackendOptions{2}};
  std::unique_ptr<Backend> gpu;
  Tensor up(Backend& be, const std::vector<float>& v, const Shape& s) {
    auto t = be.upload(v.data(), s, "test");
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }
};

using CudaOps = CudaTest;

TEST_F(CudaOps, LinearOnViewsAndBothPrecisions) {
  const int64_t M = 300, K = 1000, N = 257, ldx = 1003, ldy = 260;
  const auto xs = randv(M * ldx, 1), ws = randv(N * K, 2, -0.05f, 0.05f), bs = randv(N, 3);
  for (auto [p, tol] : {std::pair{CudaPrecision::kFp32, 1e-5}, {CudaPrecision::kBf16, 1e-2}}) {
    Pair t;
    t.gpu = cuda(p);
    ASSERT_TRUE(t.gpu);
    Weight W, B;
    W.name = "w", W.shape = {N, K}, W.data = ws.data(), W.nbytes = ws.size() * 4;
    B.name = "b", B.shape = {N}, B.data = bs.data(), B.nbytes = bs.size() * 4;
    Weight Wg = W, Bg = B;
    ASSERT_TRUE(t.gpu->prepare_weight(Wg).ok());
    ASSERT_TRUE(t.gpu->prepare_weight(Bg).ok());
    EXPECT_EQ(Wg.dtype, p == CudaPrecision::kBf16 ? DType::kBF16 : DType::kF32);
    EXPECT_EQ(Bg.dtype, DType::kF32);
    Tensor xc = t.up(t.cpu, xs, {M, ldx}), yc = t.up(t.cpu, std::vector<float>(M * ldy, 0.f), {M, ldy});
    Tensor xg = t.up(*t.gpu, xs, {M, ldx}), yg = t.up(*t.gpu, std::vector<float>(M * ldy, 0.f), {M, ldy});
    ASSERT_TRUE(t.cpu.linear(xc.view().col_range(3, 3 + K), W, &B, yc.view().col_range(1, 1 + N)).ok());
    ASSERT_TRUE(t.gpu->linear(xg.view().col_range(3, 3 + K), Wg, &Bg, yg.view().col_range(1, 1 + N)).ok());
    EXPECT_LE(rel_err(host(*t.gpu, yg), host(t.cpu, yc)), tol);
  }
}

// RunContext::report synchronises the backend, so work queued before a report has finished when
// the caller hears of it (phase times, previews, cancel points). A chain of float32 GEMMs is
// queued (launches take microseconds, the device milliseconds per 4096² GEMM), then reported: the
// report must come no sooner than the device's own time for the chain, measured beforehand.
// Without the sync it came after the launches alone (the H200 run's decode phase read 0.006 s).
TEST_F(CudaOps, ProgressReportsWaitForQueuedWork) {
  auto be = cuda(CudaPrecision::kFp32);
  ASSERT_TRUE(be);
  const int64_t n = 4096;
  const int chain = 8;
  const auto ws = randv(n * n, 4, -0.01f, 0.01f), xs = randv(n * n, 5);
  Weight W;
  W.name = "w", W.shape = {n, n}, W.data = ws.data(), W.nbytes = ws.size() * 4;
  ASSERT_TRUE(be->prepare_weight(W).ok());
  auto x = be->upload(xs.data(), {n, n}, "x");
  auto y = be->alloc({n, n}, "y");
  ASSERT_TRUE(x.ok() && y.ok());
  auto queue = [&] {
    for (int i = 0; i < chain; ++i) ASSERT_TRUE(be->linear(x->view(), W, nullptr, y->view()).ok());
  };
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  queue();  // warm-up: the cuBLASLt plan
  ASSERT_TRUE(be->sync().ok());
  auto t0 = Clock::now();
  queue();
  ASSERT_TRUE(be->sync().ok());
  const double device_s = since(t0);

  RunContext ctx;
  ctx.backend = be.get();
  double reported_s = -1;
  ctx.progress = [&](const std::string&, int, int) { reported_s = since(t0); };
  t0 = Clock::now();
  queue();
  const double queued_s = since(t0);
  ctx.report("test", 1, 1);
  std::printf("[cuda report] %d GEMMs %lld²: device %.1f ms, queued in %.2f ms, reported at %.1f ms\n", chain,
              static_cast<long long>(n), 1e3 * device_s, 1e3 * queued_s, 1e3 * reported_s);
  EXPECT_GE(reported_s, 0.8 * device_s);
}

TEST_F(CudaOps, AttentionHeadDimsMasksAndGqa) {
  struct Case {
    int64_t S;
    int Hq, Hkv, D;
    bool causal, padded;
  };
  const Case cases[] = {{100, 4, 2, 64, true, true}, {77, 3, 3, 128, false, false}, {70, 1, 1, 512, false, false},
                        {33, 2, 1, 8, true, false},  {129, 2, 2, 40, false, true}};
  // fp32: the online-softmax kernel; bf16: the tensor-core GEMMs around the masked softmax.
  for (auto [p, tol] : {std::pair{CudaPrecision::kFp32, 1e-5}, {CudaPrecision::kBf16, 2e-2}}) {
    Pair t;
    t.gpu = cuda(p);
    ASSERT_TRUE(t.gpu);
    for (const Case& c : cases) {
      SCOPED_TRACE("S " + std::to_string(c.S) + " D " + std::to_string(c.D) + (p == CudaPrecision::kFp32 ? " fp32" : " bf16"));
      const auto q = randv(c.S * c.Hq * c.D, 4), k = randv(c.S * c.Hkv * c.D, 5), v = randv(c.S * c.Hkv * c.D, 6);
      std::vector<uint8_t> valid(c.S, 1);
      if (c.padded)
        for (int64_t i = c.S * 2 / 3; i < c.S; ++i) valid[i] = 0;
      const AttnMask mask{c.causal, valid.data()};
      std::vector<float> outs[2];
      int i = 0;
      for (Backend* be : {static_cast<Backend*>(&t.cpu), t.gpu.get()}) {
        Tensor tq = t.up(*be, q, {c.S, c.Hq * c.D}), tk = t.up(*be, k, {c.S, c.Hkv * c.D}),
               tv = t.up(*be, v, {c.S, c.Hkv * c.D});
        auto o = be->alloc({c.S, c.Hq * c.D}, "out");
        ASSERT_TRUE(o.ok());
        ASSERT_TRUE(be->attention(tq, tk, tv, *o, c.Hq, c.Hkv, 1.0f / std::sqrt(float(c.D)), mask).ok());
        outs[i++] = host(*be, *o);
      }
      EXPECT_LE(rel_err(outs[1], outs[0]), tol);
    }
  }
}

TEST_F(CudaOps, Conv2dInChunksWithEveryOption) {
  const int64_t C = 16, H = 37, W = 29, Co = 24;
  const auto xs = randv(C * H * W, 7), ws = randv(Co * C * 9, 8, -0.2f, 0.2f), bs = randv(Co, 9);
  const auto sc = randv(C, 10, 0.5f, 1.5f), sh = randv(C, 11);
  struct Case {
    const char* name;
    int k, stride;
    bool up, prologue, acc;
  };
  for (const Case c : {Case{"3x3 up+prologue+acc", 3, 1, true, true, true}, Case{"3x3 stride 2", 3, 2, false, false, false},
                       Case{"1x1", 1, 1, false, false, true}, Case{"1x1 prologue", 1, 1, false, true, false}}) {
    SCOPED_TRACE(c.name);
    for (auto [p, tol] : {std::pair{CudaPrecision::kFp32, 1e-5}, {CudaPrecision::kBf16, 2e-2}}) {
      Pair t;
      t.gpu = cuda(p, 64 << 10);  // 64 KiB of im2col: many chunks, a ragged last one
      ASSERT_TRUE(t.gpu);
      ConvOptions o = c.k == 3 && c.stride == 1 ? ConvOptions::same(3) : ConvOptions{};
      if (c.stride == 2) {  // Downsample2D: pad right and bottom by 1, stride 2
        o.stride = 2;
        o.pad_bottom = o.pad_right = 1;
      }
      o.upsample2x = c.up;
      o.accumulate = c.acc;
      const int64_t OH = conv_out_size(H, c.k, o.stride, o.pad_top, o.pad_bottom, c.up);
      const int64_t OW = conv_out_size(W, c.k, o.stride, o.pad_left, o.pad_right, c.up);
      const auto init = randv(Co * OH * OW, 12);
      std::vector<float> outs[2];
      int i = 0;
      for (Backend* be : {static_cast<Backend*>(&t.cpu), t.gpu.get()}) {
        std::vector<float> wv(ws.begin(), ws.begin() + Co * C * c.k * c.k);
        Weight Wt, B;
        Wt.name = "conv.weight", Wt.shape = {Co, C, c.k, c.k}, Wt.data = wv.data(), Wt.nbytes = wv.size() * 4;
        B.name = "conv.bias", B.shape = {Co}, B.data = bs.data(), B.nbytes = bs.size() * 4;
        ASSERT_TRUE(be->prepare_weight(Wt).ok());
        ASSERT_TRUE(be->prepare_weight(B).ok());
        Tensor x = t.up(*be, xs, {1, C, H, W}), s = t.up(*be, sc, {C}), f = t.up(*be, sh, {C});
        Tensor y = t.up(*be, init, {1, Co, OH, OW});
        if (c.prologue) o.in_scale = s, o.in_shift = f, o.in_silu = true;
        else o.in_scale = o.in_shift = TensorView{}, o.in_silu = false;
        ASSERT_TRUE(be->conv2d(x, Wt, &B, y, o).ok());
        outs[i++] = host(*be, y);
      }
      EXPECT_LE(rel_err(outs[1], outs[0]), tol);
    }
  }
}

TEST_F(CudaOps, NormsRopeAndDataMovementAtModelSizes) {
  Pair t;
  t.gpu = cuda(CudaPrecision::kFp32);
  ASSERT_TRUE(t.gpu);
  auto both = [&](auto&& fn, const char* what, double tol = 2e-6) {
    std::vector<float> outs[2];
    int i = 0;
    for (Backend* be : {static_cast<Backend*>(&t.cpu), t.gpu.get()}) outs[i++] = fn(*be);
    EXPECT_LE(rel_err(outs[1], outs[0]), tol) << what;
  };
  const int64_t R = 1000, D = 3072;
  const auto xs = randv(R * D, 13, -3.f, 3.f), w = randv(D, 14), b = randv(D, 15);
  both([&](Backend& be) {
    Tensor x = t.up(be, xs, {R, D}), ww = t.up(be, w, {D}), bb = t.up(be, b, {D}), y = std::move(be.alloc({R, D}, "y")).value();
    EXPECT_TRUE(be.modulated_layer_norm(x, y, ww, bb, 1e-6f).ok());
    return host(be, y);
  }, "modulated_layer_norm");
  both([&](Backend& be) {
    Tensor x = t.up(be, xs, {R, D}), ww = t.up(be, w, {D}), y = std::move(be.alloc({R, D}, "y")).value();
    EXPECT_TRUE(be.rms_norm(x, y, ww, 1e-6f).ok());
    return host(be, y);
  }, "rms_norm");
  // q/k norm + RoPE on the K columns of a [S, 3·H·hd] projection, as the DiT calls it.
  const int64_t S = 50, hd = 128;
  const int H = 3;
  const auto P = randv(S * 3 * H * hd, 16), c = randv(S * hd, 17), s = randv(S * hd, 18), nw = randv(hd, 19);
  both([&](Backend& be) {
    Tensor p = t.up(be, P, {S, 3 * H * hd}), cc = t.up(be, c, {S, hd}), ss = t.up(be, s, {S, hd}), n = t.up(be, nw, {hd});
    EXPECT_TRUE(be.qk_norm_rope(p.view().col_range(H * hd, 2 * H * hd), H, n, 1e-6f, cc, ss).ok());
    return host(be, p);
  }, "qk_norm_rope");
  // GroupNorm of a VAE activation whose groups span several chunks, then its tiled variant.
  const int64_t C = 64, HH = 256, WW = 256, G = 32;
  const auto gx = randv(C * HH * WW, 20, 5.f, 7.f), gg = randv(C, 21), gb = randv(C, 22);
  both([&](Backend& be) {
    Weight g, bt;
    g.name = "g", g.shape = {C}, g.data = gg.data(), g.nbytes = C * 4;
    bt.name = "b", bt.shape = {C}, bt.data = gb.data(), bt.nbytes = C * 4;
    EXPECT_TRUE(be.prepare_weight(g).ok() && be.prepare_weight(bt).ok());
    Tensor x = t.up(be, gx, {1, C, HH, WW});
    Tensor sc = std::move(be.alloc({C}, "s")).value(), sh = std::move(be.alloc({C}, "s")).value();
    EXPECT_TRUE(be.group_norm_affine(x, g, bt, G, 1e-6, sc, sh).ok());
    GroupStats acc;
    EXPECT_TRUE(be.group_norm_stats(x, G, acc).ok());
    Tensor sc2 = std::move(be.alloc({C}, "s")).value(), sh2 = std::move(be.alloc({C}, "s")).value();
    EXPECT_TRUE(be.group_norm_affine_from_stats(acc, g, bt, 1e-6, sc2, sh2).ok());
    auto r = host(be, sc);
    for (const TensorView& v : {sh.view(), sc2.view(), sh2.view()}) {
      auto h = host(be, v);
      r.insert(r.end(), h.begin(), h.end());
    }
    return r;
  }, "group norm", 1e-5);
  // Transpose with accumulation (the VAE attention's residual), and the finiteness check.
  const int64_t TR = 1000, TC = 33;
  const auto ts = randv(TR * TC, 23), td = randv(TR * TC, 24);
  both([&](Backend& be) {
    Tensor src = t.up(be, ts, {TR, TC}), dst = t.up(be, td, {TC, TR});
    EXPECT_TRUE(be.transpose(src, dst, true).ok());
    auto f = be.all_finite(dst);
    EXPECT_TRUE(f.ok() && *f);
    return host(be, dst);
  }, "transpose");
}

// ---- the tiny model's components against the diffusers fixtures

using CudaComponents = CudaTest;

fs::path ref_root() { return klein::testing::data_dir() / "ref"; }

TEST_F(CudaComponents, TransformerMatchesDiffusers) {
  for (auto [p, tol] : {std::pair{CudaPrecision::kFp32, 1e-4}, {CudaPrecision::kBf16, 5e-2}}) {
    auto be = cuda(p);
    ASSERT_TRUE(be);
    auto model = Flux2Transformer::load(klein::testing::tiny_model_dir() / "transformer");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    ASSERT_TRUE(model->prepare(*be).ok());
    RunContext ctx;
    ctx.backend = be.get();
    for (const char* name : {"dit_64x64", "dit_80x48"}) {
      const fs::path dir = ref_root() / name;
      NpyArray hs = must_read(dir / "hidden_states.npy"), ehs = must_read(dir / "encoder_hidden_states.npy");
      NpyArray ts = must_read(dir / "timestep.npy"), ref = must_read(dir / "output.npy");
      const auto iid = must_read(dir / "img_ids.npy").to_i64(), tid = must_read(dir / "txt_ids.npy").to_i64();
      Flux2Ids img_ids(iid.size() / 4), txt_ids(tid.size() / 4);
      for (size_t i = 0; i < iid.size(); ++i) img_ids[i / 4][i % 4] = iid[i];
      for (size_t i = 0; i < tid.size(); ++i) txt_ids[i / 4][i % 4] = tid[i];
      auto out = model->forward(hs.to_tensor(), ehs.to_tensor(), ts.to_f32()[0], img_ids, txt_ids, ctx);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(out->device(), Device::kCuda);
      auto h = to_host(*be, std::move(out).value());
      ASSERT_TRUE(h.ok());
      const double e = rel_err(std::vector<float>(h->data(), h->data() + h->numel()), ref.to_f32());
      std::printf("[cuda %s dit %s] max|ours-ref|/max|ref| = %.3g\n", p == CudaPrecision::kFp32 ? "fp32" : "bf16", name, e);
      EXPECT_LE(e, tol) << name;
    }
  }
}

TEST_F(CudaComponents, VaeDecodeAndEncodeMatchDiffusers) {
  for (auto [p, tol] : {std::pair{CudaPrecision::kFp32, 1e-4}, {CudaPrecision::kBf16, 5e-2}}) {
    auto be = cuda(p);
    ASSERT_TRUE(be);
    auto vae = Flux2Vae::load(klein::testing::tiny_model_dir() / "vae");
    ASSERT_TRUE(vae.ok()) << vae.status().to_string();
    ASSERT_TRUE(vae->prepare(*be).ok());
    RunContext ctx;
    ctx.backend = be.get();
    for (const char* name : {"vae_64x64", "vae_80x48"}) {
      auto img = vae->decode(must_read(ref_root() / name / "z.npy").to_tensor(), ctx);
      ASSERT_TRUE(img.ok()) << img.status().to_string();
      auto h = to_host(*be, std::move(img).value());
      ASSERT_TRUE(h.ok());
      EXPECT_LE(rel_err(std::vector<float>(h->data(), h->data() + h->numel()),
                        must_read(ref_root() / name / "image.npy").to_f32()), tol) << name;
    }
    auto mean = vae->encode_mean(must_read(ref_root() / "vae_enc_64x64" / "image.npy").to_tensor(), ctx);
    ASSERT_TRUE(mean.ok()) << mean.status().to_string();
    auto h = to_host(*be, std::move(mean).value());
    ASSERT_TRUE(h.ok());
    EXPECT_LE(rel_err(std::vector<float>(h->data(), h->data() + h->numel()),
                      must_read(ref_root() / "vae_enc_64x64" / "mean.npy").to_f32()), tol);
  }
}

TEST_F(CudaComponents, TextEncoderMatchesTransformers) {
  for (auto [precision, tol] : {std::pair{Precision::kFp32, 1e-4}, {Precision::kFast, 5e-2}}) {
    LoadOptions o;
    o.backend = BackendKind::kCuda;
    o.precision = precision;
    auto m = Model::open(klein::testing::tiny_model_dir().string(), o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ((*m)->backend_name(), "cuda");
    auto e = (*m)->encode_prompt("A cat holding a sign that says hello world");
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_LE(rel_err(e->data, must_read(ref_root() / "te_cat" / "prompt_embeds.npy").to_f32()), tol);
  }
}

// ---- whole requests through the public API

using CudaEndToEnd = CudaTest;

Image generate(BackendKind kind, Precision p, MemoryPolicy mem, const std::vector<std::string>& refs = {}) {
  LoadOptions o;
  o.threads = 2;
  o.backend = kind;
  o.precision = p;
  o.memory = mem;
  auto m = Model::open(klein::testing::tiny_model_dir().string(), o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  GenerateRequest g;
  g.prompt = "A cat holding a sign that says hello world";
  g.seed = 42;
  g.reference_images = refs;
  if (refs.empty()) g.width = 64, g.height = 64;
  auto r = (*m)->generate(g);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->image : Image{};
}

TEST_F(CudaEndToEnd, ImagesMatchTheCpuFloat32Path) {
  const std::vector<std::string> edit = {(ref_root() / "edit1_auto" / "ref0.png").string()};
  for (const auto& refs : {std::vector<std::string>{}, edit}) {
    const Image cpu = generate(BackendKind::kCpu, Precision::kFp32, MemoryPolicy::kLow, refs);
    for (auto [p, min_db] : {std::pair{Precision::kFp32, 50.0}, {Precision::kFast, 40.0}}) {
      for (MemoryPolicy mem : {MemoryPolicy::kLow, MemoryPolicy::kResident}) {
        const Image gpu = generate(BackendKind::kCuda, p, mem, refs);
        auto c = compare_rgb(gpu, cpu);
        ASSERT_TRUE(c.ok()) << c.status().to_string();
        std::printf("[cuda %s, %s, %s] PSNR %.2f dB, SSIM %.5f vs the CPU fp32 image\n",
                    p == Precision::kFp32 ? "fp32" : "bf16", mem == MemoryPolicy::kLow ? "low" : "resident",
                    refs.empty() ? "t2i" : "edit", c->psnr, c->ssim);
        EXPECT_GE(c->psnr, min_db);
      }
    }
  }
}

TEST_F(CudaEndToEnd, AutoPicksTheDevice) {
  LoadOptions o;
  auto m = Model::open(klein::testing::tiny_model_dir().string(), o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->backend_name(), "cuda");
}

}  // namespace
}  // namespace cuda_backend_test
}  // namespace klein

#endif  // KLEIN_HAS_CUDA
