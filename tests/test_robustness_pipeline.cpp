// Robustness at the pipeline level (issue 12): the 27-layer text encoder, configs that claim
// more than the file holds, metadata without absolute paths, --prompt-file and the --seed range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "corrupt.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "klein/klein.h"
#include "models/qwen3.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;
using klein::testing::make_temp_dir;
using klein::testing::q;
using klein::testing::run_cli;
using klein::testing::slurp_file;
using klein::testing::spit_file;

namespace {

const fs::path te_dir() { return klein::testing::tiny_model_dir() / "text_encoder"; }

// A text encoder folder with layers [0, n) of the tiny one (+ embeddings, model.norm) and
// num_hidden_layers = n.
fs::path te_with_layers(int n, const std::string& tag) {
  auto store = WeightStore::open(te_dir());
  EXPECT_TRUE(store.ok());
  std::vector<TensorToWrite> keep;
  for (const auto& name : store->names()) {
    if (name.starts_with("model.layers.") && std::stoi(name.substr(13)) >= n) continue;
    const TensorEntry* e = store->entry(name);
    keep.push_back({name, e->dtype, e->shape, e->data});
  }
  const fs::path d = make_temp_dir(tag);
  EXPECT_TRUE(write_safetensors(d / "model.safetensors", keep).ok());
  auto cfg = read_json_file(te_dir() / "config.json");
  (*cfg)["num_hidden_layers"] = n;
  (*cfg).erase("layer_types");
  spit_file(d / "config.json", cfg->dump());
  return d;
}

TEST(TextEncoderRobust, TwentySevenLayersTapTheFinalNormedState) {
  // transformers: with exactly 27 layers, hidden_states[27] is model.norm(layer 26's output).
  const fs::path d = te_with_layers(27, "te27");
  CpuBackend be(CpuBackendOptions{1});
  RunContext ctx;
  ctx.backend = &be;
  auto full = Qwen3Encoder::load(te_dir(), 27);
  auto only27 = Qwen3Encoder::load(d, 27);
  ASSERT_TRUE(full.ok() && only27.ok()) << only27.status().to_string();
  const std::vector<int32_t> ids = {151644, 872, 198, 32, 8251, 151645};
  const std::vector<int32_t> mask(ids.size(), 1);
  auto raw = full->encode(ids, mask, {27}, ctx);
  auto normed = only27->encode(ids, mask, {27}, ctx);
  ASSERT_TRUE(raw.ok() && normed.ok());
  auto store = WeightStore::open(te_dir());
  auto w = store->get("model.norm.weight");
  ASSERT_TRUE(w.ok());
  const std::vector<float> nw = weight_to_vector(*w);
  const int64_t H = static_cast<int64_t>(nw.size());
  const double eps = full->config().rms_norm_eps;
  for (size_t l = 0; l < ids.size(); ++l) {
    const float* x = raw->data() + l * H;
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double r = 1.0 / std::sqrt(ss / H + eps);
    for (int64_t i = 0; i < H; ++i)
      EXPECT_NEAR(normed->data()[l * H + i], x[i] * r * nw[i], 1e-4 * (1 + std::fabs(x[i] * r * nw[i])));
  }
  fs::remove_all(d);
}

TEST(TextEncoderRobust, AConfigClaimingMoreLayersThanTheFileIsRefused) {
  const fs::path d = make_temp_dir("te_billion");
  fs::create_symlink(fs::absolute(te_dir() / "model.safetensors"), d / "model.safetensors");
  auto cfg = read_json_file(te_dir() / "config.json");
  (*cfg)["num_hidden_layers"] = 1000000000;
  spit_file(d / "config.json", cfg->dump());
  auto r = Qwen3Encoder::load(d, 27);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_hidden_layers is 1000000000"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("holds 30 layers"), std::string::npos) << r.status().message();
  fs::remove_all(d);
}

TEST(MetadataRobust, NoAbsolutePathsInTheImageMetadata) {
  auto m = Model::open(fs::absolute(klein::testing::tiny_model_dir()).string() + "/");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  GenerateRequest g;
  g.prompt = "a cat";
  g.width = g.height = 32;
  g.steps = 1;
  g.reference_images = {fs::absolute(klein::testing::data_dir() / "images" / "size_64x64.png").string()};
  auto r = (*m)->generate(g);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::map<std::string, std::string> md(r->metadata.begin(), r->metadata.end());
  EXPECT_EQ(md["model"], "tiny");
  EXPECT_EQ(md["reference1"], "size_64x64.png");
  for (const auto& [k, v] : r->metadata) EXPECT_EQ(v.find('/'), std::string::npos) << k << "=" << v;
}

TEST(PromptFileRobust, GenerateAndEncodeReadTheFileOrStdin) {
  const fs::path d = make_temp_dir("prompt_file");
  spit_file(d / "p.txt", "a cat holding a sign\n");  // the trailing newline is dropped
  const std::string base = "generate --model " + q(klein::testing::tiny_model_dir()) + " -W 32 -H 32 --steps 1 -q ";
  auto a = run_cli(base + "--prompt 'a cat holding a sign' -o " + q(d / "a.png"));
  auto b = run_cli(base + "--prompt-file " + q(d / "p.txt") + " -o " + q(d / "b.png"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(slurp_file(d / "a.png"), slurp_file(d / "b.png"));
  // "-" reads stdin; a prompt beyond the 128 KiB argument limit can only come this way.
  std::string big;
  while (big.size() < 200 * 1024) big += "a very long prompt ";
  spit_file(d / "big.txt", big);
  const std::string enc = std::string("'") + KLEIN_CLI_PATH + "' encode --model " + q(klein::testing::tiny_model_dir()) +
                          " -q --prompt-file - -o ";
  EXPECT_EQ(std::system((enc + q(d / "big.npy") + " < " + q(d / "big.txt")).c_str()), 0);
  EXPECT_TRUE(fs::exists(d / "big.npy"));
  EXPECT_EQ(std::system(("printf 'a cat holding a sign' | " + enc + q(d / "c.npy")).c_str()), 0);
  auto c2 = run_cli("encode --model " + q(klein::testing::tiny_model_dir()) + " -q --prompt-file " + q(d / "p.txt") +
                    " -o " + q(d / "c2.npy"));
  ASSERT_EQ(c2.exit_code, 0) << c2.err;
  EXPECT_EQ(slurp_file(d / "c.npy"), slurp_file(d / "c2.npy"));
  fs::remove_all(d);
}

TEST(SeedRobust, TheWholeRangeAndNothingElse) {
  const fs::path d = make_temp_dir("seed_range");
  const std::string base = "generate --model " + q(klein::testing::tiny_model_dir()) + " -W 32 -H 32 --steps 1 -q --prompt a ";
  EXPECT_EQ(run_cli(base + "--seed 18446744073709551615 -o " + q(d / "max.png")).exit_code, 0);
  EXPECT_EQ(run_cli(base + "--seed 0 -o " + q(d / "zero.png")).exit_code, 0);
  // "-1" wrapped to 2^64-1 and 2^64 saturated to it before: the same picture as the maximum.
  for (const char* bad : {"-1", "18446744073709551616", "+5", "0x10", "1e3"}) {
    auto r = run_cli(base + "--seed " + bad + " -o " + q(d / "bad.png"));
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_TRUE(r.err.starts_with("klein: invalid argument: --seed")) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "bad.png"));
  fs::remove_all(d);
}

}  // namespace
