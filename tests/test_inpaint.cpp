// Inpainting and image-to-image against diffusers' Flux2KleinInpaintPipeline (fp32,
// tests/data/ref_inpaint from scripts/reference/dump_inpaint_reference.py on the tiny models),
// the pieces of the algorithm (strength, mask, scale_noise, blend) on their own, and bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "api/memory_needs.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "klein/klein_c.h"
#include "dit_testing.h"
#include "pipeline/inpaint.h"
#include "pipeline/scheduler.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::max_rel_err;
using klein::testing::must_read_f32;
using klein::testing::u8_agreement;

// A named namespace: in a unity batch, other test files' anonymous helpers (cases(), ref_dir(), ...)
// share the compiler run.
namespace inpaint_test {

using klein::Code;

fs::path ref_dir() { return klein::testing::data_dir() / "ref_inpaint"; }

struct InpaintCase {
  std::string name, prompt, model_dir, mask_kind;
  int width = 0, height = 0, steps = 0, steps_run = 0;
  uint64_t seed = 0;
  double strength = 0, guidance = 0;
  bool cfg = false;
  std::vector<std::string> refs;
};
void PrintTo(const InpaintCase& c, std::ostream* os) { *os << c.name; }

std::vector<InpaintCase> cases() {
  std::vector<InpaintCase> r;
  auto j = klein::read_json_file(ref_dir() / "manifest.json");
  if (!j.ok()) return r;
  for (const auto& c : (*j)["cases"]) {
    InpaintCase b;
    b.name = c["name"];
    b.prompt = c["prompt"];
    b.model_dir = c["model_dir"];
    b.mask_kind = c["mask_kind"];
    b.width = c["width"];
    b.height = c["height"];
    b.steps = c["num_inference_steps"];
    b.steps_run = c["steps_run"];
    b.seed = c["seed"];
    b.strength = c["strength"];
    b.guidance = c["guidance_scale"];
    b.cfg = c["cfg"];
    b.refs = c["refs"].get<std::vector<std::string>>();
    r.push_back(std::move(b));
  }
  return r;
}

class InpaintRef : public ::testing::TestWithParam<InpaintCase> {};

// The seeded noise, the source latents, the start, the mask's token weights, every step's
// velocity and blended latents, the decoder input and the pictures equal diffusers' at the
// tolerances of the other reference tests. An all-white mask case is run with NO mask (klein's
// image-to-image), which must be the same computation.
TEST_P(InpaintRef, MatchesDiffusersInpaintPipeline) {
  const InpaintCase& c = GetParam();
  const fs::path ref = ref_dir() / c.name;
  const fs::path dump = klein::testing::make_temp_dir("inpaint_ref");
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.precision = klein::Precision::kFp32;
  auto model = klein::Model::open((klein::testing::data_dir() / fs::path(c.model_dir).filename()).string(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  klein::GenerateRequest g;
  g.prompt = c.prompt;
  g.guidance_scale = c.guidance;
  g.steps = c.steps;
  g.seed = c.seed;
  g.init_image.path = (ref / "source.png").string();
  if (c.mask_kind != "white") g.init_image.mask_path = (ref / "mask.png").string();
  g.init_image.strength = c.strength;
  for (const auto& f : c.refs) g.reference_images.push_back((ref / f).string());
  g.dump = {dump.string(), "noise,image_latents,init_latents,mask,velocity_step,latents_step,latents_final,image"};
  std::vector<std::string> logs;
  klein::Callbacks cb;
  int denoise_total = 0;
  cb.progress = [&](const std::string& phase, int, int total) {
    if (phase == "denoise") denoise_total = total;
  };
  auto r = (*model)->generate(g, cb);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->width, c.width);
  EXPECT_EQ(r->height, c.height);
  EXPECT_EQ(denoise_total, c.steps_run) << "the strength cuts the schedule as get_timesteps";

  EXPECT_EQ(must_read_f32(dump / "noise.npy"), must_read_f32(ref / "noise.npy"));
  EXPECT_EQ(must_read_f32(dump / "mask.npy"), must_read_f32(ref / "mask.npy"));
  for (const char* n : {"image_latents.npy", "init_latents.npy"})
    EXPECT_LE(max_rel_err(must_read_f32(dump / n), must_read_f32(ref / n)), 1e-5) << n;
  for (int k = 1; k <= c.steps_run; ++k) {
    for (const char* what : {"velocity_step", "latents_step"}) {
      const std::string n = what + std::to_string(k) + ".npy";
      EXPECT_LE(max_rel_err(must_read_f32(dump / n), must_read_f32(ref / n)), 1e-4) << n;
    }
  }
  EXPECT_FALSE(fs::exists(dump / ("latents_step" + std::to_string(c.steps_run + 1) + ".npy")));
  EXPECT_LE(max_rel_err(must_read_f32(dump / "latents_final.npy"), must_read_f32(ref / "latents_final.npy")), 1e-4);
  EXPECT_LE(max_rel_err(must_read_f32(dump / "image.npy"), must_read_f32(ref / "image.npy")), 1e-4) << "float image";
  auto u8 = klein::read_npy(ref / "image_u8.npy");
  ASSERT_TRUE(u8.ok());
  const auto [equal, maxd] = u8_agreement(u8->bytes, r->image.rgb);
  EXPECT_GE(equal, 0.999);
  EXPECT_LE(maxd, 1);
  fs::remove_all(dump);
}

INSTANTIATE_TEST_SUITE_P(Tiny, InpaintRef, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Inpaint, FixturesCoverTheCases) {
  int cfg = 0, base_plain = 0, refs = 0, white = 0, grey = 0, full = 0, partial = 0;
  for (const auto& c : cases()) {
    cfg += c.cfg;
    base_plain += !c.cfg && c.model_dir.find("base") != std::string::npos;
    refs += !c.refs.empty();
    white += c.mask_kind == "white";
    grey += c.mask_kind != "white";
    full += c.strength == 1.0;
    partial += c.steps_run < c.steps;
  }
  EXPECT_GE(cfg, 1);
  EXPECT_GE(base_plain, 1) << "guidance 1 on a base model";
  EXPECT_GE(refs, 1);
  EXPECT_GE(white, 1) << "image-to-image";
  EXPECT_GE(grey, 3);
  EXPECT_GE(full, 1);
  EXPECT_GE(partial, 3);
}

// get_timesteps' t_start = int(max(N - min(N * strength, N), 0)) in double (values from Python).
TEST(Inpaint, StrengthCutsTheScheduleAsGetTimesteps) {
  struct {
    int n;
    double s;
    int start;
  } const want[] = {{4, 0.6, 1}, {5, 0.3, 3}, {3, 1.0, 0}, {4, 0.8, 0}, {50, 0.8, 10},
                    {10, 0.7, 3}, {28, 0.3, 19}, {4, 0.05, 3}, {50, 0.02, 49}};
  for (const auto& w : want) EXPECT_EQ(klein::strength_start_step(w.n, w.s), w.start) << w.n << " " << w.s;
  klein::Schedule full;
  full.timesteps = {1000, 750, 500, 250};
  full.sigmas = {1.0f, 0.75f, 0.5f, 0.25f, 0.0f};
  const auto cut = klein::cut_schedule(full, 1);
  EXPECT_EQ(cut.timesteps, (std::vector<float>{750, 500, 250}));
  EXPECT_EQ(cut.sigmas, (std::vector<float>{0.75f, 0.5f, 0.25f, 0.0f}));
}

// The mask: grey >= 128 repaints (binarised at 0.5 after /255), the weight of a token is the mean
// of the 2x2 pixels at its patch's centre, and Pillow's luma weights colours.
TEST(Inpaint, MaskIsBinarisedAndSampledAtPatchCentres) {
  klein::Image m;
  m.width = 32;
  m.height = 16;
  m.rgb.assign(32 * 16 * 3, 0);
  auto set = [&](int x, int y, uint8_t v) {
    for (int c = 0; c < 3; ++c) m.rgb[(y * 32 + x) * 3 + c] = v;
  };
  // Token 0: one of its four centre pixels at 128 (repaint), one at 127 (keep): weight 1/4.
  set(7, 7, 128);
  set(8, 7, 127);
  // Token 1: all four centre pixels white, the rest of the patch black: weight 1.
  for (int y : {7, 8})
    for (int x : {23, 24}) set(x, y, 255);
  const auto w = klein::preprocess_mask(m, 32, 16);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0], 0.25f);
  EXPECT_EQ(w[1], 1.0f);
  EXPECT_EQ(klein::pillow_luma(255, 0, 0), 76);  // Pillow: Image.new("RGB", (1, 1), "red").convert("L")
  EXPECT_EQ(klein::pillow_luma(0, 255, 0), 150);
  EXPECT_EQ(klein::pillow_luma(0, 0, 255), 29);
  EXPECT_EQ(klein::pillow_luma(200, 200, 200), 200);
}

TEST(Inpaint, ScaleNoiseAndBlendRoundAsTorch) {
  const float x[2] = {0.3f, -1.7f}, noise[2] = {1.1f, 0.2f};
  float out[2];
  klein::scale_noise(out, x, noise, 2, 0.6f);
  for (int i = 0; i < 2; ++i) {
    const volatile float a = 0.6f * noise[i];
    const volatile float k = 1.0f - 0.6f;
    const volatile float b = k * x[i];
    EXPECT_EQ(out[i], a + b);
  }
  // Weight 1 keeps the denoised latents, 0 takes the re-noised source, 1/2 mixes.
  float lat[6] = {1, 2, 3, 4, 5, 6};
  const float src[6] = {-1, -2, -3, -4, -5, -6}, mask[3] = {1.0f, 0.0f, 0.5f};
  klein::inpaint_blend(lat, src, mask, 3, 2);
  EXPECT_EQ(std::vector<float>(lat, lat + 6), (std::vector<float>{1, 2, -3, -4, 0, 0}));
}

TEST(Inpaint, MemoryPlanCountsTheInpaintingLatents) {
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
  const uint64_t N = (256 / 16) * (128 / 16);
  r.ref_tokens = static_cast<int64_t>(N);  // the source as the first reference
  const auto edit = klein::api::estimate_needs({}, *te, *dit, *vae, r);
  r.inpaint = true;
  const auto inp = klein::api::estimate_needs({}, *te, *dit, *vae, r);
  EXPECT_EQ(inp.dit_activations - edit.dit_activations, 3 * N * dit->in_channels * 4 + N * 4);
}

// Writes a small picture of `w` x `h` (grey `v`) as PNG.
fs::path write_png(const fs::path& dir, const std::string& name, int w, int h, uint8_t v) {
  klein::Image img;
  img.width = w;
  img.height = h;
  img.rgb.assign(static_cast<size_t>(w) * h * 3, v);
  const fs::path p = dir / name;
  EXPECT_TRUE(klein::save_png(p.string(), img).ok());
  return p;
}

TEST(Inpaint, BadInputsAreOneClearLine) {
  const fs::path dir = klein::testing::make_temp_dir("inpaint_bad");
  const fs::path src = write_png(dir, "src.png", 64, 48, 100);
  const fs::path mask = write_png(dir, "mask.png", 20, 30, 255);  // another size: resized, fine
  const fs::path junk = dir / "junk.png";
  std::ofstream(junk) << "not an image";
  auto model = klein::Model::open(klein::testing::tiny());
  ASSERT_TRUE(model.ok());
  klein::GenerateRequest g;
  g.prompt = "a";
  g.steps = 2;
  g.init_image.path = src.string();
  g.init_image.mask_path = mask.string();
  for (double s : {0.0, -0.0, 1.5, std::nan("")}) {
    g.init_image.strength = s;
    auto r = (*model)->generate(g);
    ASSERT_FALSE(r.ok()) << s;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("strength"), std::string::npos) << r.status().to_string();
  }
  g.init_image.strength = 0.5;
  g.init_image.mask_path = junk.string();
  auto r = (*model)->generate(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("junk.png"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  g.init_image.mask_path = (dir / "missing.png").string();
  r = (*model)->generate(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing.png"), std::string::npos) << r.status().to_string();
  g.init_image.mask_path = mask.string();
  g.init_image.path = (dir / "tiny.png").string();
  write_png(dir, "tiny.png", 12, 40, 0);
  r = (*model)->generate(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("too small"), std::string::npos) << r.status().to_string();
  // A mask of another size is resized to the image's, as diffusers does; the size asked for is
  // not used (a note says so).
  g.init_image.path = src.string();
  g.width = 128;
  std::string notes;
  klein::Callbacks cb;
  cb.log = [&](const std::string& s) { notes += s + "\n"; };
  r = (*model)->generate(g, cb);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->width, 64);
  EXPECT_EQ(r->height, 48);
  EXPECT_NE(notes.find("source image's size 64x48"), std::string::npos) << notes;
  fs::remove_all(dir);
}

TEST(Inpaint, SessionPhasesAndBatches) {
  const fs::path dir = klein::testing::make_temp_dir("inpaint_session");
  const fs::path ref = ref_dir() / "inp_s06";
  auto model = klein::Model::open(klein::testing::tiny());
  ASSERT_TRUE(model.ok());
  klein::GenerateRequest g;
  g.prompt = "a";
  g.steps = 3;
  g.init_image.path = (ref / "source.png").string();
  g.init_image.mask_path = (ref / "mask.png").string();
  g.init_image.strength = 0.7;
  auto batch = (*model)->generate_batch(g, {4, 9});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  g.seed = 9;
  auto one = (*model)->generate(g);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*batch)[1].image.rgb, one->image.rgb) << "a batch gives the images of separate runs";
  EXPECT_NE((*batch)[0].image.rgb, one->image.rgb);
  bool has_strength = false;
  for (const auto& [k, v] : one->metadata) has_strength |= k == "strength" && v == "0.7";
  EXPECT_TRUE(has_strength);

  auto s = klein::Session::create(**model);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->encode_prompt("a").ok());
  klein::InitImage in;
  in.path = g.init_image.path;
  in.mask_path = g.init_image.mask_path;
  in.strength = 0.7;
  ASSERT_TRUE((*s)->set_init_image(in).ok());
  EXPECT_EQ((*s)->set_init_image(in).code(), Code::kInvalidArgument) << "once per session";
  klein::DenoiseParams p;
  p.steps = 3;
  p.seed = 9;
  ASSERT_TRUE((*s)->denoise(p).ok());
  auto img = (*s)->decode();
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->rgb, one->image.rgb) << "the Session phases give generate's image";
  auto late = (*s)->set_init_image(in);
  EXPECT_EQ(late.code(), Code::kInvalidArgument);
  EXPECT_NE(late.message().find("before the first denoise"), std::string::npos) << late.to_string();
  fs::remove_all(dir);
}

// Base models: an inpainting request's default guidance is the inpainting pipeline's 8.0.
TEST(Inpaint, BaseModelDefaultGuidanceIsEight) {
  auto model = klein::Model::open((klein::testing::data_dir() / "tiny_base").string());
  ASSERT_TRUE(model.ok());
  auto s = klein::Session::create(**model);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->guidance_scale(), 4.0f);
  klein::InitImage in;
  in.path = (ref_dir() / "inp_s06" / "source.png").string();
  ASSERT_TRUE((*s)->set_init_image(in).ok());
  EXPECT_EQ((*s)->guidance_scale(), 8.0f);
  klein::SessionOptions o;
  o.guidance_scale = 3.0;
  auto s3 = klein::Session::create(**model, o);
  ASSERT_TRUE(s3.ok());
  ASSERT_TRUE((*s3)->set_init_image(in).ok());
  EXPECT_EQ((*s3)->guidance_scale(), 3.0f) << "a scale asked for stays";
}

TEST(Inpaint, CliImageMaskStrength) {
  const fs::path dir = klein::testing::make_temp_dir("inpaint_cli");
  const fs::path ref = ref_dir() / "inp_s06";
  const std::string src = " --image " + (ref / "source.png").string();
  auto r = klein::testing::run_cli("generate -q -p a --steps 2" + src + " --mask " + (ref / "mask.png").string() +
                                   " --strength 0.5 -o " + (dir / "a.png").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "a.png"));
  r = klein::testing::run_cli("generate -q -p a --steps 2" + src + " --strength 1.5 -o " + (dir / "b.png").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--strength"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "b.png"));
  r = klein::testing::run_cli("generate -q -p a --mask " + (ref / "mask.png").string() + " -o " +
                              (dir / "c.png").string());
  EXPECT_NE(r.exit_code, 0) << "--mask needs --image";
  EXPECT_NE(r.err.find("--image"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// The C API: klein_generate_params' init_image / mask_image / strength and
// klein_session_set_init_image give the C++ API's image; a mask without a source is refused.
TEST(Inpaint, CApiMatchesCpp) {
  const fs::path ref = ref_dir() / "inp_s06";
  const std::string src = (ref / "source.png").string(), mask = (ref / "mask.png").string();
  auto model = klein::Model::open(klein::testing::tiny());
  ASSERT_TRUE(model.ok());
  klein::GenerateRequest g;
  g.prompt = "a";
  g.steps = 2;
  g.seed = 5;
  g.init_image.path = src;
  g.init_image.mask_path = mask;
  g.init_image.strength = 0.9;
  auto want = (*model)->generate(g);
  ASSERT_TRUE(want.ok()) << want.status().to_string();

  klein_error err;
  klein_model* cm = nullptr;
  ASSERT_EQ(klein_model_open(klein::testing::tiny().c_str(), nullptr, &cm, &err), KLEIN_OK) << err.message;
  klein_generate_params gp = klein_generate_default_params();
  EXPECT_EQ(gp.strength, -1);
  gp.prompt = "a";
  gp.steps = 2;
  gp.seed = 5;
  gp.mask_image = mask.c_str();
  klein_image* img = nullptr;
  EXPECT_EQ(klein_model_generate(cm, &gp, &img, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("init_image"), std::string::npos) << err.message;
  gp.init_image = src.c_str();
  gp.strength = 0.9;
  ASSERT_EQ(klein_model_generate(cm, &gp, &img, &err), KLEIN_OK) << err.message;
  ASSERT_EQ(img->width, want->width);
  EXPECT_TRUE(std::equal(want->image.rgb.begin(), want->image.rgb.end(), img->rgb));
  klein_image_free(img);

  klein_session* cs = nullptr;
  ASSERT_EQ(klein_session_create(cm, nullptr, &cs, &err), KLEIN_OK) << err.message;
  ASSERT_EQ(klein_session_encode_prompt(cs, "a", &err), KLEIN_OK) << err.message;
  EXPECT_EQ(klein_session_set_init_image(cs, nullptr, nullptr, -1, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_EQ(klein_session_set_init_image(cs, src.c_str(), mask.c_str(), 2.0, &err), KLEIN_INVALID_ARGUMENT);
  ASSERT_EQ(klein_session_set_init_image(cs, src.c_str(), mask.c_str(), 0.9, &err), KLEIN_OK) << err.message;
  klein_denoise_params dp = klein_denoise_default_params();
  dp.steps = 2;
  dp.seed = 5;
  ASSERT_EQ(klein_session_denoise(cs, &dp, &err), KLEIN_OK) << err.message;
  ASSERT_EQ(klein_session_decode(cs, &img, &err), KLEIN_OK) << err.message;
  EXPECT_TRUE(std::equal(want->image.rgb.begin(), want->image.rgb.end(), img->rgb));
  klein_image_free(img);
  klein_session_free(cs);
  klein_model_free(cm);
}

// ---- Schedule overrides: diffusers' sigmas= and a static shift (tests/data/ref_sigmas) ---------

// The schedule (sigmas) the scheduler made for each case, and the whole run's latents and image.
TEST(Schedule, CustomSigmasAndShiftMatchDiffusers) {
  const fs::path dir = klein::testing::data_dir() / "ref_sigmas";
  auto j = klein::read_json_file(dir / "manifest.json");
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  auto cfg = klein::FlowMatchConfig::from_file(klein::testing::tiny_model_dir() / "scheduler" / "scheduler_config.json");
  ASSERT_TRUE(cfg.ok());
  auto model = klein::Model::open(klein::testing::tiny(), [] {
    klein::LoadOptions lo;
    lo.threads = 2;
    lo.precision = klein::Precision::kFp32;
    return lo;
  }());
  ASSERT_TRUE(model.ok());
  int cases = 0;
  for (const auto& c : (*j)["cases"]) {
    ++cases;
    const std::string name = c["name"];
    const int w = c["width"], h = c["height"], steps = c["steps"];
    klein::GenerateRequest g;
    g.prompt = c["prompt"];
    g.width = w;
    g.height = h;
    g.seed = c["seed"];
    if (c["sigmas_arg"].is_array()) g.sigmas = c["sigmas_arg"].get<std::vector<double>>();
    else g.steps = steps;
    if (c["shift"].is_number()) g.shift = c["shift"];
    // The scheduler alone.
    klein::FlowMatchConfig sc = *cfg;
    if (g.shift > 0) {
      sc.use_dynamic_shifting = false;
      sc.shift = g.shift;
    }
    const int64_t seq = (w / 16) * (h / 16);
    auto sched = g.sigmas.empty() ? klein::make_klein_schedule(sc, steps, seq)
                                  : klein::flow_match_set_timesteps(sc, g.sigmas, klein::compute_empirical_mu(seq, steps));
    ASSERT_TRUE(sched.ok());
    std::vector<float> want;
    for (const auto& v : c["sigmas"]) want.push_back(static_cast<float>(v.get<double>()));
    EXPECT_EQ(sched->sigmas, want) << name;
    // The whole pipeline.
    const fs::path dump = klein::testing::make_temp_dir("sigmas_ref");
    g.dump = {dump.string(), "latents_step,image"};
    auto r = (*model)->generate(g);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().to_string();
    EXPECT_EQ(r->steps, steps);
    for (int k = 1; k <= steps; ++k) {
      const std::string n = "latents_step" + std::to_string(k) + ".npy";
      EXPECT_LE(max_rel_err(must_read_f32(dump / n), must_read_f32(dir / name / n)), 1e-4) << name << " " << n;
    }
    EXPECT_LE(max_rel_err(must_read_f32(dump / "image.npy"), must_read_f32(dir / name / "image.npy")), 1e-4) << name;
    auto u8 = klein::read_npy(dir / name / "image_u8.npy");
    ASSERT_TRUE(u8.ok());
    const auto [equal, maxd] = u8_agreement(u8->bytes, r->image.rgb);
    EXPECT_GE(equal, 0.999) << name;
    EXPECT_LE(maxd, 1) << name;
    fs::remove_all(dump);
  }
  EXPECT_EQ(cases, 3);
}

TEST(Schedule, BadOverridesAreClearErrors) {
  auto model = klein::Model::open(klein::testing::tiny());
  ASSERT_TRUE(model.ok());
  klein::GenerateRequest g;
  g.prompt = "a";
  g.width = g.height = 32;
  auto expect_bad = [&](const char* what) {
    auto r = (*model)->generate(g);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().to_string();
  };
  g.sigmas = {1.0, 1.5};
  expect_bad("sigmas[1]");
  g.sigmas = {1.0, std::nan("")};
  expect_bad("sigmas[1]");
  g.sigmas = {1.0, 0.5};
  g.steps = 3;
  expect_bad("steps 3 and 2 sigmas");
  g.sigmas.clear();
  g.steps = 0;
  g.shift = -1;
  expect_bad("shift");
  auto r = klein::testing::run_cli("generate -q -p a -W 32 -H 32 --sigmas 1,x -o /tmp/never.png");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--sigmas"), std::string::npos) << r.err;
}

}  // namespace inpaint_test
