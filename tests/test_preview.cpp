// Live previews: the latent → RGB projection against a hand-computed case, the embedded FLUX.2
// map, the preview callback of the C++ and C APIs, `klein generate --preview`, and the cost at
// 1024² (printed, not asserted).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "io/image_reader.h"
#include "klein/klein.h"
#include "klein/klein_c.h"
#include "pipeline/preview.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein {
namespace {

// A 1-channel map (packed latent: 4 channels per token) on a 1 × 2 token grid, so the 2 × 4
// projection can be written out by hand: one latent channel c = 0, sub-pixel k = py·2 + px.
TEST(LatentPreview, ProjectionMatchesHandComputedCase) {
  auto map = parse_latent_rgb_map(
      R"({"latent_channels": 1, "denormalized": true, "factors": [[0.5, -0.25, 1.0]], "bias": [0.25, 0.0, -0.5]})",
      "test map");
  ASSERT_TRUE(map.ok()) << map.status().to_string();
  // x0 = x − σ·v with σ = 0.5; de-normalised z·std + mean with std 2, mean 0.125 per channel.
  Tensor x({2, 4}), v({2, 4});
  const float xs[8] = {0.5f, -0.5f, 0.25f, 1.0f, 0.0f, 0.75f, -1.0f, 0.125f};
  const float vs[8] = {1.0f, 0.0f, -0.5f, 0.5f, 0.25f, 0.5f, 0.0f, -0.25f};
  for (int i = 0; i < 8; ++i) x.data()[i] = xs[i], v.data()[i] = vs[i];
  LatentStats st{{0.125f, 0.125f, 0.125f, 0.125f}, {2.0f, 2.0f, 2.0f, 2.0f}};
  auto img = latent_preview(x, v, 0.5f, 1, 2, *map, st, 8, 4);  // 2 × 4 latent pixels, ×2 nearest
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  ASSERT_EQ(img->width, 8);
  ASSERT_EQ(img->height, 4);
  auto u8 = [](double r) {  // [-1, 1] → [0, 255], clamped, rounded
    const double t = std::min(1.0, std::max(0.0, (r + 1) / 2));
    return static_cast<int>(std::nearbyint(t * 255));
  };
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k) {
      const double z = (xs[n * 4 + k] - 0.5 * vs[n * 4 + k]) * 2.0 + 0.125;
      const int ly = k / 2, lx = 2 * n + k % 2;  // latent pixel (2y+py, 2x+px)
      const int want[3] = {u8(0.25 + 0.5 * z), u8(-0.25 * z), u8(-0.5 + 1.0 * z)};
      for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx)
          for (int c = 0; c < 3; ++c)
            EXPECT_EQ(img->rgb[((2 * ly + dy) * 8 + 2 * lx + dx) * 3 + c], want[c]) << n << " " << k << " " << c;
    }
  // The flag off: the normalised latent is projected as it is.
  map->denormalized = false;
  auto raw = latent_preview(x, v, 0.5f, 1, 2, *map, {}, 4, 2);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->rgb[0], u8(0.25 + 0.5 * (0.5 - 0.5)));
}

TEST(LatentPreview, EmbeddedFlux2MapAndBadMaps) {
  auto m = flux2_latent_rgb_map();
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->latent_channels, 32);
  EXPECT_TRUE(m->denormalized);
  ASSERT_EQ(m->factors.size(), 96u);
  EXPECT_FLOAT_EQ(m->factors[3 * 3 + 1], 0.3009f);  // row 3 = [0.2144, 0.3009, 0.3652]
  EXPECT_FLOAT_EQ(m->factors[31 * 3 + 2], -0.0614f);
  EXPECT_FLOAT_EQ(m->bias[2], -0.0851f);
  EXPECT_FALSE(parse_latent_rgb_map("{", "x").ok());
  EXPECT_FALSE(parse_latent_rgb_map(R"({"latent_channels": 2, "denormalized": true, "factors": [[1,2,3]], "bias": [0,0,0]})", "x").ok());
}

klein::GenerateRequest small_request() {
  klein::GenerateRequest r;
  r.prompt = "a red fox";
  r.width = 48;
  r.height = 32;
  r.steps = 3;
  r.seed = 5;
  return r;
}

TEST(LatentPreview, CallbackAfterEveryStep) {
  auto model = Model::open(testing::tiny_model_dir().string(), {.threads = 2});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::vector<int> steps;
  Callbacks cb;
  cb.preview = [&](int step, int total, const Image& img) {
    steps.push_back(step);
    EXPECT_EQ(total, 3);
    EXPECT_EQ(img.width, 48);
    EXPECT_EQ(img.height, 32);
    EXPECT_EQ(img.rgb.size(), 48u * 32 * 3);
  };
  auto r = (*model)->generate(small_request(), cb);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3}));
  // The same image as without previews.
  auto plain = (*model)->generate(small_request());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->image.rgb, r->image.rgb);
}

TEST(LatentPreview, CApiCallback) {
  klein_model* m = nullptr;
  klein_error err;
  klein_load_params lp = klein_load_default_params();
  lp.threads = 2;
  ASSERT_EQ(klein_model_open(testing::tiny_model_dir().c_str(), &lp, &m, &err), KLEIN_OK) << err.message;
  struct Seen {
    int calls = 0, w = 0, h = 0;
  } seen;
  klein_generate_params gp = klein_generate_default_params();
  gp.prompt = "a cat";
  gp.width = 32;
  gp.height = 48;
  gp.steps = 2;
  gp.user_data = &seen;
  gp.preview = [](int, int, const klein_image* img, void* ud) {
    auto* s = static_cast<Seen*>(ud);
    ++s->calls;
    s->w = img->width;
    s->h = img->height;
  };
  klein_image* img = nullptr;
  ASSERT_EQ(klein_model_generate(m, &gp, &img, &err), KLEIN_OK) << err.message;
  EXPECT_EQ(seen.calls, 2);
  EXPECT_EQ(seen.w, 32);
  EXPECT_EQ(seen.h, 48);
  klein_image_free(img);
  klein_model_free(m);
}

TEST(LatentPreview, CliPreviewLeavesAValidPngAndNoTempFiles) {
  const fs::path dir = testing::make_temp_dir("preview");
  const fs::path out = dir / "out.png", pv = dir / "live.png";
  auto r = testing::run_cli("generate --prompt fox -W 48 -H 32 --steps 2 -q -o '" + out.string() + "' --preview '" +
                            pv.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto img = read_image(pv);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  EXPECT_EQ(img->width, 48);
  EXPECT_EQ(img->height, 32);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    EXPECT_TRUE(e.path() == out || e.path() == pv) << "left behind: " << e.path();
  }
  EXPECT_EQ(files, 2);
  // --vae-tile gives the same picture as the whole-image VAE (under fp32: the bf16 convolutions
  // of the default fast path round tiles and the whole image apart).
  const fs::path tiled = dir / "tiled.png";
  r = testing::run_cli("generate --prompt fox -W 48 -H 32 --steps 2 -q --precision fp32 -o '" + out.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_cli("generate --prompt fox -W 48 -H 32 --steps 2 -q --precision fp32 --vae-tile 16 -o '" +
                       tiled.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto a = read_image(out), b = read_image(tiled);
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0;
  for (size_t i = 0; i < a->rgb.size(); ++i) differ += std::abs(a->rgb[i] - b->rgb[i]) > 1;
  EXPECT_EQ(differ, 0);
  EXPECT_NE(testing::run_cli("generate --prompt fox -o '" + out.string() + "' --preview '" + (dir / "x.jpg").string() +
                             "'").exit_code, 0);
}

}  // namespace
}  // namespace klein
