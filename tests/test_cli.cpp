// The `klein` command line: output contracts other tools rely on, and bad-input behaviour
// (one clear line on stderr, non-zero exit, nothing written).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "klein/klein.h"
#include "klein/klein_c.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::run_cli;

namespace {
std::string model() { return "'" + klein::testing::tiny_model_dir().string() + "'"; }
int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}
}  // namespace

TEST(Cli, TokenizeJsonContract) {
  auto r = run_cli("tokenize --model " + model() + " 'Hello world'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({9707, 1879}));
  EXPECT_FALSE(j.contains("mask"));

  // --template + --max-length: the padded klein input with its mask.
  r = run_cli("tokenize --model " + model() + " --template --max-length 24 'A cat holding a sign that says hello world'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["ids"].size(), 24u);
  ASSERT_EQ(j["mask"].size(), 24u);
  EXPECT_EQ(j["ids"][0], 151644);
  EXPECT_EQ(j["ids"][20], 271);
  EXPECT_EQ(j["ids"][21], 151643);
  EXPECT_EQ(j["mask"][20], 1);
  EXPECT_EQ(j["mask"][21], 0);

  // A folder holding tokenizer.json directly; text starting with '-' after '--'.
  r = run_cli("tokenize --model '" + (klein::testing::tiny_model_dir() / "tokenizer").string() + "' -- '-x'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["ids"].empty());
}

TEST(Cli, EncodeWritesPromptEmbeds) {
  auto dir = klein::testing::make_temp_dir("cli_enc");
  auto out = dir / "e.npy";
  auto r = run_cli("encode --model " + model() + " --prompt 'A cat holding a sign that says hello world' -o '" +
                   out.string() + "' --quiet --threads 2 --precision fp32 --dump '" + (dir / "dump").string() + "' --dump-filter hidden_");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto a = klein::read_npy(out);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape, (klein::Shape{1, 512, 48}));
  auto ref = klein::read_npy(klein::testing::data_dir() / "ref" / "te_cat" / "prompt_embeds.npy");
  ASSERT_TRUE(ref.ok());
  auto x = a->to_f32(), y = ref->to_f32();
  double maxd = 0, maxr = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    maxd = std::max(maxd, static_cast<double>(std::fabs(x[i] - y[i])));
    maxr = std::max(maxr, static_cast<double>(std::fabs(y[i])));
  }
  EXPECT_LE(maxd / maxr, 1e-5);
  EXPECT_TRUE(fs::exists(dir / "dump" / "te.hidden_9.npy"));
  EXPECT_TRUE(fs::exists(dir / "dump" / "te.hidden_27.npy"));
  EXPECT_FALSE(fs::exists(dir / "dump" / "te.layer0.out.npy"));  // filtered out
  fs::remove_all(dir);
}

// `klein encode --precision fast` on a q8 folder runs the text encoder as generate --precision
// fast does (W8A8): its embeddings equal generate's dumped ones exactly, and differ from the
// float32 path's (so the option reaches the kernels).
TEST(Cli, EncodePrecisionMatchesGenerate) {
  auto dir = klein::testing::make_temp_dir("cli_enc_fast");
  const std::string q8 = "'" + (dir / "q8").string() + "'";
  auto r = run_cli("quantize -q --model " + model() + " --type q8 -o " + q8);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string prompt = " -q --prompt 'a cat' --threads 2 ";
  r = run_cli("generate --model " + q8 + prompt + "-W 32 -H 32 --steps 1 --precision fast -o '" +
              (dir / "g.png").string() + "' --dump '" + (dir / "d").string() + "' --dump-filter prompt_embeds");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("encode --model " + q8 + prompt + "--precision fast -o '" + (dir / "fast.npy").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("encode --model " + q8 + prompt + "--precision fp32 -o '" + (dir / "fp32.npy").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("compare '" + (dir / "fast.npy").string() + "' '" + (dir / "d" / "prompt_embeds.npy").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rel_l2       0.000e+00"), std::string::npos) << r.out;
  r = run_cli("compare '" + (dir / "fast.npy").string() + "' '" + (dir / "fp32.npy").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("rel_l2       0.000e+00"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// `klein decode` on the last step's dumped latents gives generate's own image, pixel for pixel
// (the same VAE code on the same latents); forcing tiles changes nothing beyond rounding.
TEST(Cli, DecodeReproducesGenerate) {
  auto dir = klein::testing::make_temp_dir("cli_decode");
  auto r = run_cli("generate --model " + model() + " -W 64 -H 48 --steps 2 --seed 3 -q -p 'a cat' -o '" +
                   (dir / "g.png").string() + "' --dump '" + (dir / "d").string() + "' --dump-filter latents_step");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("decode --model " + model() + " -q --latents '" + (dir / "d" / "latents_step2.npy").string() + "' -o '" +
              (dir / "x.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
  r = run_cli("compare '" + (dir / "g.png").string() + "' '" + (dir / "x.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("identical"), std::string::npos) << r.out;
  // An earlier step's latents decode to a different picture (the command reads its input).
  r = run_cli("decode --model " + model() + " -q --latents '" + (dir / "d" / "latents_step1.npy").string() + "' -o '" +
              (dir / "y.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("compare '" + (dir / "g.png").string() + "' '" + (dir / "y.png").string() + "'");
  EXPECT_EQ(r.out.find("identical"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// `klein compare` on two .npy dumps: the same array is cosine 1 / rel_l2 0; two steps' latents
// differ; a dump against a shape-mismatched one or an image is one clear error.
TEST(Cli, CompareArrays) {
  auto dir = klein::testing::make_temp_dir("cli_compare_npy");
  auto r = run_cli("generate --model " + model() + " -W 64 -H 48 --steps 2 --seed 3 -q -p 'a cat' -o '" +
                   (dir / "g.png").string() + "' --dump '" + (dir / "d").string() + "' --dump-filter latents_step,prompt_embeds");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string l1 = (dir / "d" / "latents_step1.npy").string(), l2 = (dir / "d" / "latents_step2.npy").string();
  r = run_cli("compare '" + l2 + "' '" + l2 + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cosine       1.000000000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rel_l2       0.000e+00"), std::string::npos) << r.out;
  r = run_cli("compare '" + l1 + "' '" + l2 + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("rel_l2       0.000e+00"), std::string::npos) << r.out;
  r = run_cli("compare '" + l1 + "' '" + (dir / "d" / "prompt_embeds.npy").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("differ in shape"), std::string::npos) << r.err;
  r = run_cli("compare '" + l1 + "' '" + (dir / "g.png").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("two images or two .npy"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// --prompt-embeds: a prompt's dumped embeddings given back instead of the prompt give the same
// image, pixel for pixel (the text encoder is skipped, nothing else changes); a different prompt's
// embeddings give a different one; embeddings of the wrong shape, with a NaN, or given together
// with a prompt are one clear error and write nothing.
TEST(Cli, PromptEmbedsReplaceTheEncoder) {
  auto dir = klein::testing::make_temp_dir("cli_embeds");
  const std::string gen = "generate --model " + model() + " -W 64 -H 48 --steps 2 --seed 3 -q ";
  auto r = run_cli(gen + "-p 'a cat' -o '" + (dir / "g.png").string() + "' --dump '" + (dir / "d").string() +
                   "' --dump-filter prompt_embeds,latents_step2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string pe = (dir / "d" / "prompt_embeds.npy").string();
  r = run_cli(gen + "--prompt-embeds '" + pe + "' -o '" + (dir / "e.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("compare '" + (dir / "g.png").string() + "' '" + (dir / "e.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("identical"), std::string::npos) << r.out;

  r = run_cli("encode --model " + model() + " -q --prompt 'a dog on a beach' -o '" + (dir / "dog.npy").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli(gen + "--prompt-embeds '" + (dir / "dog.npy").string() + "' -o '" + (dir / "f.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("compare '" + (dir / "g.png").string() + "' '" + (dir / "f.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("identical"), std::string::npos) << r.out;

  auto a = klein::read_npy(pe);
  ASSERT_TRUE(a.ok());
  std::vector<float> v = a->to_f32();
  const int64_t E = a->shape[2];
  v[5] = std::nanf("");
  ASSERT_TRUE(klein::write_npy(dir / "nan.npy", klein::DType::kF32, a->shape, v.data()).ok());
  ASSERT_TRUE(klein::write_npy(dir / "narrow.npy", klein::DType::kF32, {1, 4, E - 1}, v.data() + 8).ok());
  struct Case {
    std::string args, expect;
  };
  const std::string out = " -o '" + (dir / "bad.png").string() + "'";
  const std::vector<Case> cases = {
      {gen + "--prompt-embeds '" + (dir / "nan.npy").string() + "'" + out, "non-finite value at flat index 5"},
      {gen + "--prompt-embeds '" + (dir / "narrow.npy").string() + "'" + out, "expected prompt embeddings"},
      {gen + "--prompt-embeds '" + (dir / "d" / "latents_step2.npy").string() + "'" + out, "expected prompt embeddings"},
      {gen + "--prompt-embeds '" + (dir / "none.npy").string() + "'" + out, "none.npy"},
      {gen + "-p x --prompt-embeds '" + pe + "'" + out, "excludes"},
  };
  for (const auto& c : cases) {
    r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << c.args << "\nstderr: " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir / "bad.png"));
  fs::remove_all(dir);
}

TEST(Cli, InfoDescribesComponents) {
  auto r = run_cli("info --model " + model());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"Flux2KleinPipeline", "Qwen3ForCausalLM", "Flux2Transformer2DModel", "AutoencoderKLFlux2",
                        "hidden_size=16", "num_hidden_layers=30", "BF16", "parameters"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

// A folder that lacks a component cannot run: `info` still prints what it found (stdout) and
// names what is missing (stderr), and exits 1; the whole tiny model exits 0 (above).
TEST(Cli, InfoExitsNonZeroOnAMissingComponent) {
  auto dir = klein::testing::make_temp_dir("cli_info_missing");
  fs::copy(klein::testing::tiny_model_dir(), dir / "m", fs::copy_options::recursive);
  fs::remove_all(dir / "m" / "vae");
  auto r = run_cli("info --model '" + (dir / "m").string() + "'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  for (const char* s : {"Flux2KleinPipeline", "[transformer] Flux2Transformer2DModel", "[vae] AutoencoderKLFlux2",
                        "component folder \"vae\" is missing"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_TRUE(r.err.starts_with("klein: vae: missing: ")) << r.err;
  fs::remove_all(dir);
}

TEST(Cli, PhaseTimesListEachPhaseOnce) {
  // Editing nests the VAE's "vae_encode" steps inside the pipeline's per-reference "vae encode":
  // the summary must still name each phase once (it listed "vae encode" before and after).
  auto dir = klein::testing::make_temp_dir("cli_phases");
  const std::string ref = (klein::testing::tiny_model_dir().parent_path() / "ref" / "edit1_auto" / "ref0.png").string();
  auto r = run_cli("generate --model " + model() + " -p 'a red fox' -W 32 -H 32 --steps 2 -t 2 --ref '" + ref +
                   "' -o '" + (dir / "e.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, int> seen;
  std::istringstream in(r.err);
  for (std::string line; std::getline(in, line);)
    if (line.size() > 4 && line.rfind("  ", 0) == 0 && line.ends_with(" s")) {  // "  vae encode   1.23 s"
      const std::string head = line.substr(2, line.rfind(' ', line.size() - 3) - 2);  // drops " 1.23 s"
      ++seen[head.substr(0, head.find_last_not_of(' ') + 1)];
    }
  for (const char* want : {"encode", "vae encode", "vae_encode", "denoise", "decode", "total"})
    EXPECT_EQ(seen[want], 1) << want << " in:\n" << r.err;
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
  fs::remove_all(dir);
}

TEST(Cli, BadInputGivesOneLineAndNonZeroExit) {
  auto dir = klein::testing::make_temp_dir("cli_bad");
  struct Case {
    std::string args;
    std::string expect;
  };
  // A model folder whose text encoder weights are truncated.
  auto broken = dir / "broken";
  fs::copy(klein::testing::tiny_model_dir(), broken, fs::copy_options::recursive);
  fs::resize_file(broken / "text_encoder" / "model.safetensors", 1000);
  // A tokenizer folder without its files.
  fs::create_directories(dir / "empty_tok");
  const std::vector<Case> cases = {
      {"encode --model '" + (dir / "nope").string() + "' --prompt x -q -o '" + (dir / "o.npy").string() + "'", "no such model folder"},
      {"encode --model '" + broken.string() + "' --prompt x -q -o '" + (dir / "o.npy").string() + "'", "model.safetensors"},
      {"tokenize --model '" + (dir / "empty_tok").string() + "' x", "tokenizer"},
      {"info --model '" + dir.string() + "'", "model_index.json"},
      {"tokenize --model " + model() + " --max-length 0 x", "max-length"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << c.args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
  EXPECT_FALSE(fs::exists(dir / "o.npy"));
  fs::remove_all(dir);
}

// A misspelt command or option is named with the nearest valid name (exit 2), even where CLI11
// would first report a missing required option; a name near nothing gets no suggestion.
TEST(Cli, TypoSuggestsTheNearestName) {
  struct Case {
    std::string args, first_line;
  };
  const std::vector<Case> cases = {
      {"genrate --prompt a -o x.png", "klein: invalid argument: unknown command 'genrate'; did you mean 'generate'?"},
      {"qunatize", "unknown command 'qunatize'; did you mean 'quantize'?"},
      {"frobnicate", "unknown command 'frobnicate' (see klein --help)"},
      {"generate --seeed 3 --prompt a", "unknown option '--seeed' for 'generate'; did you mean '--seed'?"},
      {"generate --prompt a -o x.png --stpes=2", "unknown option '--stpes' for 'generate'; did you mean '--steps'?"},
      {"quantize --model m --tpye q8 -o q", "unknown option '--tpye' for 'quantize'; did you mean '--type'?"},
      {"serve --prot 8080", "unknown option '--prot' for 'serve'; did you mean '--port'?"},
      {"--verison", "unknown option '--verison'; did you mean '--version'?"},
      {"--qiuet generate -o x.png", "unknown option '--qiuet' (see klein --help)"},  // before the command: klein's
      {"generate --zzzzzzzz -o x.png", "unknown option '--zzzzzzzz' for 'generate' (see klein generate --help)"},
      {"generate -x -o x.png", "unknown option '-x' for 'generate' (see klein generate --help)"},  // one letter: no guess
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.substr(0, r.err.find('\n')).find(c.first_line), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
}

// Every writer takes a bare relative name (whose parent_path() is empty: the working folder) and a
// nested relative path, as it takes an absolute one.
TEST(Cli, RelativeOutputPaths) {
  auto dir = klein::testing::make_temp_dir("cli_rel");
  fs::create_directory(dir / "sub");
  auto ok = [&](const std::string& args) {
    auto r = klein::testing::run_cli(args, dir);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  };
  const std::string gen = "generate --model " + model() + " -W 32 -H 32 --steps 1 -q -p 'a cat' ";
  ok(gen + "-o g.png --preview p.png --dump d --dump-filter latents_step");
  ok(gen + "-o sub/g.png --preview sub/p.png --dump sub/d --dump-filter latents_step");
  for (const char* f : {"g.png", "p.png", "d/latents_step1.npy", "sub/g.png", "sub/p.png", "sub/d/latents_step1.npy"})
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
  ok("encode --model " + model() + " -q -p 'a cat' -o e.npy");
  ok("encode --model " + model() + " -q -p 'a cat' -o sub/e.npy");
  ok("decode --model " + model() + " -q --latents d/latents_step1.npy -o x.png");
  ok("decode --model " + model() + " -q --latents sub/d/latents_step1.npy -o sub/x.png");
  ok("quantize --model " + model() + " --type q8 -q -o q8");
  ok("quantize --model " + model() + " --type q8 -q -o sub/q8");
  for (const char* f : {"e.npy", "sub/e.npy", "x.png", "sub/x.png", "q8/model_index.json", "sub/q8/model_index.json"})
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
  // The quantized folders load.
  ok("info --model q8");
  ok("info --model sub/q8");
  fs::remove_all(dir);
}

// The default precision is fast in every entry point (CLI, C++ and C API, one-shot generate),
// and the PNG names the precision that made it.
TEST(Cli, DefaultPrecisionIsFastAndThePngNamesIt) {
  EXPECT_EQ(klein::LoadOptions{}.precision, klein::Precision::kFast);
  EXPECT_EQ(klein::GenerateOptions{}.precision, klein::Precision::kFast);
  EXPECT_EQ(klein_load_default_params().precision, KLEIN_PRECISION_FAST);
  auto dir = klein::testing::make_temp_dir("cli_precision");
  auto png_text = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  // An iTXt chunk: keyword, NUL, compression flag and method, language and translated keyword
  // (both empty: NUL each), then the text.
  const std::string fast_chunk = std::string("precision") + '\0' + '\0' + '\0' + '\0' + '\0' + "fast";
  const std::string fp32_chunk = std::string("precision") + '\0' + '\0' + '\0' + '\0' + '\0' + "fp32";
  const std::string args = " -q --prompt 'a cat' -W 32 -H 32 --steps 1 --threads 2 -o '";
  auto r = run_cli("generate --model " + model() + args + (dir / "default.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("generate --model " + model() + " --precision fp32" + args + (dir / "fp32.png").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string a = png_text(dir / "default.png"), b = png_text(dir / "fp32.png");
  EXPECT_NE(a.find(fast_chunk), std::string::npos);
  EXPECT_EQ(a.find(fp32_chunk), std::string::npos);
  EXPECT_NE(b.find(fp32_chunk), std::string::npos);
  fs::remove_all(dir);
}

// `klein info` ends with what one request needs (the planner behind --max-memory), for the size
// and references given; a malformed --ref-size is one clear error.
TEST(Cli, InfoShowsWhatARequestNeeds) {
  auto r = run_cli("info --model " + model() + " -W 256 -H 128 --ref-size 64x64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[request] 256x128: 128 image tokens, 1 reference(s) of 16 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fastest    memory plan: text encoder whole, transformer whole"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("smallest   memory plan:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(--max-memory "), std::string::npos) << r.out;
  r = run_cli("info --model " + model() + " --ref-size 64by64");
  EXPECT_EQ(r.exit_code, 2);  // a usage error
  EXPECT_NE(r.err.find("--ref-size 64by64: expected WIDTHxHEIGHT"), std::string::npos) << r.err;
}
