// Qwen3 text encoder and prompt encoding against transformers/diffusers reference dumps
// (tests/data/ref/te_*, made by scripts/reference/dump_reference.py from tests/data/tiny).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "io/json_file.h"
#include "io/model_folder.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "klein/klein.h"
#include "models/qwen3.h"
#include "pipeline/prompt_encoder.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;

namespace {

struct Err {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};

// Compares ours[:, :, col0:col0+width] (rows of `ld` floats) against a reference [rows, width].
Err compare(const float* ours, int64_t ld, int64_t col0, const std::vector<float>& ref, int64_t width) {
  Err e;
  const int64_t rows = static_cast<int64_t>(ref.size()) / width;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) {
      const double a = ours[r * ld + col0 + c], b = ref[r * width + c];
      e.max_abs = std::max(e.max_abs, std::fabs(a - b));
      e.max_ref = std::max(e.max_ref, std::fabs(b));
    }
  return e;
}

std::vector<std::string> te_cases() {
  auto j = read_json_file(klein::testing::data_dir() / "ref" / "manifest.json");
  std::vector<std::string> r;
  if (!j.ok()) return r;
  for (const auto& c : (*j)["cases"])
    if (c.value("kind", "") == "text_encoder") r.push_back(c["name"].get<std::string>());
  return r;
}

std::string prompt_of(const std::string& name) {
  auto j = read_json_file(klein::testing::data_dir() / "ref" / "manifest.json");
  for (const auto& c : (*j)["cases"])
    if (c["name"] == name) return c["prompt"].get<std::string>();
  return {};
}

}  // namespace

class TextEncoderRef : public ::testing::TestWithParam<std::string> {};

// The whole text path (template, tokenizer, padding, Qwen3, tap concatenation) against
// diffusers' encode_prompt with the fp32 pipeline. Tolerance: 1e-5 of the largest reference value.
TEST_P(TextEncoderRef, MatchesDiffusersEncodePrompt) {
  const std::string name = GetParam();
  const fs::path dir = klein::testing::data_dir() / "ref" / name;
  auto model = ModelFolder::open(klein::testing::tiny_model_dir());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  CpuBackend pool(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &pool;
  auto tok = Tokenizer::load(model->root() / "tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto te = Qwen3Encoder::load(model->root() / "text_encoder", kKleinTextLayersNeeded);
  ASSERT_TRUE(te.ok()) << te.status().to_string();
  auto enc = encode_prompt(*tok, *te, prompt_of(name), ctx);
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();

  auto ids = read_npy(dir / "input_ids.npy");
  auto mask = read_npy(dir / "attention_mask.npy");
  ASSERT_TRUE(ids.ok() && mask.ok());
  auto ref_ids = ids->to_i64(), ref_mask = mask->to_i64();
  ASSERT_EQ(ref_ids.size(), enc->ids.size());
  for (size_t i = 0; i < ref_ids.size(); ++i) {
    ASSERT_EQ(enc->ids[i], ref_ids[i]) << "token " << i;
    ASSERT_EQ(enc->mask[i], ref_mask[i]) << "mask " << i;
  }

  const Tensor& e = enc->embeds;  // [1, 512, 3H]
  const int64_t width = e.dim(2) / 3;
  const char* taps[] = {"hidden_9.npy", "hidden_18.npy", "hidden_27.npy"};
  for (int t = 0; t < 3; ++t) {
    auto ref = read_npy(dir / taps[t]);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    Err err = compare(e.data(), e.dim(2), t * width, ref->to_f32(), width);
    EXPECT_LE(err.rel(), 1e-5) << name << " " << taps[t] << " max abs " << err.max_abs << " of " << err.max_ref;
  }
  auto ref = read_npy(dir / "prompt_embeds.npy");
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(ref->shape, e.shape());
  Err err = compare(e.data(), e.dim(2), 0, ref->to_f32(), e.dim(2));
  EXPECT_LE(err.rel(), 1e-5) << name << " prompt_embeds max abs " << err.max_abs << " of " << err.max_ref;

  // The bf16 pipeline rounds every intermediate to bf16; we compute in fp32, so agreement is
  // only approximate. Recorded, and bounded loosely so a gross error would still show.
  auto bf = read_npy(dir / "prompt_embeds_bf16.npy");
  ASSERT_TRUE(bf.ok());
  Err ebf = compare(e.data(), e.dim(2), 0, bf->to_f32(), e.dim(2));
  RecordProperty("bf16_rel_err", std::to_string(ebf.rel()));
  std::printf("[ info ] %s: fp32 ref rel err %.3g; bf16-pipeline ref rel err %.3g (max abs %.3g)\n",
              name.c_str(), err.rel(), ebf.rel(), ebf.max_abs);
  EXPECT_LE(ebf.rel(), 0.1) << name;
}

INSTANTIATE_TEST_SUITE_P(Tiny, TextEncoderRef, ::testing::ValuesIn(te_cases()),
                         [](const auto& info) { return info.param; });

TEST(TextEncoder, FixturesArePresent) { EXPECT_GE(te_cases().size(), 4u); }

// Layers after the deepest tap are never needed: a checkpoint without them gives the same result.
TEST(TextEncoder, LaterLayersAreNeverRead) {
  const fs::path src = klein::testing::tiny_model_dir() / "text_encoder";
  auto store = WeightStore::open(src);
  ASSERT_TRUE(store.ok());
  auto cfg = read_json_file(src / "config.json");
  ASSERT_TRUE(cfg.ok());
  const int n_layers = (*cfg)["num_hidden_layers"].get<int>();
  ASSERT_GT(n_layers, 27) << "the tiny model must have layers beyond the deepest tap";
  // Keep every tensor except those of layers >= 27 and the final norm; poison nothing else.
  std::vector<TensorToWrite> keep;
  int dropped = 0;
  for (const auto& n : store->names()) {
    bool late = false;
    for (int i = 27; i < n_layers; ++i)
      if (n.rfind("model.layers." + std::to_string(i) + ".", 0) == 0) late = true;
    if (late || n == "model.norm.weight") {
      ++dropped;
      continue;
    }
    const TensorEntry* e = store->entry(n);
    keep.push_back({n, e->dtype, e->shape, e->data});
  }
  ASSERT_GT(dropped, 0);
  auto dir = klein::testing::make_temp_dir("te_trim");
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", keep).ok());
  fs::copy_file(src / "config.json", dir / "config.json");

  std::vector<int32_t> ids = {151644, 872, 198, 32, 8251, 151645, 151643, 151643};
  std::vector<int32_t> mask = {1, 1, 1, 1, 1, 1, 0, 0};
  CpuBackend pool(CpuBackendOptions{1});
  RunContext ctx;
  ctx.backend = &pool;
  auto full = Qwen3Encoder::load(src, 27);
  auto trimmed = Qwen3Encoder::load(dir, 27);
  ASSERT_TRUE(full.ok() && trimmed.ok()) << trimmed.status().to_string();
  EXPECT_EQ(trimmed->loaded_layers(), 27);
  auto a = full->encode(ids, mask, {9, 18, 27}, ctx);
  auto b = trimmed->encode(ids, mask, {9, 18, 27}, ctx);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(a->data()[i], b->data()[i]);
  // ...but asking for a layer that is not in the file is a clear error.
  auto deeper = Qwen3Encoder::load(dir, 28);
  ASSERT_FALSE(deeper.ok());
  EXPECT_NE(deeper.status().message().find("model.layers.27."), std::string::npos) << deeper.status().message();
  fs::remove_all(dir);
}

TEST(TextEncoder, ConfigContradictingShapesIsAClearError) {
  const fs::path src = klein::testing::tiny_model_dir() / "text_encoder";
  auto dir = klein::testing::make_temp_dir("te_cfg");
  fs::create_symlink(fs::absolute(src / "model.safetensors"), dir / "model.safetensors");
  auto cfg = read_json_file(src / "config.json");
  ASSERT_TRUE(cfg.ok());
  (*cfg)["num_attention_heads"] = 8;  // q_proj would need 8*8 rows
  std::ofstream(dir / "config.json") << cfg->dump();
  auto r = Qwen3Encoder::load(dir, 27);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFormatError);
  EXPECT_NE(r.status().message().find("q_proj.weight"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos) << r.status().message();

  (*cfg)["num_attention_heads"] = 3;  // not a multiple of 2 kv heads
  std::ofstream(dir / "config.json") << cfg->dump();
  r = Qwen3Encoder::load(dir, 27);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_key_value_heads"), std::string::npos) << r.status().message();

  cfg->erase("hidden_size");
  std::ofstream(dir / "config.json") << cfg->dump();
  r = Qwen3Encoder::load(dir, 27);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hidden_size"), std::string::npos);
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos);
  fs::remove_all(dir);
}

// Files written in name order hold each layer's up_proj right after its gate_proj (and `klein
// quantize` keeps their scales and offsets adjacent too), so the encoder reads the two as one
// [gate; up] weight with the SwiGLU in the GEMM's epilogue. The same file with the tensors
// rearranged (up_proj moved away) runs two linears and a separate SwiGLU: the bits are the same,
// in float32 and with the fast kernels, for the stored and the quantized formats.
TEST(TextEncoder, StackedGateUpGivesTheBitsOfSeparateProjections) {
  std::vector<fs::path> folders = {klein::testing::tiny_model_dir()};
  for (const char* type : {"q8", "q4"}) {
    QuantizeOptions o;
    o.model = klein::testing::tiny_model_dir().string();
    o.output = (klein::testing::make_temp_dir(std::string("te_stack_") + type) / "model").string();
    o.type = type;
    ASSERT_TRUE(quantize_model(o).ok()) << type;
    folders.push_back(o.output);
  }
  const std::vector<int32_t> ids = {151644, 872, 198, 32, 8251, 151645, 151643, 151643};
  const std::vector<int32_t> mask = {1, 1, 1, 1, 1, 1, 0, 0};
  for (const fs::path& folder : folders) {
    const fs::path src = folder / "text_encoder";
    auto store = WeightStore::open(src);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    int stacked = 0;
    std::vector<TensorToWrite> front, moved;
    for (const auto& n : store->names()) {
      const TensorEntry* e = store->entry(n);
      (n.find(".mlp.up_proj.") != std::string::npos ? moved : front).push_back({n, e->dtype, e->shape, e->data});
      if (n.ends_with(".mlp.gate_proj.weight")) {
        auto g = store->get(n);
        auto u = store->get(n.substr(0, n.size() - 16) + "up_proj.weight");
        ASSERT_TRUE(g.ok() && u.ok()) << n;
        stacked += g->stacked_with(*u).has_value();
      }
    }
    auto cfg = read_json_file(src / "config.json");
    ASSERT_TRUE(cfg.ok());
    EXPECT_EQ(stacked, (*cfg)["num_hidden_layers"].get<int>()) << folder << ": gate and up are not adjacent";
    // The up projections after everything else, the down projections between them and the gates.
    front.insert(front.end(), moved.begin(), moved.end());
    const fs::path apart = klein::testing::make_temp_dir("te_apart");
    ASSERT_TRUE(write_safetensors(apart / "model.safetensors", front).ok());
    fs::copy_file(src / "config.json", apart / "config.json");
    auto sep_store = WeightStore::open(apart);
    ASSERT_TRUE(sep_store.ok());
    auto g0 = sep_store->get("model.layers.0.mlp.gate_proj.weight"), u0 = sep_store->get("model.layers.0.mlp.up_proj.weight");
    ASSERT_TRUE(g0.ok() && u0.ok());
    EXPECT_FALSE(g0->stacked_with(*u0).has_value());

    auto one = Qwen3Encoder::load(src, 27);
    auto two = Qwen3Encoder::load(apart, 27);
    ASSERT_TRUE(one.ok() && two.ok()) << folder;
    for (kernels::Precision p : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
      CpuBackend be(CpuBackendOptions{2, Isa::kCount, p});
      RunContext ctx;
      ctx.backend = &be;
      auto a = one->encode(ids, mask, {9, 18, 27}, ctx);
      auto b = two->encode(ids, mask, {9, 18, 27}, ctx);
      ASSERT_TRUE(a.ok() && b.ok()) << folder;
      ASSERT_EQ(a->numel(), b->numel());
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->numel() * sizeof(float)), 0)
          << folder << (p == kernels::Precision::kFast ? " fast" : " fp32");
    }
    fs::remove_all(apart);
  }
}
