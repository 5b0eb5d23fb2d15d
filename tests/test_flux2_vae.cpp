// FLUX.2 VAE: config parsing, loading with shape checks, decode / encode-mean against the
// diffusers reference fixtures (tests/data/ref/vae_*, made by scripts/reference/dump_reference.py
// from the tiny model in tests/data/tiny/vae), the latent batch-norm statistics, and the
// patchify / unpatchify / normalise helpers of pipeline/latents.h. (Full-size timings:
// klein-bench_vae.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "core/dtype.h"
#include "backend/run_context.h"
#include "backend/cpu/cpu_backend.h"
#include "io/dump.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "models/flux2_vae.h"
#include "pipeline/latents.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein {
namespace {

fs::path vae_dir() { return klein::testing::tiny_model_dir() / "vae"; }
fs::path ref_dir(const std::string& name) { return klein::testing::data_dir() / "ref" / name; }

// max|a − b| / max|b|.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  double e = 0, m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(a.data()[i])) return INFINITY;
    e = std::max(e, static_cast<double>(std::fabs(a.data()[i] - b.data()[i])));
    m = std::max(m, static_cast<double>(std::fabs(b.data()[i])));
  }
  return e / std::max(m, 1e-30);
}

Tensor load_npy(const fs::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->to_tensor() : Tensor();
}

const Flux2Vae& tiny_vae() {
  static const Flux2Vae* vae = [] {
    auto r = Flux2Vae::load(vae_dir());
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      std::abort();
    }
    return new Flux2Vae(std::move(r).value());
  }();
  return *vae;
}

nlohmann::json tiny_config() {
  auto j = read_json_file(vae_dir() / "config.json");
  EXPECT_TRUE(j.ok());
  return j.value();
}

// ------------------------------------------------------------------------------------------
// Config and loading
// ------------------------------------------------------------------------------------------
TEST(Flux2VaeConfig, ParsesTinyConfig) {
  auto c = Flux2VaeConfig::from_json(tiny_config(), "vae/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->block_out_channels, (std::vector<int64_t>{8, 16, 32, 32}));
  EXPECT_EQ(c->decoder_block_out_channels, c->block_out_channels);  // null → encoder's
  EXPECT_EQ(c->latent_channels, 32);
  EXPECT_EQ(c->norm_num_groups, 4);
  EXPECT_EQ(c->layers_per_block, 2);
  EXPECT_TRUE(c->mid_block_add_attention);
  EXPECT_TRUE(c->use_quant_conv);
  EXPECT_TRUE(c->use_post_quant_conv);
  EXPECT_DOUBLE_EQ(c->batch_norm_eps, 1e-4);
  EXPECT_EQ(c->patch_channels(), 128);
  EXPECT_EQ(c->scale_factor(), 8);
}

TEST(Flux2VaeConfig, RejectsUnsupported) {
  auto bad = [](const char* key, nlohmann::json v) {
    auto j = tiny_config();
    j[key] = std::move(v);
    return Flux2VaeConfig::from_json(j, "cfg.json");
  };
  auto r = bad("patch_size", {1, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("patch_size"), std::string::npos) << r.status().message();
  EXPECT_FALSE(bad("act_fn", "gelu").ok());
  EXPECT_FALSE(bad("norm_num_groups", 3).ok());  // 8 channels not divisible by 3
  EXPECT_FALSE(bad("block_out_channels", {8, 16, 32}).ok());  // 4 down_block_types listed
  EXPECT_FALSE(bad("block_out_channels", "8").ok());
  EXPECT_FALSE(bad("up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
                                      "AttnUpDecoderBlock2D"}).ok());
  auto j = tiny_config();
  j["decoder_block_out_channels"] = {4, 8, 16, 16};
  auto d = Flux2VaeConfig::from_json(j, "cfg.json");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->decoder_block_out_channels, (std::vector<int64_t>{4, 8, 16, 16}));
}

TEST(Flux2Vae, LoadsTinyModel) {
  const Flux2Vae& vae = tiny_vae();
  EXPECT_EQ(vae.bn_mean().size(), 128u);
  EXPECT_EQ(vae.bn_var().size(), 128u);
}

// A copy of the tiny vae folder whose config.json is `j` (weights symlinked).
fs::path vae_with_config(const nlohmann::json& j, const std::string& tag) {
  const fs::path d = klein::testing::make_temp_dir(tag);
  fs::create_symlink(fs::absolute(vae_dir() / "diffusion_pytorch_model.safetensors"),
                     d / "diffusion_pytorch_model.safetensors");
  std::ofstream(d / "config.json") << j.dump();
  return d;
}

TEST(Flux2Vae, ConfigContradictingWeightsNamesTheTensor) {
  {
    auto j = tiny_config();
    j["block_out_channels"] = {8, 16, 32, 64};
    const fs::path d = vae_with_config(j, "vae_badcfg");
    auto r = Flux2Vae::load(d);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kFormatError);
    EXPECT_NE(r.status().message().find("'encoder.down_blocks.3.resnets.0.conv1.weight'"), std::string::npos)
        << r.status().message();
    fs::remove_all(d);
  }
  {
    auto j = tiny_config();
    j["latent_channels"] = 16;
    const fs::path d = vae_with_config(j, "vae_badlat");
    auto r = Flux2Vae::load(d);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'encoder.conv_out.weight'"), std::string::npos) << r.status().message();
    fs::remove_all(d);
  }
  {
    auto j = tiny_config();
    j["layers_per_block"] = 3;
    const fs::path d = vae_with_config(j, "vae_badlayers");
    auto r = Flux2Vae::load(d);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kNotFound);
    EXPECT_NE(r.status().message().find("encoder.down_blocks.0.resnets.2"), std::string::npos)
        << r.status().message();
    fs::remove_all(d);
  }
}

TEST(Flux2Vae, RejectsBadInputs) {
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{1});
  RunContext ctx;
  ctx.backend = &pool;
  EXPECT_EQ(vae.decode(Tensor({1, 16, 4, 4}), ctx).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(vae.decode(Tensor({32, 4, 4}), ctx).status().code(), Code::kInvalidArgument);
  Tensor nan_z({1, 32, 2, 2});
  nan_z.data()[3] = NAN;
  EXPECT_EQ(vae.decode(nan_z, ctx).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(vae.encode_mean(Tensor({1, 3, 20, 16}), ctx).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(vae.encode_mean(Tensor({1, 4, 16, 16}), ctx).status().code(), Code::kInvalidArgument);
  // Cancellation surfaces as kCancelled.
  RunContext cctx = ctx;
  cctx.should_cancel = [] { return true; };
  EXPECT_EQ(vae.decode(Tensor({1, 32, 2, 2}), cctx).status().code(), Code::kCancelled);
}

TEST(Flux2Vae, BatchIsPerItem) {
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &pool;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  Tensor z({2, 32, 3, 2});
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = nd(rng);
  auto both = vae.decode(z, ctx);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  ASSERT_EQ(both->shape(), (Shape{2, 3, 24, 16}));
  Tensor z1({1, 32, 3, 2});
  std::memcpy(z1.data(), z.data() + z1.numel(), z1.numel() * sizeof(float));
  auto one = vae.decode(z1, ctx);
  ASSERT_TRUE(one.ok());
  for (int64_t i = 0; i < one->numel(); ++i) ASSERT_EQ(one->data()[i], both->data()[one->numel() + i]);
  Tensor img({2, 3, 16, 24});
  for (int64_t i = 0; i < img.numel(); ++i) img.data()[i] = std::tanh(nd(rng));
  auto m = vae.encode_mean(img, ctx);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->shape(), (Shape{2, 32, 2, 3}));
  // The second item runs in the buffers the first one left (BufferPool): stale values must not
  // show, so it equals the item encoded alone — as the decode's second item above.
  Tensor img1({1, 3, 16, 24});
  std::memcpy(img1.data(), img.data() + img1.numel(), img1.numel() * sizeof(float));
  auto m1 = vae.encode_mean(img1, ctx);
  ASSERT_TRUE(m1.ok());
  for (int64_t i = 0; i < m1->numel(); ++i) ASSERT_EQ(m1->data()[i], m->data()[m1->numel() + i]);
}

// ------------------------------------------------------------------------------------------
// Against the diffusers fixtures
// ------------------------------------------------------------------------------------------
void check_decode_case(const std::string& name, bool hooks) {
  const fs::path d = ref_dir(name);
  if (!fs::exists(d / "image.npy")) GTEST_SKIP() << "fixture " << d << " not generated yet";
  const Flux2Vae& vae = tiny_vae();
  const Tensor z = load_npy(d / "z.npy"), ref = load_npy(d / "image.npy");
  CpuBackend pool(CpuBackendOptions{2});
  const fs::path dump_dir = klein::testing::make_temp_dir("vae_dump");
  Dumper dumper(hooks ? dump_dir : fs::path());
  RunContext ctx;
  ctx.backend = &pool;
  ctx.dumper = hooks ? &dumper : nullptr;
  auto img = vae.decode(z, ctx);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  const double e = rel_err(*img, ref);
  std::printf("[ vae ] decode %s: max|ours-ref|/max|ref| = %.3g\n", name.c_str(), e);
  EXPECT_LE(e, 1e-5) << name;
  if (hooks) {
    // Our dump name → the hooked diffusers module.
    std::vector<std::pair<std::string, std::string>> pairs = {
        {"vae.post_quant_conv", "post_quant_conv"}, {"vae.conv_in", "decoder.conv_in"},
        {"vae.mid", "decoder.mid_block"}, {"vae.conv_norm_out", "decoder.conv_norm_out"}};
    for (int i = 0; i < 4; ++i)
      pairs.push_back({"vae.up" + std::to_string(i), "decoder.up_blocks." + std::to_string(i)});
    for (const auto& [ours, theirs] : pairs) {
      if (!fs::exists(d / (theirs + ".npy"))) continue;
      const double ei = rel_err(load_npy(dump_dir / (ours + ".npy")), load_npy(d / (theirs + ".npy")));
      std::printf("[ vae ]   %-20s vs %-24s %.3g\n", ours.c_str(), theirs.c_str(), ei);
      EXPECT_LE(ei, 1e-5) << ours;
    }
  }
  fs::remove_all(dump_dir);
}

TEST(Flux2VaeRef, Decode64x64) { check_decode_case("vae_64x64", false); }
TEST(Flux2VaeRef, Decode80x48) { check_decode_case("vae_80x48", false); }
TEST(Flux2VaeRef, Decode32x32Intermediates) { check_decode_case("vae_32x32", true); }

TEST(Flux2VaeRef, EncodeMean64x64) {
  const fs::path d = ref_dir("vae_enc_64x64");
  if (!fs::exists(d / "mean.npy")) GTEST_SKIP() << "fixture " << d << " not generated yet";
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &pool;
  auto mean = vae.encode_mean(load_npy(d / "image.npy"), ctx);
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  const double e = rel_err(*mean, load_npy(d / "mean.npy"));
  std::printf("[ vae ] encode_mean vae_enc_64x64: %.3g\n", e);
  EXPECT_LE(e, 1e-5);
  // The pipeline's image latents: patchify, then BN-normalise (float32 pipeline).
  if (fs::exists(d / "image_latents.npy")) {
    auto p = patchify(*mean);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(normalize_latents(*p, vae.latent_stats()).ok());
    const double el = rel_err(*p, load_npy(d / "image_latents.npy"));
    std::printf("[ vae ] image_latents vae_enc_64x64: %.3g\n", el);
    EXPECT_LE(el, 1e-5);
  }
}

// An encode fixture made outside the suite by scripts/reference/check_vae_encode.py --out DIR
// (image.npy, mean.npy); runs only when KLEIN_VAE_ENC_FIXTURE=DIR is set.
TEST(Flux2VaeRef, EncodeMeanExternalFixture) {
  const char* dir = std::getenv("KLEIN_VAE_ENC_FIXTURE");
  if (!dir) GTEST_SKIP() << "set KLEIN_VAE_ENC_FIXTURE to a check_vae_encode.py output folder";
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &pool;
  auto mean = vae.encode_mean(load_npy(fs::path(dir) / "image.npy"), ctx);
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  const double e = rel_err(*mean, load_npy(fs::path(dir) / "mean.npy"));
  std::printf("[ vae ] encode_mean %s: %.3g\n", dir, e);
  EXPECT_LE(e, 1e-5);
}

TEST(Flux2VaeRef, BatchNormStats) {
  const fs::path d = ref_dir("vae_bn");
  if (!fs::exists(d / "std.npy")) GTEST_SKIP() << "fixture " << d << " not generated yet";
  const Flux2Vae& vae = tiny_vae();
  const Tensor mean = load_npy(d / "running_mean.npy"), var = load_npy(d / "running_var.npy");
  ASSERT_EQ(mean.numel(), 128);
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(vae.bn_mean()[i], mean.data()[i]);
    EXPECT_EQ(vae.bn_var()[i], var.data()[i]);
  }
  const LatentStats f32 = vae.latent_stats(LatentArith::kF32);
  const Tensor sd = load_npy(d / "std.npy");
  // torch 2.x's CPU float sqrt is not correctly rounded (about 1 in 6 results is 1 ulp off
  // std::sqrt), so allow one ulp here.
  for (int i = 0; i < 128; ++i)
    EXPECT_LE(std::fabs(f32.std[i] - sd.data()[i]), std::nextafter(sd.data()[i], INFINITY) - sd.data()[i])
        << i;
  if (fs::exists(d / "std_bf16.npy")) {
    const LatentStats b16 = vae.latent_stats(LatentArith::kBF16);
    const Tensor sdb = load_npy(d / "std_bf16.npy");
    for (int i = 0; i < 128; ++i) EXPECT_EQ(b16.std[i], sdb.data()[i]) << i;
  }
}

// ------------------------------------------------------------------------------------------
// Latent layout helpers
// ------------------------------------------------------------------------------------------
TEST(Latents, PatchifyIndexing) {
  const int64_t C = 3, h = 2, w = 3;
  Tensor z({2, C, 2 * h, 2 * w});
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = static_cast<float>(i);
  auto p = patchify(z);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->shape(), (Shape{2, 4 * C, h, w}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t py = 0; py < 2; ++py)
        for (int64_t px = 0; px < 2; ++px)
          for (int64_t y = 0; y < h; ++y)
            for (int64_t x = 0; x < w; ++x) {
              const int64_t k = c * 4 + py * 2 + px;
              const float want = z.data()[((b * C + c) * 2 * h + 2 * y + py) * 2 * w + 2 * x + px];
              ASSERT_EQ(p->data()[((b * 4 * C + k) * h + y) * w + x], want);
            }
  auto u = unpatchify(*p);
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->shape(), z.shape());
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(u->data()[i], z.data()[i]);
  // And the other way round.
  Tensor q({1, 8, 3, 2});
  for (int64_t i = 0; i < q.numel(); ++i) q.data()[i] = static_cast<float>(i * 7 % 11);
  auto uq = unpatchify(q);
  ASSERT_TRUE(uq.ok());
  auto q2 = patchify(*uq);
  ASSERT_TRUE(q2.ok());
  for (int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q2->data()[i], q.data()[i]);
}

TEST(Latents, RejectsBadShapes) {
  EXPECT_FALSE(patchify(Tensor({1, 32, 5, 4})).ok());
  EXPECT_FALSE(patchify(Tensor({32, 4, 4})).ok());
  EXPECT_FALSE(unpatchify(Tensor({1, 30, 4, 4})).ok());
  LatentStats s{std::vector<float>(4, 0.0f), std::vector<float>(4, 1.0f)};
  Tensor z({1, 8, 2, 2});
  EXPECT_FALSE(normalize_latents(z, s).ok());
}

TEST(Latents, NormalizeRoundTrip) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  LatentStats s;
  for (int c = 0; c < 8; ++c) {
    s.mean.push_back(nd(rng));
    s.std.push_back(0.5f + std::fabs(nd(rng)));
  }
  Tensor z({1, 8, 3, 4});
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = nd(rng);
  Tensor orig = z.clone();
  ASSERT_TRUE(normalize_latents(z, s).ok());
  // Channel 2, element 5: (x − mean) / std.
  EXPECT_FLOAT_EQ(z.data()[2 * 12 + 5], (orig.data()[2 * 12 + 5] - s.mean[2]) / s.std[2]);
  ASSERT_TRUE(denormalize_latents(z, s).ok());
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_NEAR(z.data()[i], orig.data()[i], 1e-5f);
  // bf16 arithmetic: every result is a bf16 value.
  ASSERT_TRUE(denormalize_latents(z, s, LatentArith::kBF16).ok());
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.data()[i], round_bf16(z.data()[i]));
}

}  // namespace
}  // namespace klein

// ------------------------------------------------------------------------------------------
// Tiled decode / encode: equal to the whole-image pass (≤ 1e-5 relative) at tile sizes that
// divide the image and ones that do not, with every activation kept whole between the
// statistics passes (the default budget on this tiny model), with none kept in memory but all
// spilled to a temporary file, and with none at all (pure recompute).
// ------------------------------------------------------------------------------------------
namespace klein {
namespace {

// Every tile size with the activations kept in memory (the default) and with all of them
// spilled; pure recompute (nothing kept, no spill) at one tile size that does not divide the
// image: it repeats each tile's whole forward once per statistics pass, so at the smallest
// tiles it costs ~10x the others and, at every size, runs the same tile-edge code.
std::vector<VaeTiling> tiling_cases(std::initializer_list<int64_t> tiles, int64_t recompute_tile) {
  std::vector<VaeTiling> cases;
  for (int64_t tile : tiles) {
    cases.push_back(VaeTiling{.tile = tile, .keep_bytes = uint64_t{256} << 20});
    cases.push_back(VaeTiling{.tile = tile, .keep_bytes = 0, .spill = true});
  }
  cases.push_back(VaeTiling{.tile = recompute_tile, .keep_bytes = 0, .spill = false});
  return cases;
}

TEST(Flux2VaeTiled, DecodeEqualsWholeImage) {
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &pool;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  Tensor z({1, 32, 7, 5});  // image 56 × 40
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = nd(rng);
  auto whole = vae.decode(z, ctx, VaeTiling{.tile = -1});
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  for (const VaeTiling& t : tiling_cases({8, 16, 24, 40, 64}, 24)) {
    EXPECT_EQ(vae.tile_size(56, 40, t, true), t.tile);
    auto tiled = vae.decode(z, ctx, t);
    ASSERT_TRUE(tiled.ok()) << tiled.status().to_string();
    EXPECT_LE(rel_err(*tiled, *whole), 1e-5) << "tile " << t.tile << " keep " << t.keep_bytes << " spill " << t.spill;
  }
}

TEST(Flux2VaeTiled, EncodeEqualsWholeImage) {
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &pool;
  std::mt19937 rng(22);
  std::normal_distribution<float> nd;
  Tensor img({1, 3, 48, 72});
  for (int64_t i = 0; i < img.numel(); ++i) img.data()[i] = std::tanh(nd(rng));
  auto whole = vae.encode_mean(img, ctx, VaeTiling{.tile = -1});
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  for (const VaeTiling& t : tiling_cases({8, 16, 24, 40}, 40)) {
    auto tiled = vae.encode_mean(img, ctx, t);
    ASSERT_TRUE(tiled.ok()) << tiled.status().to_string();
    EXPECT_LE(rel_err(*tiled, *whole), 1e-5) << "tile " << t.tile << " keep " << t.keep_bytes << " spill " << t.spill;
  }
}

// With nothing kept in memory the activations go to the spill folder; one that cannot be
// written is an error naming it (so the spill path above really ran), never a wrong image.
TEST(Flux2VaeTiled, SpillFolderIsUsedAndNamed) {
  const Flux2Vae& vae = tiny_vae();
  CpuBackend pool(CpuBackendOptions{1});
  RunContext ctx;
  ctx.backend = &pool;
  Tensor z({1, 32, 4, 4});
  const std::string nowhere = "/nonexistent-klein-spill-dir";
  auto r = vae.decode(z, ctx, VaeTiling{.tile = 16, .keep_bytes = 0, .spill = true, .spill_dir = nowhere});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(nowhere), std::string::npos) << r.status().to_string();
  // Kept in memory: the folder is never touched.
  EXPECT_TRUE(vae.decode(z, ctx, VaeTiling{.tile = 16, .spill = true, .spill_dir = nowhere}).ok());
}

TEST(Flux2VaeTiled, TileSizeAutomaticAndRounded) {
  const Flux2Vae& vae = tiny_vae();
  EXPECT_EQ(vae.tile_size(64, 64, VaeTiling{.tile = 20}, true), 16);  // down to a multiple of 8
  EXPECT_EQ(vae.tile_size(64, 64, VaeTiling{.tile = 3}, true), 8);
  EXPECT_EQ(vae.tile_size(64, 64, VaeTiling{}, true), 0);             // small: whole image
  EXPECT_EQ(vae.tile_size(64, 64, VaeTiling{.auto_above_bytes = 1}, true), 512);
  EXPECT_EQ(vae.tile_size(64, 64, VaeTiling{.auto_above_bytes = 1}, false), 512);
}

}  // namespace
}  // namespace klein
