// klein::Session: base models with classifier-free guidance against diffusers' Flux2KleinPipeline
// (fp32, tests/data/ref_base from scripts/reference/dump_base_reference.py on the tiny base model
// tests/data/tiny_base), Session reuse and misuse, batches of seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "api/memory_needs.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::max_rel_err;
using klein::testing::must_read_f32;

namespace {

using klein::Code;

fs::path base_ref_dir() { return klein::testing::data_dir() / "ref_base"; }
std::string tiny_base() { return (klein::testing::data_dir() / "tiny_base").string(); }

struct BaseCase {
  std::string name, prompt, negative;
  int width = 0, height = 0, width_arg = 0, height_arg = 0, steps = 0;
  uint64_t seed = 0;
  double guidance = 0;
  bool cfg = false;
  std::vector<std::string> refs;
};
void PrintTo(const BaseCase& c, std::ostream* os) { *os << c.name; }

std::vector<BaseCase> base_cases() {
  std::vector<BaseCase> r;
  auto j = klein::read_json_file(base_ref_dir() / "manifest.json");
  if (!j.ok()) return r;
  for (const auto& c : (*j)["cases"]) {
    BaseCase b;
    b.name = c["name"];
    b.prompt = c["prompt"];
    b.negative = c["negative_prompt"];
    b.width = c["width"];
    b.height = c["height"];
    b.width_arg = c["width_arg"].is_number() ? c["width_arg"].get<int>() : 0;
    b.height_arg = c["height_arg"].is_number() ? c["height_arg"].get<int>() : 0;
    b.steps = c["num_inference_steps"];
    b.seed = c["seed"];
    b.guidance = c["guidance_scale"];
    b.cfg = c["cfg"];
    b.refs = c["refs"].get<std::vector<std::string>>();
    r.push_back(std::move(b));
  }
  return r;
}

class BaseModelRef : public ::testing::TestWithParam<BaseCase> {};

// Every step's guided velocity and latents, the decoder input, the float image and the 8-bit
// picture equal diffusers' at the tolerances of the distilled fixtures (test_generate.cpp).
TEST_P(BaseModelRef, MatchesDiffusersWithGuidance) {
  const BaseCase& c = GetParam();
  const fs::path ref = base_ref_dir() / c.name;
  const fs::path dump = klein::testing::make_temp_dir("base_ref");
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.precision = klein::Precision::kFp32;  // the exact path is diffusers' float32 pipeline
  auto model = klein::Model::open(tiny_base(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_FALSE((*model)->distilled());
  klein::GenerateRequest g;
  g.prompt = c.prompt;
  g.negative_prompt = c.negative;
  g.guidance_scale = c.guidance;
  g.width = c.width_arg;
  g.height = c.height_arg;
  g.steps = c.steps;
  g.seed = c.seed;
  for (const auto& f : c.refs) g.reference_images.push_back((ref / f).string());
  // Only what is compared (each dump is written and synced: the transformer's own would cost).
  g.dump = {dump.string(), "noise,negative_prompt_embeds,velocity_step,latents_step,latents_final,image"};
  auto r = (*model)->generate(g);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->width, c.width);
  EXPECT_EQ(r->height, c.height);

  // The negative prompt's embeddings: "" is ref/te_empty's prompt, another one is dumped.
  if (c.cfg) {
    const fs::path neg = c.negative.empty() ? klein::testing::data_dir() / "ref" / "te_empty" / "prompt_embeds.npy"
                                            : ref / "negative_prompt_embeds.npy";
    EXPECT_LE(max_rel_err(must_read_f32(dump / "negative_prompt_embeds.npy"), must_read_f32(neg)), 1e-5);
  } else {
    EXPECT_FALSE(fs::exists(dump / "negative_prompt_embeds.npy")) << "guidance 1: no negative prompt";
  }
  EXPECT_EQ(must_read_f32(dump / "noise.npy"), must_read_f32(ref / "noise.npy"));
  for (int k = 1; k <= c.steps; ++k) {
    for (const char* what : {"velocity_step", "latents_step"}) {
      const std::string n = what + std::to_string(k) + ".npy";
      EXPECT_LE(max_rel_err(must_read_f32(dump / n), must_read_f32(ref / n)), 1e-4) << n;
    }
  }
  EXPECT_LE(max_rel_err(must_read_f32(dump / "latents_final.npy"), must_read_f32(ref / "latents_final.npy")), 1e-4);
  const double img_err = max_rel_err(must_read_f32(dump / "image.npy"), must_read_f32(ref / "image.npy"));
  EXPECT_LE(img_err, 1e-4) << "float image";
  auto u8 = klein::read_npy(ref / "image_u8.npy");
  ASSERT_TRUE(u8.ok());
  const auto [equal, maxd] = klein::testing::u8_agreement(u8->bytes, r->image.rgb);
  EXPECT_GE(equal, 0.999);
  EXPECT_LE(maxd, 1);
  fs::remove_all(dump);
}

INSTANTIATE_TEST_SUITE_P(TinyBase, BaseModelRef, ::testing::ValuesIn(base_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace

TEST(BaseModel, FixturesArePresent) {
  int cfg = 0, plain = 0, edits = 0;
  for (const auto& c : base_cases()) {
    cfg += c.cfg;
    plain += !c.cfg;
    edits += !c.refs.empty();
  }
  EXPECT_GE(cfg, 3);
  EXPECT_GE(plain, 1) << "guidance 1.0 on a base model";
  EXPECT_GE(edits, 1);
}

TEST(BaseModel, DefaultsAreFiftyStepsAndGuidanceFour) {
  auto model = klein::Model::open(tiny_base());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto s = klein::Session::create(**model);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE((*s)->guided());
  EXPECT_EQ((*s)->guidance_scale(), 4.0f);
  klein::SessionOptions o;
  o.guidance_scale = 1.0;  // diffusers: guidance_scale > 1 turns CFG on
  auto s1 = klein::Session::create(**model, o);
  ASSERT_TRUE(s1.ok());
  EXPECT_FALSE((*s1)->guided());
  ASSERT_TRUE((*s1)->encode_prompt("a").ok());
  klein::DenoiseParams p;
  p.width = p.height = 16;
  ASSERT_TRUE((*s1)->denoise(p).ok());
  EXPECT_EQ((*s1)->steps(), 50);
  o.guidance_scale = std::nan("");
  EXPECT_EQ(klein::Session::create(**model, o).status().code(), Code::kInvalidArgument);
  // Model::denoise runs no guidance: a base model at a scale > 1 is sent to a Session.
  auto pe = (*model)->encode_prompt("a");
  ASSERT_TRUE(pe.ok());
  auto z = (*model)->denoise(*pe, {}, p);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("klein::Session"), std::string::npos) << z.status().to_string();
}

TEST(BaseModel, DistilledModelIgnoresGuidanceWithANote) {
  auto model = klein::Model::open(klein::testing::tiny());
  ASSERT_TRUE(model.ok());
  klein::GenerateRequest g;
  g.prompt = "a";
  g.width = g.height = 32;
  g.steps = 2;
  auto plain = (*model)->generate(g);
  ASSERT_TRUE(plain.ok());
  std::vector<std::string> logs;
  klein::Callbacks cb;
  cb.log = [&](const std::string& m) { logs.push_back(m); };
  g.guidance_scale = 7.5;
  auto guided = (*model)->generate(g, cb);
  ASSERT_TRUE(guided.ok());
  EXPECT_EQ(guided->image.rgb, plain->image.rgb);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_NE(logs[0].find("guidance scale 7.5 is ignored"), std::string::npos) << logs[0];
}

// Two Sessions one after the other on one Model (no reload), a Session reused for a second seed,
// and generate_batch: the same images as separate generate calls.
TEST(Session, ReuseGivesTheImagesOfSeparateRuns) {
  klein::LoadOptions lo;
  lo.threads = 2;
  auto model = klein::Model::open(tiny_base(), lo);
  ASSERT_TRUE(model.ok());
  klein::GenerateRequest g;
  g.prompt = "a red cube";
  g.width = 32;
  g.height = 48;
  g.steps = 2;
  std::vector<std::vector<uint8_t>> want;
  for (uint64_t seed : {3u, 9u}) {
    g.seed = seed;
    auto r = (*model)->generate(g);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    want.push_back(r->image.rgb);
  }
  EXPECT_NE(want[0], want[1]);
  for (int round = 0; round < 2; ++round) {
    auto s = klein::Session::create(**model);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->encode_prompt(g.prompt).ok());
    int k = 0;
    for (uint64_t seed : {3u, 9u}) {
      klein::DenoiseParams p;
      p.width = 32;
      p.height = 48;
      p.steps = 2;
      p.seed = seed;
      ASSERT_TRUE((*s)->denoise(p).ok());
      auto img = (*s)->decode();
      ASSERT_TRUE(img.ok()) << img.status().to_string();
      EXPECT_EQ(img->rgb, want[k++]) << "round " << round << " seed " << seed;
    }
  }
  auto batch = (*model)->generate_batch(g, {3, 9});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  ASSERT_EQ(batch->size(), 2u);
  EXPECT_EQ((*batch)[0].image.rgb, want[0]);
  EXPECT_EQ((*batch)[1].image.rgb, want[1]);
  EXPECT_EQ((*batch)[1].metadata[1].second, "9");
}

TEST(Session, PhasesOutOfOrderAreClearErrors) {
  auto model = klein::Model::open(klein::testing::tiny());
  ASSERT_TRUE(model.ok());
  auto s = klein::Session::create(**model);
  ASSERT_TRUE(s.ok());
  klein::DenoiseParams p;
  p.width = p.height = 16;
  p.steps = 1;
  klein::Status st = (*s)->denoise(p);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("call encode_prompt"), std::string::npos) << st.to_string();
  auto img = (*s)->decode();
  EXPECT_EQ(img.status().code(), Code::kInvalidArgument);
  EXPECT_NE(img.status().message().find("call denoise first"), std::string::npos) << img.status().to_string();
  EXPECT_EQ((*s)->latents().status().code(), Code::kInvalidArgument);
  ASSERT_TRUE((*s)->encode_prompt("a").ok());
  ASSERT_TRUE((*s)->denoise(p).ok());
  st = (*s)->set_references({(klein::testing::data_dir() / "ref" / "edit1_auto" / "ref0.png").string()});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("before the first denoise"), std::string::npos) << st.to_string();
  auto z = (*s)->latents();
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->shape, (std::vector<int64_t>{1, 128, 1, 1}));
  // Given embeddings of the wrong width name what they expected.
  klein::FloatArray bad{{1, 4, 5}, std::vector<float>(20, 0.0f)};
  st = (*s)->set_prompt_embeddings(bad);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("expected prompt embeddings"), std::string::npos) << st.to_string();
  auto open_tok = klein::Model::open_tokenizer(klein::testing::tiny());
  ASSERT_TRUE(open_tok.ok());
  EXPECT_EQ(klein::Session::create(**open_tok).status().code(), Code::kInvalidArgument);
}

TEST(Session, CliBatchWritesOneFilePerSeed) {
  const fs::path dir = klein::testing::make_temp_dir("session_cli");
  const std::string common = " -q --model " + tiny_base() + " --prompt cube -W 32 -H 32 --steps 2";
  auto r = klein::testing::run_cli("generate" + common + " --seeds 4,6 -o " + (dir / "b.png").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = klein::testing::run_cli("generate" + common + " --seed 6 -g 4 -o " + (dir / "one.png").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir / "b-4.png"));
  auto a = klein::compare_image_files((dir / "b-6.png").string(), (dir / "one.png").string());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(std::isinf(a->psnr)) << a->psnr;
  r = klein::testing::run_cli("generate" + common + " --seeds 4,4 -o " + (dir / "c.png").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("given twice"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// The C session example (compiled as C): a base model, guidance 4, two seeds from one encode;
// the images equal the C++ API's generate per seed, and decode before denoise is refused.
TEST(Session, CExampleMatchesGenerate) {
  const fs::path dir = klein::testing::make_temp_dir("session_c");
  const std::string cmd = std::string("'") + KLEIN_C_SESSION_EXAMPLE_PATH + "' '" + tiny_base() + "' '" +
                          (dir / "fox").string() + "' 4 21 22 >'" + (dir / "log").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << cmd;
  auto model = klein::Model::open(tiny_base());
  ASSERT_TRUE(model.ok());
  for (uint64_t seed : {21u, 22u}) {
    klein::GenerateRequest g;
    g.prompt = "a red fox in the snow";
    g.width = g.height = 32;
    g.steps = 2;
    g.seed = seed;
    g.guidance_scale = 4;
    auto want = (*model)->generate(g);
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(klein::save_png((dir / "want.png").string(), want->image).ok());
    auto a = klein::compare_image_files((dir / ("fox-" + std::to_string(seed) + ".png")).string(),
                                   (dir / "want.png").string());
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_TRUE(std::isinf(a->psnr)) << "seed " << seed;
  }
  fs::remove_all(dir);
}

// The memory plan counts guidance's second prediction: the negative embeddings (host and device)
// and the second velocity.
TEST(BaseModel, MemoryPlanCountsTheSecondPrediction) {
  const fs::path tiny = klein::testing::tiny_model_dir();
  auto tj = klein::read_json_file(tiny / "text_encoder" / "config.json");
  auto dj = klein::read_json_file(tiny / "transformer" / "config.json");
  auto vj = klein::read_json_file(tiny / "vae" / "config.json");
  ASSERT_TRUE(tj.ok() && dj.ok() && vj.ok());
  auto te = klein::Qwen3Config::from_json(*tj, "te");
  auto dit = klein::Flux2Config::from_json(*dj, "dit");
  auto vae = klein::Flux2VaeConfig::from_json(*vj, "vae");
  ASSERT_TRUE(te.ok() && dit.ok() && vae.ok());
  klein::api::RequestShape r;
  r.width = 256;
  r.height = 128;
  const auto plain = klein::api::estimate_needs({}, *te, *dit, *vae, r);
  r.cfg = true;
  const auto cfg = klein::api::estimate_needs({}, *te, *dit, *vae, r);
  const uint64_t N = (256 / 16) * (128 / 16);
  EXPECT_EQ(cfg.dit_activations - plain.dit_activations,
            2 * 512 * static_cast<uint64_t>(dit->joint_attention_dim) * 4 + N * dit->in_channels * 4);
  EXPECT_EQ(cfg.te_activations, plain.te_activations);
}

// Given embeddings (Model::encode_prompt's) instead of the text: under guidance the negative
// prompt is then encoded by set_prompt_embeddings; the image is encode_prompt's.
TEST(Session, GivenEmbeddingsUnderGuidance) {
  auto model = klein::Model::open(tiny_base());
  ASSERT_TRUE(model.ok());
  klein::SessionOptions o;
  o.negative_prompt = "dark";
  auto a = klein::Session::create(**model, o);
  auto b = klein::Session::create(**model, o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->encode_prompt("a green tree").ok());
  auto pe = (*model)->encode_prompt("a green tree");
  ASSERT_TRUE(pe.ok());
  ASSERT_TRUE((*b)->set_prompt_embeddings(*pe).ok());
  klein::DenoiseParams p;
  p.width = 48;
  p.height = 32;
  p.steps = 2;
  p.seed = 8;
  ASSERT_TRUE((*a)->denoise(p).ok());
  ASSERT_TRUE((*b)->denoise(p).ok());
  auto za = (*a)->latents();
  auto zb = (*b)->latents();
  ASSERT_TRUE(za.ok() && zb.ok());
  EXPECT_EQ(za->data, zb->data);
  // Another negative prompt changes the picture (the negative embeddings are used).
  auto c = klein::Session::create(**model);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->set_prompt_embeddings(*pe).ok());
  ASSERT_TRUE((*c)->denoise(p).ok());
  auto zc = (*c)->latents();
  ASSERT_TRUE(zc.ok());
  EXPECT_NE(zc->data, za->data);
}
