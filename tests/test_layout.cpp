// The layout resolver (src/api/layout.*) end to end: every way of pointing klein at the tiny model
// — its diffusers folder, a BFL transformer file with or without ComfyUI's prefix beside the
// folder's other parts, DiT + VAE + text encoder as three files, a ComfyUI all-in-one checkpoint —
// gives the folder's image exactly. The single files are written by the independent writer
// (scripts/reference/make_single_files.py, checked against diffusers' converters), never by klein.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "api/layout.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "klein/klein_c.h"
#include "pipeline/tokenizer.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::run_cli;

namespace klein {
namespace {

fs::path single(const std::string& name) { return testing::data_dir() / "single_file" / name; }
fs::path tiny_dir() { return testing::tiny_model_dir(); }
std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

struct FileLayout {
  const char* name;
  std::string model;
  LoadOptions options;
};

LoadOptions files(const fs::path& dit, const fs::path& te, const fs::path& vae) {
  LoadOptions o;
  o.diffusion_model = dit.string();
  o.text_encoder = te.string();
  o.vae = vae.string();
  return o;
}

std::vector<FileLayout> single_file_layouts() {
  LoadOptions bfl, comfy;
  bfl.diffusion_model = single("tiny-flux2-bfl.safetensors").string();
  comfy.diffusion_model = single("tiny-flux2-bfl-comfy.safetensors").string();
  return {{"BflDitOverFolder", tiny_dir().string(), bfl},
          {"ComfyPrefixDitOverFolder", tiny_dir().string(), comfy},
          {"ThreeFiles", "",
           files(single("tiny-flux2-bfl.safetensors"), tiny_dir() / "text_encoder" / "model.safetensors",
                 single("tiny-flux2-vae-ldm.safetensors"))},
          {"AllInOne", single("tiny-flux2-all-in-one.safetensors").string(), {}}};
}

GenerateRequest request() {
  GenerateRequest r;
  r.prompt = "a red cube on a table";
  r.width = 64;
  r.height = 48;
  r.seed = 11;
  return r;
}

std::vector<std::pair<std::string, std::string>> without_model(std::vector<std::pair<std::string, std::string>> m) {
  std::erase_if(m, [](const auto& kv) { return kv.first == "model"; });
  return m;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// ---- resolution ------------------------------------------------------------------------------

TEST(Layout, ResolvesEachLayoutToItsParts) {
  auto folder = api::resolve_layout({tiny_dir().string()});
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  EXPECT_EQ(folder->kind, "diffusers folder");
  EXPECT_TRUE(folder->complete().ok());
  EXPECT_TRUE(folder->transformer.spec->from_folder);
  EXPECT_EQ(folder->tokenizer, tiny_dir() / "tokenizer");

  auto aio = api::resolve_layout({single("tiny-flux2-all-in-one.safetensors").string()});
  ASSERT_TRUE(aio.ok()) << aio.status().to_string();
  EXPECT_EQ(aio->kind, "all-in-one checkpoint");
  ASSERT_TRUE(aio->complete().ok()) << aio->complete().to_string();
  EXPECT_EQ(aio->transformer.spec->prefix, "model.diffusion_model.");
  EXPECT_EQ(aio->transformer.spec->scheme, NamingScheme::kBfl);
  EXPECT_EQ(aio->vae.spec->prefix, "vae.");
  EXPECT_EQ(aio->vae.spec->scheme, NamingScheme::kLdm);
  EXPECT_EQ(aio->text_encoder.spec->prefix, "text_encoders.qwen3_4b.transformer.");
  EXPECT_EQ(aio->text_encoder.spec->scheme, NamingScheme::kHfTransformers);
  // Nothing but the file: the tokenizer and the scheduler are the built-in ones, distilled assumed.
  EXPECT_TRUE(aio->tokenizer.empty());
  EXPECT_TRUE(aio->distilled);
  // The VAE's GroupNorm count is not in the weights: the config.json beside the file (the
  // writer's copy of the tiny VAE's) wins over the preset's 32; the others come from the shapes.
  EXPECT_EQ(aio->vae.spec->config["norm_num_groups"], 4);
  EXPECT_EQ(aio->vae.spec->config_where, single("config.json").string());
  EXPECT_NE(aio->transformer.spec->config_where.find("config from its tensor shapes"), std::string::npos);

  LoadOptions o;
  o.diffusion_model = single("tiny-flux2-bfl.safetensors").string();
  auto over = api::resolve_layout(api::layout_request(tiny_dir().string(), o));
  ASSERT_TRUE(over.ok()) << over.status().to_string();
  EXPECT_EQ(over->kind, "diffusers folder with parts replaced");
  EXPECT_FALSE(over->transformer.spec->from_folder);
  EXPECT_TRUE(over->vae.spec->from_folder);
}

TEST(Layout, MissingPartNamesItAndWhatWasGiven) {
  auto l = api::resolve_layout({single("tiny-flux2-bfl.safetensors").string()});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->kind, "single file");
  const Status st = l->complete();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "no text encoder: --model " + single("tiny-flux2-bfl.safetensors").string() +
                              " holds none; give it with --text-encoder FILE");
}

TEST(Layout, BuiltInSchedulerIsTheFoldersConfig) {
  auto l = api::resolve_layout({single("tiny-flux2-all-in-one.safetensors").string()});
  ASSERT_TRUE(l.ok());
  auto want = read_json_file(tiny_dir() / "scheduler" / "scheduler_config.json");
  ASSERT_TRUE(want.ok());
  want->erase("_diffusers_version");
  EXPECT_EQ(l->scheduler, *want);
}

TEST(Layout, BuiltInTokenizerIsTheFoldersTokenizer) {
  auto builtin = Tokenizer::builtin();
  ASSERT_TRUE(builtin.ok()) << builtin.status().to_string();
  auto folder = Tokenizer::load(tiny_dir() / "tokenizer");
  ASSERT_TRUE(folder.ok());
  for (const char* text : {"Hello world", "A cat holding a sign that says hello world", "żółw 🐢 <|im_start|>x"}) {
    const std::string t = Tokenizer::klein_template(text);
    EXPECT_EQ(builtin->encode(t), folder->encode(t)) << text;
  }
  EXPECT_EQ(builtin->pad_id(), 151643);
}

TEST(Layout, TokenizerBesideTheModelFileWins) {
  const fs::path dir = testing::make_temp_dir("layout_tok");
  fs::create_symlink(fs::absolute(single("tiny-flux2-all-in-one.safetensors")), dir / "aio.safetensors");
  fs::copy_file(single("config.json"), dir / "config.json");
  { std::ofstream(dir / "tokenizer.json") << "{\"model\": 1"; }  // read, so its error shows
  auto m = Model::open((dir / "aio.safetensors").string());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find((dir / "tokenizer.json").string()), std::string::npos) << m.status().to_string();
}

// ---- the same image from every layout ------------------------------------------------------------

class SameImage : public ::testing::TestWithParam<FileLayout> {};

TEST_P(SameImage, ApiGivesTheFoldersImageAndLatents) {
  auto ref = Model::open(tiny_dir().string());
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto m = Model::open(GetParam().model, GetParam().options);
  ASSERT_TRUE(m.ok()) << m.status().to_string();

  auto want = (*ref)->generate(request());
  auto got = (*m)->generate(request());
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->image.rgb, want->image.rgb);
  // The PNG is the same file but for the model's name in its metadata.
  auto png_want = encode_image(want->image, ImageFileFormat::kPng, without_model(want->metadata));
  auto png_got = encode_image(got->image, ImageFileFormat::kPng, without_model(got->metadata));
  ASSERT_TRUE(png_want.ok() && png_got.ok());
  EXPECT_EQ(*png_got, *png_want);

  auto e_want = (*ref)->encode_prompt(request().prompt);
  auto e_got = (*m)->encode_prompt(request().prompt);
  ASSERT_TRUE(e_want.ok() && e_got.ok());
  EXPECT_LE(rel_l2(e_want->data, e_got->data), 1e-6);
  DenoiseParams p;
  p.width = 64;
  p.height = 48;
  p.seed = 11;
  auto z_want = (*ref)->denoise(*e_want, {}, p);
  auto z_got = (*m)->denoise(*e_got, {}, p);
  ASSERT_TRUE(z_want.ok() && z_got.ok());
  ASSERT_EQ(z_got->shape, z_want->shape);
  EXPECT_LE(rel_l2(z_want->data, z_got->data), 1e-6);
}

TEST_P(SameImage, CliGivesTheFoldersImage) {
  const fs::path dir = testing::make_temp_dir("layout_cli");
  const std::string common = " -q -W 64 -H 48 --seed 11 --prompt 'a red cube on a table' --threads 2";
  auto r = run_cli("generate --model " + q(tiny_dir()) + common + " -o " + q(dir / "want.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const FileLayout& l = GetParam();
  std::string args;
  if (!l.model.empty()) args += " --model " + q(l.model);
  if (!l.options.diffusion_model.empty()) args += " --diffusion-model " + q(l.options.diffusion_model);
  if (!l.options.text_encoder.empty()) args += " --text-encoder " + q(l.options.text_encoder);
  if (!l.options.vae.empty()) args += " --vae " + q(l.options.vae);
  r = run_cli("generate" + args + common + " -o " + q(dir / "got.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = slurp(dir / "want.png"), got = slurp(dir / "got.png");
  if (l.model == tiny_dir().string()) {
    EXPECT_EQ(got, want);  // the same model name too: the same file
  } else {
    auto a = decode_image(want), b = decode_image(got);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(b->rgb, a->rgb);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, SameImage, ::testing::ValuesIn(single_file_layouts()),
                         [](const auto& info) { return std::string(info.param.name); });

// encode and decode take the same model options as generate.
TEST(Layout, EncodeAndDecodeReadTheAllInOneFile) {
  const fs::path dir = testing::make_temp_dir("layout_encdec");
  const std::string aio = " --model " + q(single("tiny-flux2-all-in-one.safetensors"));
  const std::string folder = " --model " + q(tiny_dir());
  for (const auto& [name, model] : {std::pair{"want", folder}, std::pair{"got", aio}}) {
    auto r = run_cli("encode -q --threads 2 --prompt 'a red cube' --max-length 32" + model + " -o " +
                     q(dir / (std::string(name) + ".npy")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  auto a = read_npy(dir / "want.npy"), b = read_npy(dir / "got.npy");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->shape, b->shape);
  EXPECT_EQ(a->to_f32(), b->to_f32());

  std::vector<float> z(128 * 3 * 4);
  for (size_t i = 0; i < z.size(); ++i) z[i] = std::sin(0.37f * static_cast<float>(i));
  ASSERT_TRUE(save_npy((dir / "z.npy").string(), {1, 128, 3, 4}, z).ok());
  for (const auto& [name, model] : {std::pair{"want", folder}, std::pair{"got", aio}}) {
    auto r = run_cli("decode -q --threads 2 --latents " + q(dir / "z.npy") + model + " -o " +
                     q(dir / (std::string(name) + ".png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(slurp(dir / "got.png"), slurp(dir / "want.png"));
}

// quantize takes the same model options: the single files are written out under diffusers names
// and quantized as the folder is, so both outputs give one image.
TEST(Layout, QuantizeFromSingleFilesGivesTheFoldersQuantizedModel) {
  const fs::path dir = testing::make_temp_dir("layout_quant");
  auto r = run_cli("quantize -q --type q8 --model " + q(tiny_dir()) + " -o " + q(dir / "folder-q8"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("quantize -q --type q8 --diffusion-model " + q(single("tiny-flux2-bfl.safetensors")) +
              " --text-encoder " + q(tiny_dir() / "text_encoder" / "model.safetensors") + " --vae " +
              q(single("tiny-flux2-vae-ldm.safetensors")) + " -o " + q(dir / "files-q8"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Nothing staged is left beside the output.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"files-q8", "folder-q8"}));
  auto a = Model::open((dir / "folder-q8").string());
  auto b = Model::open((dir / "files-q8").string());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto want = (*a)->generate(request());
  auto got = (*b)->generate(request());
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->image.rgb, want->image.rgb);
  auto info = (*b)->info();
  ASSERT_TRUE(info.ok());
  bool q8 = false;
  for (const auto& c : info->components)
    for (const auto& d : c.by_dtype) q8 = q8 || (c.name == "transformer" && d.dtype == "Q8_ROW");
  EXPECT_TRUE(q8);
}

TEST(Layout, CApiOpensThreeFilesWithoutAModelPath) {
  const std::string dit = single("tiny-flux2-bfl.safetensors").string();
  const std::string te = (tiny_dir() / "text_encoder" / "model.safetensors").string();
  const std::string vae = single("tiny-flux2-vae-ldm.safetensors").string();
  klein_load_params lp = klein_load_default_params();
  lp.diffusion_model = dit.c_str();
  lp.text_encoder = te.c_str();
  lp.vae = vae.c_str();
  klein_model* model = nullptr;
  klein_error err;
  ASSERT_EQ(klein_model_open(nullptr, &lp, &model, &err), KLEIN_OK) << err.message;
  klein_generate_params gp = klein_generate_default_params();
  gp.prompt = "a red cube on a table";
  gp.width = 64;
  gp.height = 48;
  gp.seed = 11;
  klein_image* img = nullptr;
  ASSERT_EQ(klein_model_generate(model, &gp, &img, &err), KLEIN_OK) << err.message;
  auto ref = Model::open(tiny_dir().string());
  ASSERT_TRUE(ref.ok());
  auto want = (*ref)->generate(request());
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(img->width * img->height * 3, static_cast<int>(want->image.rgb.size()));
  EXPECT_TRUE(std::equal(want->image.rgb.begin(), want->image.rgb.end(), img->rgb));
  klein_image_free(img);
  klein_model_free(model);

  lp.variant = KLEIN_VARIANT_BASE;  // base models run (classifier-free guidance)
  ASSERT_EQ(klein_model_open(nullptr, &lp, &model, &err), KLEIN_OK) << err.message;
  klein_model_free(model);
  lp.variant = 7;
  EXPECT_EQ(klein_model_open(nullptr, &lp, &model, &err), KLEIN_INVALID_ARGUMENT);
}

// ---- variants -------------------------------------------------------------------------------------

TEST(Layout, BaseVariantRunsWithGuidance) {
  LoadOptions o;
  o.variant = Variant::kBase;
  auto m = Model::open(single("tiny-flux2-all-in-one.safetensors").string(), o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE((*m)->distilled());
  auto s = Session::create(**m);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE((*s)->guided());
  EXPECT_EQ((*s)->guidance_scale(), 4.0f);
  const fs::path out = testing::make_temp_dir("layout_base") / "x.png";
  auto r = run_cli("generate -q --variant base --steps 2 -W 32 -H 32 --model " +
                   q(single("tiny-flux2-all-in-one.safetensors")) + " --prompt a -o " + q(out));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out));
}

TEST(Layout, BaseInAFileNameIsNotedWhenRunAsDistilled) {
  const fs::path dir = testing::make_temp_dir("layout_basename");
  fs::create_symlink(fs::absolute(single("tiny-flux2-bfl.safetensors")), dir / "flux-2-klein-base-tiny.safetensors");
  const std::string files = " --diffusion-model " + q(dir / "flux-2-klein-base-tiny.safetensors") +
                            " --text-encoder " + q(tiny_dir() / "text_encoder" / "model.safetensors") + " --vae " +
                            q(single("tiny-flux2-vae-ldm.safetensors"));
  auto r = run_cli("info" + files);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("note: flux-2-klein-base-tiny.safetensors: the file name suggests a base (undistilled) model"),
            std::string::npos)
      << r.err;
  r = run_cli("info --variant distilled" + files);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("note:"), std::string::npos) << r.err;
}

// ---- klein info -------------------------------------------------------------------------------------

TEST(Layout, InfoReportsLayoutSchemeFamilyVariantAndFormats) {
  auto r = run_cli("info --model " + q(single("tiny-flux2-all-in-one.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"layout     all-in-one checkpoint", "variant    distilled (default for single files)",
                           "names      BFL; family FLUX.2-architecture", "names      LDM; family FLUX.2 VAE",
                           "names      transformers; family Qwen3", "built-in (Qwen3",
                           "the built-in FLUX.2 [klein] scheduler config", "BF16     116416 parameters"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;

  // A part missing: reported, and the exit code says the model cannot run.
  r = run_cli("info --model " + q(single("tiny-flux2-bfl-comfy.safetensors")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("layout     single file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("missing: no VAE: --model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("missing: no text encoder: --model"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace klein
