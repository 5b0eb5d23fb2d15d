// The public API: klein::Model (open once, many requests, phases), the no-exception boundary,
// and the C API with its example program.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>

#include "core/cpu_features.h"
#include "io/file_counter.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "klein/klein_c.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::Code;

namespace {

using klein::testing::tiny;
std::string ref_image() { return (klein::testing::data_dir() / "ref" / "edit1_auto" / "ref0.png").string(); }

std::unique_ptr<klein::Model> open_model(klein::MemoryPolicy memory) {
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.memory = memory;
  auto m = klein::Model::open(tiny(), lo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

klein::GenerateRequest small_request() {
  klein::GenerateRequest r;
  r.prompt = "a red fox";
  r.width = 32;
  r.height = 32;
  r.steps = 2;
  r.seed = 5;
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint32_t be32(const std::string& s, size_t o) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[o])) << 24) | (static_cast<uint8_t>(s[o + 1]) << 16) |
         (static_cast<uint8_t>(s[o + 2]) << 8) | static_cast<uint8_t>(s[o + 3]);
}

}  // namespace

TEST(Model, ResidentSecondRequestDoesNoFileIo) {
  const uint64_t before_open = klein::files_opened();
  auto m = open_model(klein::MemoryPolicy::kResident);
  ASSERT_TRUE(m);
  EXPECT_GT(klein::files_opened(), before_open);  // the counter sees the opens at all
  auto a = m->generate(small_request());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const uint64_t before = klein::files_opened();
  auto b = m->generate(small_request());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(klein::files_opened(), before) << "a resident model re-opened files";
  EXPECT_EQ(a->image.rgb, b->image.rgb);
  EXPECT_EQ(b->width, 32);
}

TEST(Model, LowMemoryEditingMapsTheVaeOnce) {
  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  auto req = small_request();
  req.reference_images = {ref_image()};
  const uint64_t vae0 = klein::files_opened("vae/diffusion_pytorch_model");
  const uint64_t dit0 = klein::files_opened("transformer/diffusion_pytorch_model");
  auto r = m->generate(req);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(klein::files_opened("vae/diffusion_pytorch_model") - vae0, 1u);
  EXPECT_EQ(klein::files_opened("transformer/diffusion_pytorch_model") - dit0, 1u);
  // Low memory: the next request maps again (nothing kept) ...
  ASSERT_TRUE(m->generate(req).ok());
  EXPECT_EQ(klein::files_opened("vae/diffusion_pytorch_model") - vae0, 2u);
}

TEST(Model, ResidentEditingOpensOnlyTheReferenceImage) {
  auto m = open_model(klein::MemoryPolicy::kResident);
  ASSERT_TRUE(m);
  auto req = small_request();
  req.reference_images = {ref_image()};
  ASSERT_TRUE(m->generate(req).ok());
  const uint64_t before = klein::files_opened();
  auto r = m->generate(req);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(klein::files_opened(), before);
}

TEST(Model, PhasesComposeToGenerate) {
  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  auto req = small_request();
  req.reference_images = {ref_image()};
  auto whole = m->generate(req);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();

  auto prompt = m->encode_prompt(req.prompt);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(prompt->shape, (std::vector<int64_t>{1, 512, 48}));
  EXPECT_EQ(prompt->ids.size(), 512u);
  auto refs = m->encode_references(req.reference_images);
  ASSERT_TRUE(refs.ok()) << refs.status().to_string();
  ASSERT_EQ(refs->latents.size(), 1u);
  EXPECT_EQ(refs->latents[0].shape.size(), 4u);
  klein::DenoiseParams p;
  p.width = req.width;
  p.height = req.height;
  p.steps = req.steps;
  p.seed = req.seed;
  std::vector<int> steps_seen;
  klein::Callbacks cb;
  cb.progress = [&](const std::string& phase, int done, int) {
    if (phase == "denoise") steps_seen.push_back(done);
  };
  auto z = m->denoise(*prompt, *refs, p, cb);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(z->shape, (std::vector<int64_t>{1, 128, 2, 2}));
  EXPECT_EQ(steps_seen, (std::vector<int>{0, 1, 2}));
  auto img = m->decode(*z);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  EXPECT_EQ(img->width, 32);
  EXPECT_EQ(img->rgb, whole->image.rgb);
}

TEST(Model, BadInputsAreStatusesNotCrashes) {
  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  klein::PromptEmbeddings bad;
  bad.shape = {1, 4, 48};
  bad.data.resize(5);
  auto z = m->denoise(bad, {}, {});
  EXPECT_EQ(z.status().code(), Code::kInvalidArgument);
  EXPECT_NE(z.status().message().find("prompt embeddings"), std::string::npos) << z.status().message();
  klein::Latents lat;
  lat.shape = {1, 64, 2, 2};
  lat.data.resize(256);
  EXPECT_EQ(m->decode(lat).status().code(), Code::kInvalidArgument);
  auto p = m->encode_prompt("x");
  ASSERT_TRUE(p.ok());
  klein::DenoiseParams dp;
  dp.width = dp.height = 32;
  dp.noise.shape = {1, 128, 4, 4};
  dp.noise.data.resize(128 * 16);
  auto wrong = m->denoise(*p, {}, dp);
  EXPECT_NE(wrong.status().message().find("[1, 128, 2, 2]"), std::string::npos) << wrong.status().message();

  klein::LoadOptions lo;
  lo.isa = "sse9";
  auto o = klein::Model::open(tiny(), lo);
  EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
  EXPECT_NE(o.status().message().find("sse9"), std::string::npos);
  EXPECT_EQ(klein::Model::open("/nonexistent/klein").status().code(), Code::kNotFound);
  // Thread counts outside 0..kMaxThreads are refused before any thread starts (each is an OS
  // thread); the same bound for quantize_model.
  for (int t : {-1, klein::kMaxThreads + 1, 1 << 30}) {
    klein::LoadOptions bad;
    bad.threads = t;
    auto b = klein::Model::open(tiny(), bad);
    EXPECT_EQ(b.status().code(), Code::kInvalidArgument) << t;
    EXPECT_NE(b.status().message().find("threads " + std::to_string(t)), std::string::npos) << b.status().message();
    klein::QuantizeOptions q;
    q.model = tiny();
    q.output = "/nonexistent/klein-out";
    q.threads = t;
    const klein::Status qs = klein::quantize_model(q);
    EXPECT_EQ(qs.code(), Code::kInvalidArgument) << t;
    EXPECT_NE(qs.message().find("threads " + std::to_string(t)), std::string::npos) << qs.message();
  }
}

TEST(Model, NoExceptionEscapes) {
  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  klein::Callbacks oom;
  oom.progress = [](const std::string&, int, int) { throw std::bad_alloc(); };
  auto r = m->generate(small_request(), oom);
  EXPECT_EQ(r.status().code(), Code::kOutOfMemory);
  EXPECT_EQ(r.status().message().rfind("out of memory", 0), 0u) << r.status().message();

  klein::Callbacks boom;
  boom.progress = [](const std::string&, int, int) { throw std::runtime_error("boom in a callback"); };
  auto e = m->encode_prompt("x", {}, boom);
  EXPECT_EQ(e.status().code(), Code::kInternal);
  EXPECT_NE(e.status().message().find("boom in a callback"), std::string::npos) << e.status().message();

  // The model stays usable after a failed request.
  EXPECT_TRUE(m->generate(small_request()).ok());
}

TEST(Model, CancelStopsTheRequest) {
  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  klein::Callbacks cb;
  cb.cancel = [] { return true; };
  EXPECT_EQ(m->generate(small_request(), cb).status().code(), Code::kCancelled);
}

TEST(Model, TokenizeAndInfo) {
  auto tok = klein::Model::open_tokenizer((klein::testing::tiny_model_dir() / "tokenizer").string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto t = (*tok)->tokenize("Hello world");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ids, (std::vector<int32_t>{9707, 1879}));
  EXPECT_TRUE(t->mask.empty());
  auto padded = (*tok)->tokenize("Hello world", true, 24);
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded->ids.size(), 24u);
  EXPECT_EQ(padded->mask.size(), 24u);
  EXPECT_EQ((*tok)->generate(small_request()).status().code(), Code::kInvalidArgument);

  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  auto info = m->info();
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->pipeline_class, "Flux2KleinPipeline");
  EXPECT_EQ(info->errors, 0);
  bool transformer = false;
  for (const auto& c : info->components)
    if (c.name == "transformer") {
      transformer = true;
      EXPECT_EQ(c.class_name, "Flux2Transformer2DModel");
      EXPECT_TRUE(c.has_weights);
      EXPECT_GT(c.parameters, 0);
      EXPECT_FALSE(c.by_dtype.empty());
    }
  EXPECT_TRUE(transformer);
  auto report = klein::cpu_info();
  ASSERT_TRUE(report.ok());
  EXPECT_NE(report->find("cpu"), std::string::npos);
  EXPECT_NE(report->find("linear BF16: "), std::string::npos) << *report;  // the chosen kernel per (op, format)
  auto scalar = klein::cpu_info("scalar");
  ASSERT_TRUE(scalar.ok());
  EXPECT_NE(scalar->find("linear BF16: scalar"), std::string::npos) << *scalar;
  EXPECT_EQ(klein::cpu_info("sse9").status().code(), Code::kInvalidArgument);
}

// Load options that mean nothing are refused by Model::open (and check_load_options) before
// anything is read, naming the field: a NaN budget used to turn the budget off (and was cast to
// an integer: undefined behaviour), a tile of 100 px was silently rounded to 96.
TEST(Model, LoadOptionsThatMeanNothingAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void(klein::LoadOptions&)> set;
    std::string named;
  };
  const Case bad[] = {
      {[&](auto& o) { o.max_memory_gib = nan; }, "max_memory_gib nan"},
      {[&](auto& o) { o.max_memory_gib = inf; }, "max_memory_gib inf"},
      {[&](auto& o) { o.max_memory_gib = -1; }, "max_memory_gib -1"},
      {[&](auto& o) { o.max_memory_gib = 1e300; }, "max_memory_gib 1e+300"},
      {[&](auto& o) { o.vae_tile_above_gib = nan; }, "vae_tile_above_gib nan"},
      {[&](auto& o) { o.vae_tile_above_gib = inf; }, "vae_tile_above_gib inf"},
      {[&](auto& o) { o.vae_tile = 100; }, "vae_tile 100: must be a multiple of 8"},
      {[&](auto& o) { o.vae_tile = 12; }, "vae_tile 12"},
  };
  for (const Case& c : bad) {
    klein::LoadOptions lo;
    c.set(lo);
    auto m = klein::Model::open(tiny(), lo);
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << c.named;
    EXPECT_TRUE(m.status().message().starts_with(c.named)) << m.status().message();
    EXPECT_EQ(klein::check_load_options(lo).message(), m.status().message());
  }
  // The C API goes through the same check.
  klein_load_params lp = klein_load_default_params();
  lp.max_memory_gib = nan;
  klein_model* model = nullptr;
  klein_error err;
  EXPECT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_TRUE(std::string(err.message).starts_with("max_memory_gib nan")) << err.message;
  EXPECT_EQ(model, nullptr);
  lp = klein_load_default_params();
  lp.vae_tile = 100;
  EXPECT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_TRUE(std::string(err.message).starts_with("vae_tile 100")) << err.message;
  // What the options document still opens.
  for (auto set : std::vector<std::function<void(klein::LoadOptions&)>>{
           [](auto& o) { o.vae_tile = 64; }, [](auto& o) { o.vae_tile = -1; }, [](auto& o) { o.max_memory_gib = 0; },
           [](auto& o) { o.max_memory_gib = klein::kMaxMemoryGib; }}) {
    klein::LoadOptions lo;
    set(lo);
    EXPECT_TRUE(klein::check_load_options(lo).ok()) << klein::check_load_options(lo).to_string();
  }
}

// An ISA ceiling this CPU lacks would run the best kernels below it without a word: refused,
// naming the ISA and what the CPU has, by Model::open and cpu_info alike; one it has still works.
TEST(Model, IsaTheCpuLacksIsRefused) {
  const klein::CpuFeatures& cpu = klein::CpuFeatures::host();
  for (klein::Isa has : cpu.isas()) {
    klein::LoadOptions lo;
    lo.isa = std::string(klein::isa_name(has));
    EXPECT_TRUE(klein::check_load_options(lo).ok()) << lo.isa;
    EXPECT_TRUE(klein::cpu_info(lo.isa).ok()) << lo.isa;
  }
  std::string missing;
  for (int i = 0; i < static_cast<int>(klein::Isa::kCount) && missing.empty(); ++i)
    if (!cpu.has(static_cast<klein::Isa>(i))) missing = std::string(klein::isa_name(static_cast<klein::Isa>(i)));
  if (missing.empty()) GTEST_SKIP() << "this CPU has every ISA klein knows";
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.isa = missing;
  auto m = klein::Model::open(tiny(), lo);
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  const std::string want = "isa \"" + missing + "\": this CPU does not have it (it has scalar";
  EXPECT_TRUE(m.status().message().starts_with(want)) << m.status().message();
  auto report = klein::cpu_info(missing);
  EXPECT_EQ(report.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(report.status().message().starts_with(want)) << report.status().message();
}

// Latents with an empty dimension are the caller's mistake: named as such, not as a VAE failure.
TEST(Model, DecodeOfEmptyLatentsNamesTheShape) {
  auto m = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(m);
  for (std::vector<int64_t> shape : {std::vector<int64_t>{1, 128, 0, 4}, std::vector<int64_t>{1, 128, 2, 0}}) {
    klein::Latents z;
    z.shape = shape;
    auto img = m->decode(z);
    EXPECT_EQ(img.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(img.status().message().starts_with("latents: shape [1, 128, " + std::to_string(shape[2]) + ", " +
                                                   std::to_string(shape[3]) + "]"))
        << img.status().message();
  }
}

// Model::inspect counts a component it cannot find as an error (`klein info` exits 1 on it),
// whether its folder is gone or model_index.json does not name it; a whole folder has none.
TEST(Model, InspectCountsMissingComponents) {
  auto whole = klein::Model::inspect(tiny());
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->errors, 0);
  auto dir = klein::testing::make_temp_dir("inspect_missing");
  fs::copy(tiny(), dir / "m", fs::copy_options::recursive);
  fs::remove_all(dir / "m" / "vae");
  auto no_folder = klein::Model::inspect((dir / "m").string());
  ASSERT_TRUE(no_folder.ok());
  EXPECT_EQ(no_folder->errors, 1);
  std::string index = slurp((dir / "m" / "model_index.json").string());
  const size_t at = index.find("\"vae\"");
  ASSERT_NE(at, std::string::npos);
  index.replace(at, 5, "\"unused_entry\"");  // the entry renamed: "vae" not named at all
  std::ofstream(dir / "m" / "model_index.json") << index;
  auto not_named = klein::Model::inspect((dir / "m").string());
  ASSERT_TRUE(not_named.ok());
  EXPECT_GE(not_named->errors, 1);
  bool vae_reported = false;
  for (const auto& c : not_named->components)
    if (c.name == "vae") vae_reported = c.error.find("no \"vae\" component") != std::string::npos;
  EXPECT_TRUE(vae_reported);
  fs::remove_all(dir);
}

TEST(CApi, OpenGenerateSave) {
  klein_error err;
  klein_model* model = nullptr;
  EXPECT_EQ(klein_model_open("/nonexistent/klein", nullptr, &model, &err), KLEIN_NOT_FOUND);
  EXPECT_EQ(err.code, KLEIN_NOT_FOUND);
  EXPECT_NE(std::string(err.message).find("/nonexistent/klein"), std::string::npos) << err.message;
  EXPECT_EQ(model, nullptr);
  EXPECT_EQ(klein_model_open(tiny().c_str(), nullptr, nullptr, nullptr), KLEIN_INVALID_ARGUMENT);  // no out

  klein_load_params lp = klein_load_default_params();
  lp.threads = 2;
  lp.memory = KLEIN_MEMORY_RESIDENT;
  ASSERT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_OK) << err.message;

  klein_generate_params gp = klein_generate_default_params();
  klein_image* image = nullptr;
  EXPECT_EQ(klein_model_generate(model, &gp, &image, &err), KLEIN_INVALID_ARGUMENT);  // no prompt
  EXPECT_NE(std::string(err.message).find("prompt"), std::string::npos);

  struct Seen {
    int progress = 0;
  } seen;
  gp.prompt = "a red fox";
  gp.width = 40;  // floored to 32 with a log line
  gp.height = 32;
  gp.steps = 1;
  gp.seed = 3;
  gp.user_data = &seen;
  gp.progress = [](const char*, int, int, void* ud) { ++static_cast<Seen*>(ud)->progress; };
  ASSERT_EQ(klein_model_generate(model, &gp, &image, &err), KLEIN_OK) << err.message;
  ASSERT_NE(image, nullptr);
  EXPECT_EQ(image->width, 32);
  EXPECT_EQ(image->height, 32);
  EXPECT_GT(seen.progress, 0);

  gp.cancel = [](void*) { return 1; };
  klein_image* none = nullptr;
  EXPECT_EQ(klein_model_generate(model, &gp, &none, &err), KLEIN_CANCELLED);
  EXPECT_EQ(none, nullptr);

  auto dir = klein::testing::make_temp_dir("capi");
  const std::string out = (dir / "c.png").string();
  ASSERT_EQ(klein_image_save_png(image, out.c_str(), &err), KLEIN_OK) << err.message;
  EXPECT_EQ(slurp(out).substr(1, 3), "PNG");
  klein_image_free(image);
  klein_model_free(model);
  klein_image_free(nullptr);
  klein_model_free(nullptr);
  EXPECT_STREQ(klein_version(), klein::version());
  fs::remove_all(dir);
}

// prompt_embeds_npy stands in for the text encoder: embeddings of the same prompt give the same
// image byte for byte; prompt and embeddings together, or a missing file, are refused.
TEST(CApi, PromptEmbeddingsReplaceThePrompt) {
  auto dir = klein::testing::make_temp_dir("capi_embeds");
  auto cpp = open_model(klein::MemoryPolicy::kLow);
  ASSERT_TRUE(cpp);
  auto pe = cpp->encode_prompt("a red fox");
  ASSERT_TRUE(pe.ok()) << pe.status().to_string();
  const std::string npy = (dir / "fox.npy").string();
  ASSERT_TRUE(klein::write_npy(npy, klein::DType::kF32, pe->shape, pe->data.data()).ok());

  klein_error err;
  klein_model* model = nullptr;
  klein_load_params lp = klein_load_default_params();
  lp.threads = 2;
  ASSERT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_OK) << err.message;
  klein_generate_params gp = klein_generate_default_params();
  gp.width = gp.height = 32;
  gp.steps = 2;
  gp.seed = 5;
  gp.prompt = "a red fox";
  klein_image* from_prompt = nullptr;
  ASSERT_EQ(klein_model_generate(model, &gp, &from_prompt, &err), KLEIN_OK) << err.message;
  gp.prompt_embeds_npy = npy.c_str();
  klein_image* none = nullptr;
  EXPECT_EQ(klein_model_generate(model, &gp, &none, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("exclude"), std::string::npos) << err.message;
  gp.prompt = nullptr;
  klein_image* from_embeds = nullptr;
  ASSERT_EQ(klein_model_generate(model, &gp, &from_embeds, &err), KLEIN_OK) << err.message;
  ASSERT_EQ(from_embeds->width, from_prompt->width);
  ASSERT_EQ(from_embeds->height, from_prompt->height);
  EXPECT_EQ(std::memcmp(from_embeds->rgb, from_prompt->rgb, size_t{32} * 32 * 3), 0);
  const std::string missing = (dir / "missing.npy").string();
  gp.prompt_embeds_npy = missing.c_str();
  EXPECT_EQ(klein_model_generate(model, &gp, &none, &err), KLEIN_NOT_FOUND);
  EXPECT_NE(std::string(err.message).find("missing.npy"), std::string::npos) << err.message;
  EXPECT_EQ(none, nullptr);
  klein_image_free(from_prompt);
  klein_image_free(from_embeds);
  klein_model_free(model);
  fs::remove_all(dir);
}

// The example C program (compiled as C by CMake) end to end on the tiny model.
TEST(CApi, ExampleProgramWritesA64x64Png) {
  auto dir = klein::testing::make_temp_dir("cexample");
  const fs::path out = dir / "fox.png";
  const std::string cmd = std::string("'") + KLEIN_C_EXAMPLE_PATH + "' '" + tiny() + "' '" + out.string() + "' 11 >'" +
                          (dir / "log").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << slurp(dir / "log");
  const std::string png = slurp(out);
  ASSERT_GT(png.size(), 24u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_EQ(be32(png, 16), 64u);
  EXPECT_EQ(be32(png, 20), 64u);
  EXPECT_NE(slurp(dir / "log").find("denoise"), std::string::npos);
  fs::remove_all(dir);
}

// klein_model_estimate_memory: the C side of Model::estimate_memory, with the same figures.
TEST(CApi, EstimateMemory) {
  klein_error err;
  klein_model* model = nullptr;
  ASSERT_EQ(klein_model_open(tiny().c_str(), nullptr, &model, &err), KLEIN_OK) << err.message;
  klein_memory_estimate e;
  const int refs[] = {512, 256, 64, 64};
  ASSERT_EQ(klein_model_estimate_memory(model, 0, 0, refs, 2, -1, &e, &err), KLEIN_OK) << err.message;
  EXPECT_EQ(e.width, 512);
  EXPECT_EQ(e.height, 256);
  EXPECT_EQ(e.image_tokens, 32 * 16);
  EXPECT_EQ(e.reference_tokens, 32 * 16 + 4 * 4);
  EXPECT_EQ(e.guidance, 0);
  EXPECT_GT(e.minimum_bytes, 0u);
  EXPECT_LE(e.minimum_bytes, e.resident_bytes);
  auto cpp = klein::Model::open(tiny());
  ASSERT_TRUE(cpp.ok());
  klein::RequestSize rs;
  rs.references = {{512, 256}, {64, 64}};
  auto want = (*cpp)->estimate_memory(rs);
  ASSERT_TRUE(want.ok());
  // The same planner on a process of nearly the same size (a second model's tokenizer more).
  EXPECT_NEAR(static_cast<double>(e.resident_bytes), static_cast<double>(want->resident_bytes), 256.0 * (1 << 20));
  EXPECT_EQ(klein_model_estimate_memory(model, 0, 0, nullptr, 1, -1, &e, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("ref_sizes"), std::string::npos) << err.message;
  EXPECT_EQ(klein_model_estimate_memory(model, 0, 0, nullptr, 0, -1, nullptr, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_EQ(klein_model_estimate_memory(nullptr, 0, 0, nullptr, 0, -1, &e, &err), KLEIN_INVALID_ARGUMENT);
  klein_model_free(model);
}
