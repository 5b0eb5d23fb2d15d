// End-to-end text-to-image against diffusers' Flux2KleinPipeline (fp32) on the tiny model:
// same seed -> same noise, same latents after every step, same decoded image, same 8-bit PNG.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::max_rel_err;
using klein::testing::must_read_f32;

namespace {

struct T2ICase {
  std::string name;
  int width, height, steps;  // the output size
  uint64_t seed;
  std::string prompt;
  int width_arg = 0, height_arg = 0;  // what the pipeline was called with (0 = None)
  std::vector<std::string> refs;      // reference images (editing), files in the case folder
};

// gtest prints parameters of failing cases; a name is all that is needed.
void PrintTo(const T2ICase& c, std::ostream* os) { *os << c.name; }

std::vector<T2ICase> t2i_cases() {
  std::vector<T2ICase> r;
  auto j = klein::read_json_file(klein::testing::data_dir() / "ref" / "manifest.json");
  if (!j.ok()) return r;
  for (const auto& c : (*j)["cases"])
    if (c.value("kind", "") == "t2i" && c.value("dtype", "") == "float32")
    {
      T2ICase t{c["name"], c["width"], c["height"], c["num_inference_steps"], c["seed"], c["prompt"]};
      t.width_arg = c.contains("width_arg") && c["width_arg"].is_number() ? c["width_arg"].get<int>() : t.width;
      t.height_arg = c.contains("height_arg") && c["height_arg"].is_number() ? c["height_arg"].get<int>() : t.height;
      if (c.contains("refs")) t.refs = c["refs"].get<std::vector<std::string>>();
      r.push_back(std::move(t));
    }
  return r;
}

class TextToImageRef : public ::testing::TestWithParam<T2ICase> {};

TEST_P(TextToImageRef, MatchesDiffusersPipeline) {
  const T2ICase& c = GetParam();
  const fs::path ref = klein::testing::data_dir() / "ref" / c.name;
  auto dump = klein::testing::make_temp_dir("t2i");
  klein::GenerateOptions o;
  o.model_dir = klein::testing::tiny_model_dir().string();
  o.prompt = c.prompt;
  o.width = c.width_arg;
  o.height = c.height_arg;
  for (const auto& f : c.refs) o.reference_images.push_back((ref / f).string());
  o.steps = c.steps;
  o.seed = c.seed;
  o.threads = 2;
  o.precision = klein::Precision::kFp32;  // the exact path is diffusers' float32 pipeline
  o.dump_dir = dump.string();
  auto r = klein::generate(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->width, c.width);
  EXPECT_EQ(r->height, c.height);

  if (!c.refs.empty()) {  // normalised packed reference tokens, as prepare_image_latents returns them
    const double e = max_rel_err(must_read_f32(dump / "ref_latents.npy"), must_read_f32(ref / "ref_latents.npy"));
    EXPECT_LE(e, 1e-5) << "ref_latents";
  }
  // Seeded noise is bit-identical to torch's.
  EXPECT_EQ(must_read_f32(dump / "noise.npy"), must_read_f32(ref / "noise.npy"));
  for (int k = 1; k <= c.steps; ++k) {
    const std::string n = "latents_step" + std::to_string(k) + ".npy";
    EXPECT_LE(max_rel_err(must_read_f32(dump / n), must_read_f32(ref / n)), 1e-4) << n;
  }
  EXPECT_LE(max_rel_err(must_read_f32(dump / "latents_final.npy"), must_read_f32(ref / "latents_final.npy")), 1e-4);
  const double img_err = max_rel_err(must_read_f32(dump / "image.npy"), must_read_f32(ref / "image.npy"));
  EXPECT_LE(img_err, 1e-4) << "float image";

  // 8-bit output: equal in >= 99.9 % of samples, never more than 1 apart.
  auto u8 = klein::read_npy(ref / "image_u8.npy");
  ASSERT_TRUE(u8.ok());
  ASSERT_EQ(u8->bytes.size(), r->image.rgb.size());
  size_t diff = 0;
  int maxd = 0;
  for (size_t i = 0; i < u8->bytes.size(); ++i) {
    const int d = std::abs(static_cast<int>(u8->bytes[i]) - static_cast<int>(r->image.rgb[i]));
    diff += d != 0;
    maxd = std::max(maxd, d);
  }
  const double equal = 1.0 - static_cast<double>(diff) / u8->bytes.size();
  std::printf("[ info ] %s: float image rel err %.3g, 8-bit equal %.4f%%, max diff %d\n", c.name.c_str(), img_err,
              100 * equal, maxd);
  EXPECT_GE(equal, 0.999);
  EXPECT_LE(maxd, 1);
  fs::remove_all(dump);
}

INSTANTIATE_TEST_SUITE_P(Tiny, TextToImageRef, ::testing::ValuesIn(t2i_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace

TEST(TextToImage, FixturesArePresent) {
  int edits = 0;
  for (const auto& c : t2i_cases()) edits += !c.refs.empty();
  EXPECT_GE(t2i_cases().size(), 4u);
  EXPECT_GE(edits, 2) << "editing fixtures with 1 and 3 references";
}

TEST(TextToImage, CliWritesPngWithParameters) {
  auto dir = klein::testing::make_temp_dir("gen");
  auto out = dir / "out.png";
  auto r = klein::testing::run_cli("generate --prompt 'a red fox' -W 40 -H 33 --seed 7 -o '" + out.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("not a multiple of 16"), std::string::npos) << r.err;  // floored, with a warning
  EXPECT_NE(r.err.find("random-weight test model"), std::string::npos) << r.err;
  std::ifstream f(out, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string png = ss.str();
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  // IHDR: width 32, height 32 (floored from 40x33).
  auto be32 = [&](size_t o) {
    return (static_cast<uint8_t>(png[o]) << 24) | (static_cast<uint8_t>(png[o + 1]) << 16) |
           (static_cast<uint8_t>(png[o + 2]) << 8) | static_cast<uint8_t>(png[o + 3]);
  };
  EXPECT_EQ(be32(16), 32u);
  EXPECT_EQ(be32(20), 32u);
  for (const char* s : {"prompt", "a red fox", "seed", "steps", "size", "32x32", "model", "klein.cpp"})
    EXPECT_NE(png.find(s), std::string::npos) << s;
  fs::remove_all(dir);
}

TEST(TextToImage, NonFiniteResultIsAnErrorNotAPicture) {
  auto dir = klein::testing::make_temp_dir("gen_nan");
  std::vector<float> huge(128 * 2 * 2, 3e38f);
  ASSERT_TRUE(klein::write_npy(dir / "noise.npy", klein::DType::kF32, {1, 128, 2, 2}, huge.data()).ok());
  auto out = dir / "out.png";
  auto r = klein::testing::run_cli("generate --prompt x -W 32 -H 32 --noise '" + (dir / "noise.npy").string() +
                                   "' -q -o '" + out.string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // Wrong noise shape for the size.
  r = klein::testing::run_cli("generate --prompt x -W 64 -H 64 --noise '" + (dir / "noise.npy").string() +
                              "' -q -o '" + out.string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("[1, 128, 4, 4]"), std::string::npos) << r.err;
  // Not a PNG path.
  r = klein::testing::run_cli("generate --prompt x -W 32 -H 32 -q -o '" + (dir / "out.jpg").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(".png"), std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().extension(), ".npy") << e.path();
  fs::remove_all(dir);
}

// Without a size (and without references) the output takes the VAE config's sample_size: 1024 in
// every FLUX.2 file (diffusers' default), another size for a model made for it; and a bad
// sample_size is one clear error naming the file.
TEST(TextToImage, DefaultSizeIsTheVaesSampleSize) {
  const fs::path dir = klein::testing::make_temp_dir("native_size");
  fs::copy(klein::testing::tiny_model_dir(), dir / "m", fs::copy_options::recursive);
  const fs::path cfg = dir / "m" / "vae" / "config.json";
  auto j = klein::read_json_file(cfg);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["sample_size"], 1024);  // the tiny model keeps the real value
  auto write = [&](const nlohmann::json& v) {
    (*j)["sample_size"] = v;
    std::ofstream(cfg) << j->dump(1);
  };
  write(48);
  {
    auto model = klein::Model::open((dir / "m").string());
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    klein::GenerateRequest g;
    g.prompt = "a";
    g.steps = 1;
    auto r = (*model)->generate(g);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->image.width, 48);
    EXPECT_EQ(r->image.height, 48);
    g.width = 32;  // one given dimension: the other stays native
    r = (*model)->generate(g);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->image.width, 32);
    EXPECT_EQ(r->image.height, 48);
  }
  write(4);
  auto bad = klein::Model::open((dir / "m").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sample_size"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("vae"), std::string::npos) << bad.status().to_string();
  fs::remove_all(dir);
}

TEST(Editing, BadReferenceFailsBeforeModelWork) {
  auto dir = klein::testing::make_temp_dir("edit_bad");
  auto out = dir / "out.png";
  std::ofstream(dir / "not_an_image.png") << "hello, I am text";
  // A PNG whose header claims 100000 x 100000 pixels.
  const unsigned char sig[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                               0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0, 8, 2, 0, 0, 0, 0, 0, 0, 0};
  std::ofstream(dir / "huge.png", std::ios::binary).write(reinterpret_cast<const char*>(sig), sizeof sig);
  for (const char* f : {"not_an_image.png", "huge.png", "missing.png"}) {
    auto r = klein::testing::run_cli("generate --prompt x -q --ref '" + (dir / f).string() + "' -o '" + out.string() + "'");
    EXPECT_NE(r.exit_code, 0) << f;
    EXPECT_LT(r.exit_code, 128) << f;
    EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  fs::remove_all(dir);
}
