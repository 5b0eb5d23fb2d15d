// LoRA (io/lora.h, models/lora_apply.h, the CPU backend's run-time terms) against the pinned
// oracle: tests/data/lora from scripts/reference/make_lora_fixtures.py (PEFT LoRAs on the tiny
// model in each trainer's key scheme, diffusers' images with load_lora_weights fused and unfused,
// LoKr / LoHa deltas by the formula).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/quantize.h"
#include "dit_testing.h"
#include "io/lora.h"
#include "io/npy.h"
#include "io/safetensors_writer.h"
#include "klein/klein.h"
#include "klein/klein_c.h"
#include "models/lora_apply.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::max_rel_err;
using klein::testing::must_read_f32;

namespace klein {
namespace {

fs::path lora_dir() { return testing::data_dir() / "lora"; }
fs::path tiny_dit_dir() { return testing::tiny_model_dir() / "transformer"; }

Flux2Transformer must_load_dit(const fs::path& dir) {
  auto m = Flux2Transformer::load(dir);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

LoraFile must_parse(const std::string& file, const std::vector<LoraTarget>& targets,
                    LoraComponent c = LoraComponent::kTransformer) {
  auto f = load_lora(lora_dir() / file, targets, c);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return f.ok() ? std::move(f).value() : LoraFile{};
}

// scale · ΔW of a delta as a dense [rows, cols] matrix.
std::vector<float> dense(const LoraDelta& d) {
  std::vector<float> m(static_cast<size_t>(d.rows * d.cols));
  for (int64_t i = 0; i < d.rows; ++i)
    for (int64_t j = 0; j < d.cols; ++j) {
      double s = 0;
      if (d.rank > 0)
        for (int64_t k = 0; k < d.rank; ++k) s += double(d.up[i * d.rank + k]) * d.down[k * d.cols + j];
      else
        s = d.down[i * d.cols + j];
      m[i * d.cols + j] = static_cast<float>(s * d.scale);
    }
  return m;
}

std::map<std::string, std::vector<float>> dense_by_target(const LoraFile& f) {
  std::map<std::string, std::vector<float>> m;
  for (const LoraDelta& d : f.deltas) m[d.target] = dense(d);
  return m;
}

// The same LoRA in the diffusers, BFL-named (fused qkv as one block-diagonal module) and kohya
// schemes gives the same ΔW on every weight that the files share.
TEST(Lora, SchemesGiveTheSameDeltas) {
  auto dit = must_load_dit(tiny_dit_dir());
  const auto targets = lora_targets(dit);
  const LoraFile df = must_parse("lora_diffusers.safetensors", targets);
  const LoraFile bf = must_parse("lora_bfl.safetensors", targets);
  const LoraFile kf = must_parse("lora_kohya.safetensors", targets);
  EXPECT_EQ(df.scheme, "diffusers/PEFT");
  EXPECT_EQ(bf.scheme, "BFL-named PEFT");
  EXPECT_EQ(kf.scheme, "kohya");
  const auto d = dense_by_target(df), b = dense_by_target(bf), k = dense_by_target(kf);
  EXPECT_EQ(d.size(), targets.size());  // every linear of the DiT
  EXPECT_EQ(b.size(), targets.size() - 1);  // all but the final modulation (see the script)
  EXPECT_GT(k.size(), 20u);
  for (const auto* other : {&b, &k})
    for (const auto& [name, m] : *other) {
      ASSERT_TRUE(d.count(name)) << name;
      EXPECT_LE(max_rel_err(m, d.at(name)), 1e-6) << name;
    }
  // q, k and v of the fused BFL qkv each got their own rows.
  EXPECT_TRUE(b.count("transformer_blocks.1.attn.add_v_proj.weight"));
}

// BFL's final-layer modulation is (shift, scale), diffusers' norm_out.linear (scale, shift): a
// BFL-named LoRA of it is applied with its halves swapped (diffusers' ai-toolkit converter does
// not swap them; docs/lora.md).
TEST(Lora, FinalLayerHalvesAreSwapped) {
  auto dit = must_load_dit(tiny_dit_dir());
  const auto targets = lora_targets(dit);
  const auto d = dense_by_target(must_parse("lora_diffusers.safetensors", targets));
  const auto f = dense_by_target(must_parse("lora_bfl_final_layer.safetensors", targets));
  ASSERT_EQ(f.size(), 1u);
  ASSERT_TRUE(f.count("norm_out.linear.weight"));
  EXPECT_LE(max_rel_err(f.at("norm_out.linear.weight"), d.at("norm_out.linear.weight")), 1e-6);
}

// LyCORIS LoKr (kron, BFL fused qkv cut into q/k/v, alpha only with a split factor) and LoHa
// (Hadamard product of two low-rank products, alpha / rank) against the formula in torch.
TEST(Lora, LycorisDeltasMatchTheFormula) {
  auto dit = must_load_dit(tiny_dit_dir());
  const auto targets = lora_targets(dit);
  for (const char* name : {"lokr", "loha"}) {
    SCOPED_TRACE(name);
    const std::string file = std::string(name) + (std::string(name) == "lokr" ? "_bfl" : "") + ".safetensors";
    const auto got = dense_by_target(must_parse(file, targets));
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(lora_dir() / (std::string(name) + "_delta"))) {
      const std::string target = e.path().stem().string();
      ASSERT_TRUE(got.count(target)) << target;
      EXPECT_LE(max_rel_err(got.at(target), must_read_f32(e.path())), 1e-6) << target;
      ++n;
    }
    EXPECT_EQ(n, got.size());
    EXPECT_GT(n, 0u);
  }
}

// ---- the whole pipeline against diffusers

struct RefCase {
  const char* name;
  const char* file;
  float scale;
  LoraMode mode;
  const char* te_file = nullptr;
};

void PrintTo(const RefCase& c, std::ostream* os) { *os << c.name; }

class LoraRef : public ::testing::TestWithParam<RefCase> {};

// The decoder input and the 8-bit picture after 4 steps equal diffusers' (load_lora_weights,
// unfused through PEFT's forward, or fused) under the float32 path.
TEST_P(LoraRef, MatchesDiffusers) {
  const RefCase& c = GetParam();
  const fs::path ref = lora_dir() / c.name;
  const fs::path dump = testing::make_temp_dir("lora_ref");
  LoadOptions lo;
  lo.threads = 2;
  lo.precision = Precision::kFp32;
  lo.loras.push_back({(lora_dir() / c.file).string(), c.scale});
  if (c.te_file) lo.loras.push_back({(lora_dir() / c.te_file).string(), 1.0f});
  lo.lora_mode = c.mode;
  auto model = Model::open(testing::tiny(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  GenerateRequest g;
  g.prompt = "A cat holding a sign that says hello world";
  g.width = g.height = 64;
  g.steps = 4;
  g.seed = 42;
  g.dump = {dump.string(), "latents_final"};
  auto r = (*model)->generate(g);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const double e = max_rel_err(must_read_f32(dump / "latents_final.npy"), must_read_f32(ref / "latents_final.npy"));
  std::printf("[ info ] %s: decoder input rel err %.3g\n", c.name, e);
  EXPECT_LE(e, 1e-5);
  auto u8 = read_npy(ref / "image_u8.npy");
  ASSERT_TRUE(u8.ok());
  ASSERT_EQ(u8->bytes.size(), r->image.rgb.size());
  int maxd = 0;
  for (size_t i = 0; i < u8->bytes.size(); ++i)
    maxd = std::max(maxd, std::abs(int(u8->bytes[i]) - int(r->image.rgb[i])));
  EXPECT_LE(maxd, 1);
  fs::remove_all(dump);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, LoraRef,
    ::testing::Values(RefCase{"diffusers_s1", "lora_diffusers.safetensors", 1.0f, LoraMode::kRuntime},
                      RefCase{"diffusers_s05", "lora_diffusers.safetensors", 0.5f, LoraMode::kRuntime},
                      RefCase{"diffusers_fused_s1", "lora_diffusers.safetensors", 1.0f, LoraMode::kMerge},
                      RefCase{"diffusers_fused_s05", "lora_diffusers.safetensors", 0.5f, LoraMode::kAuto},
                      RefCase{"bfl_s1", "lora_bfl.safetensors", 1.0f, LoraMode::kAuto},
                      RefCase{"kohya_s1", "lora_kohya.safetensors", 1.0f, LoraMode::kRuntime},
                      RefCase{"te_s1", "lora_diffusers.safetensors", 1.0f, LoraMode::kAuto, "lora_te.safetensors"}),
    [](const auto& info) { return std::string(info.param.name); });

// A resident model switches LoRAs per request (GenerateRequest::loras, at run time): with the
// LoRA it gives diffusers' LoRA image, without it the plain model's, then the LoRA's again.
TEST(Lora, PerRequestLorasOnAResidentModel) {
  LoadOptions lo;
  lo.threads = 2;
  lo.precision = Precision::kFp32;
  lo.memory = MemoryPolicy::kResident;
  auto model = Model::open(testing::tiny(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const fs::path dump = testing::make_temp_dir("lora_req");
  for (int k = 0; k < 3; ++k) {
    GenerateRequest g;
    g.prompt = "A cat holding a sign that says hello world";
    g.width = g.height = 64;
    g.steps = 4;
    g.seed = 42;
    g.dump = {dump.string(), "latents_final"};
    if (k != 1) g.loras.push_back({(lora_dir() / "lora_diffusers.safetensors").string(), 0.5f});
    auto r = (*model)->generate(g);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const fs::path ref = k != 1 ? lora_dir() / "diffusers_s05" : testing::data_dir() / "ref" / "t2i_64x64";
    EXPECT_LE(max_rel_err(must_read_f32(dump / "latents_final.npy"), must_read_f32(ref / "latents_final.npy")), 1e-5)
        << "request " << k;
  }
  GenerateRequest bad;
  bad.prompt = "x";
  bad.width = bad.height = 64;
  bad.loras.push_back({(lora_dir() / "missing.safetensors").string(), 1.0f});
  EXPECT_EQ((*model)->generate(bad).status().code(), Code::kNotFound);
  fs::remove_all(dump);
}

// ---- run time against merged

Result<Tensor> dit_forward(const Flux2Transformer& m, kernels::Precision p = kernels::Precision::kFp32) {
  const Flux2Config& c = m.config();
  const int64_t T = 5, h = 3, w = 4, N = h * w;
  Tensor img({N, c.in_channels}), txt({T, c.joint_attention_dim});
  for (int64_t i = 0; i < img.numel(); ++i) img.data()[i] = std::sin(0.37f * i);
  for (int64_t i = 0; i < txt.numel(); ++i) txt.data()[i] = std::cos(0.11f * i);
  CpuBackend be(CpuBackendOptions{2, Isa::kCount, p});
  RunContext ctx;
  ctx.backend = &be;
  return m.forward(img, txt, 0.7f, flux2_image_ids(h, w), flux2_text_ids(T), ctx);
}

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

// Every weight of the model dequantized into an owned float32 copy ("dequantize, merge, run").
void dequantize_all(Flux2Transformer& m) {
  for (const auto& r : m.tensor_table()) {
    if (!r.weight || r.weight->empty() || r.weight->dtype == DType::kF32) continue;
    auto v = std::make_shared<std::vector<float>>(weight_to_vector(*r.weight));
    Weight& w = *r.weight;
    Weight o;
    o.name = w.name;
    o.shape = w.shape;
    o.data = v->data();
    o.nbytes = v->size() * sizeof(float);
    o.owner = std::shared_ptr<const void>(v, v->data());
    w = o;
  }
}

TEST(Lora, RuntimeEqualsMergedOnFloatWeights) {
  std::vector<LoraUse> uses;
  auto base = must_load_dit(tiny_dit_dir());
  const auto targets = lora_targets(base);
  for (auto [file, s] : {std::pair{"lora_diffusers.safetensors", 0.7f}, {"lokr_bfl.safetensors", 1.0f},
                         {"lora_kohya.safetensors", -0.4f}})
    uses.push_back({std::make_shared<const LoraFile>(must_parse(file, targets)), s});
  auto merged = must_load_dit(tiny_dit_dir());
  auto runtime = must_load_dit(tiny_dit_dir());
  int nm = 0, nr = 0;
  ASSERT_TRUE(apply_loras(merged, uses, LoraApply::kMerge, true, &nm, &nr).ok());
  EXPECT_EQ(nr, 0);
  EXPECT_EQ(nm, static_cast<int>(targets.size()));
  ASSERT_TRUE(apply_loras(runtime, uses, LoraApply::kRuntime, true, &nm, &nr).ok());
  EXPECT_EQ(nr, static_cast<int>(targets.size()));
  auto a = dit_forward(merged), b = dit_forward(runtime), c = dit_forward(base);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_LE(max_rel_err(values(*b), values(*a)), 1e-5);
  EXPECT_GT(max_rel_err(values(*c), values(*a)), 1e-2);  // the LoRAs do change the output
}

// Every 2-D weight of the model quantized to Q8_ROW (int8 per row, scale per row) in memory.
void quantize_all_q8(Flux2Transformer& m) {
  for (const auto& r : m.tensor_table()) {
    if (!r.weight || r.weight->empty() || r.weight->shape.size() != 2) continue;
    Weight& w = *r.weight;
    const std::vector<float> v = weight_to_vector(w);
    const int64_t R = w.rows(), C = w.cols();
    auto q = std::make_shared<std::vector<int8_t>>(static_cast<size_t>(R * C));
    auto sc = std::make_shared<std::vector<float>>(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) (*sc)[i] = quantize_row_q8(v.data() + i * C, C, q->data() + i * C);
    Weight o;
    o.name = w.name;
    o.dtype = DType::kQ8Row;
    o.shape = w.shape;
    o.data = q->data();
    o.nbytes = q->size();
    o.scales = sc->data();
    o.scale_dtype = DType::kF32;
    o.owner = std::make_shared<std::pair<decltype(q), decltype(sc)>>(q, sc);
    ASSERT_TRUE(validate_weight(o).ok()) << w.name;
    w = o;
  }
}

// A quantized base (Q8_ROW): the run-time terms beside the quantized GEMM equal the merged LoRA
// on the dequantized weights, to float32 rounding on the exact path and within the W8A8
// activation quantization on the fast one; merging into it is refused.
TEST(Lora, RuntimeOnQuantizedEqualsDequantizeMergeRun) {
  auto quant = must_load_dit(tiny_dit_dir());
  quantize_all_q8(quant);
  const auto targets = lora_targets(quant);
  std::vector<LoraUse> uses{{std::make_shared<const LoraFile>(must_parse("lora_diffusers.safetensors", targets)), 1.0f}};
  auto forced = quant;
  const Status refused = apply_loras(forced, uses, LoraApply::kMerge);
  EXPECT_EQ(refused.code(), Code::kUnsupported);
  EXPECT_NE(refused.message().find("stored as Q8_ROW"), std::string::npos) << refused.to_string();
  auto deq = quant;
  dequantize_all(deq);
  int nm = 0, nr = 0;
  ASSERT_TRUE(apply_loras(quant, uses, LoraApply::kAuto, true, &nm, &nr).ok());
  EXPECT_EQ(nr, static_cast<int>(targets.size()));  // auto: run time on every quantized weight
  EXPECT_EQ(nm, 0);
  ASSERT_TRUE(apply_loras(deq, uses, LoraApply::kMerge, true).ok());
  auto b = dit_forward(deq, kernels::Precision::kFp32);
  ASSERT_TRUE(b.ok());
  for (auto p : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
    auto a = dit_forward(quant, p);
    ASSERT_TRUE(a.ok());
    const double e = max_rel_err(values(*a), values(*b));
    std::printf("[ info ] q8 run-time vs dequantize-merge-run (%s): %.3g\n",
                p == kernels::Precision::kFp32 ? "fp32" : "fast", e);
    EXPECT_LE(e, p == kernels::Precision::kFp32 ? 1e-5 : 2e-2);
  }
}

// The memory plan's LoRA bytes: the factors, plus a copy of each weight merged (float32 on the
// exact path).
TEST(Lora, MemoryCountsFactorsAndMergedCopies) {
  auto dit = must_load_dit(tiny_dit_dir());
  const auto targets = lora_targets(dit);
  const auto file = std::make_shared<const LoraFile>(must_parse("lora_diffusers.safetensors", targets));
  const std::vector<LoraUse> uses{{file, 1.0f}};
  uint64_t copies = 0;
  for (const LoraTarget& t : targets) copies += static_cast<uint64_t>(shape_numel(t.shape)) * 4;
  EXPECT_EQ(lora_memory(dit, uses, LoraApply::kRuntime, true), file->bytes());
  EXPECT_EQ(lora_memory(dit, uses, LoraApply::kMerge, true), file->bytes() + copies);
  EXPECT_EQ(lora_memory(dit, uses, LoraApply::kAuto, false), file->bytes() + copies / 2);  // bf16 copies
}

// PEFT's merge arithmetic on a bf16 weight: ΔW in float32, rounded to bf16, added in bf16.
TEST(Lora, MergeRoundsLikePeftOnBf16) {
  std::vector<uint16_t> wb = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f), f32_to_bf16(0.5f), f32_to_bf16(3.0f)};
  Weight w;
  w.name = "w";
  w.dtype = DType::kBF16;
  w.shape = {2, 2};
  w.data = wb.data();
  w.nbytes = 8;
  LoraDelta d;
  d.rows = 2, d.cols = 2, d.rank = 1, d.scale = 2.0;
  d.down = {0.001f, 0.3f};
  d.up = {1.0f, -0.7f};
  auto m = merge_lora_deltas(w, {{&d, 0.5f}}, DType::kBF16);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto got = weight_to_vector(*m);
  const float base[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const float delta = round_bf16(d.up[i] * d.down[j] * 1.0f);
      EXPECT_EQ(got[i * 2 + j], round_bf16(base[i * 2 + j] + delta)) << i << "," << j;
    }
}

// ---- bad files: one line naming the file and the key

class LoraFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dit_ = std::make_unique<Flux2Transformer>(must_load_dit(tiny_dit_dir()));
    targets_ = lora_targets(*dit_);
    dir_ = testing::make_temp_dir("lora_bad");
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Writes the tensors (float32, given shapes, filled with 0.01) and parses the file.
  Status parse(const std::vector<std::pair<std::string, Shape>>& t,
               const std::map<std::string, std::string>& meta = {},
               LoraComponent c = LoraComponent::kTransformer, LoraFile* out = nullptr) {
    std::vector<std::vector<float>> data;
    std::vector<TensorToWrite> w;
    for (const auto& [n, s] : t) data.emplace_back(static_cast<size_t>(shape_numel(s)), 0.01f);
    for (size_t i = 0; i < t.size(); ++i) w.push_back({t[i].first, DType::kF32, t[i].second, data[i].data()});
    const fs::path p = dir_ / "x.safetensors";
    EXPECT_TRUE(write_safetensors(p, w, meta).ok());
    auto f = load_lora(p, targets_, c);
    if (f.ok() && out) *out = std::move(f).value();
    return f.status();
  }
  std::unique_ptr<Flux2Transformer> dit_;
  std::vector<LoraTarget> targets_;
  fs::path dir_;
};

TEST_F(LoraFiles, EachErrorNamesTheProblem) {
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  struct Bad {
    std::vector<std::pair<std::string, Shape>> t;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {{{q + ".lora_A.weight", {4, 32}}, {q + ".lora_B.weight", {32, 4}}, {"something.else", {1}}}, "something.else"},
      {{{q + ".lora_A.weight", {4, 32}}}, "without its pair"},
      {{{q + ".lora_A.weight", {4, 32}}, {q + ".lora_B.weight", {32, 3}}}, "rank mismatch"},
      {{{q + ".lora_A.weight", {4, 31}}, {q + ".lora_B.weight", {32, 4}}}, "needs [32, 32]"},
      {{{"transformer.transformer_blocks.9.attn.to_q.lora_A.weight", {4, 32}},
        {"transformer.transformer_blocks.9.attn.to_q.lora_B.weight", {32, 4}}},
       "transformer.transformer_blocks.9.attn.to_q"},
      {{{q + ".lora_A.weight", {4, 32}}, {q + ".lora_B.weight", {32, 4}}, {q + ".dora_scale", {1, 32}}}, "DoRA"},
      {{{q + ".lora_A.weight", {4, 32}}, {q + ".lora_B.weight", {32, 4}}, {q + ".alpha", {2}}}, "one number"},
      {{{q + ".lora_A.weight", {4, 32}}, {q + ".lora_B.weight", {32, 4}}, {q + ".lokr_w1", {4, 4}}}, "mixes"},
      {{{q + ".alpha", {}}}, "only an alpha"},
      {{{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", {4, 32}},
        {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {64, 4}}},
       "need [96, 32]"},
      {{{"diffusion_model.single_blocks.0.linear1.lokr_w1", {4, 4}},
        {"diffusion_model.single_blocks.0.linear1.lokr_w2", {4, 4}}},
       "kron"},
      {{}, "no LoRA tensors"},
  };
  for (const Bad& b : cases) {
    const Status s = parse(b.t);
    EXPECT_FALSE(s.ok()) << b.needle;
    EXPECT_NE(s.message().find(b.needle), std::string::npos) << s.to_string();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.to_string();
  }
  // A header whose PEFT settings are not JSON.
  const Status s = parse({{q + ".lora_A.weight", {4, 32}}, {q + ".lora_B.weight", {32, 4}}},
                         {{"lora_adapter_metadata", "{not json"}});
  EXPECT_NE(s.message().find("lora_adapter_metadata"), std::string::npos) << s.to_string();
}

// Prefixes and spellings of the trainers: each resolves to the model's weight; modules of the
// other component are left for its own load.
TEST_F(LoraFiles, PrefixesAndAliasesResolve) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"base_model.model.double_blocks.1.txt_attn.proj", "transformer_blocks.1.attn.to_add_out.weight"},
      {"model.diffusion_model.single_blocks.0.linear2", "single_transformer_blocks.0.attn.to_out.weight"},
      {"diffusion_model.sformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_q.weight"},
      {"diffusion_model.double_stream_modulation_img.lin", "double_stream_modulation_img.linear.weight"},
      {"transformer_blocks.0.ff_context.linear_out", "transformer_blocks.0.ff_context.linear_out.weight"},
      {"lora_unet_time_in_in_layer", "time_guidance_embed.timestep_embedder.linear_1.weight"},
      {"lora_unet_single_transformer_blocks_1_attn_to_out", "single_transformer_blocks.1.attn.to_out.weight"},
      {"lycoris_transformer_blocks_0_attn_to_out_0", "transformer_blocks.0.attn.to_out.0.weight"},
  };
  for (const auto& [module, target] : cases) {
    const Shape* shape = nullptr;
    for (const LoraTarget& t : targets_)
      if (t.name == target) shape = &t.shape;
    ASSERT_NE(shape, nullptr) << target;
    const bool kohya = module.starts_with("lora_unet_");
    LoraFile f;
    const Status s = parse({{module + (kohya ? ".lora_down.weight" : ".lora_A.weight"), {2, (*shape)[1]}},
                            {module + (kohya ? ".lora_up.weight" : ".lora_B.weight"), {(*shape)[0], 2}},
                            {"text_encoder.model.layers.0.self_attn.q_proj.lora_A.weight", {2, 7}}},
                           {}, LoraComponent::kTransformer, &f);
    ASSERT_TRUE(s.ok()) << module << ": " << s.to_string();
    ASSERT_EQ(f.deltas.size(), 1u) << module;
    EXPECT_EQ(f.deltas[0].target, target) << module;
  }
}

TEST_F(LoraFiles, AModelLoadFailsOnABadLora) {
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  ASSERT_FALSE(parse({{q + ".lora_A.weight", {4, 32}}}).ok());
  LoadOptions lo;
  lo.threads = 1;
  lo.memory = MemoryPolicy::kResident;
  lo.loras.push_back({(dir_ / "x.safetensors").string(), 1.0f});
  auto m = Model::open(testing::tiny(), lo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("x.safetensors"), std::string::npos) << m.status().to_string();
  lo.loras = {{(dir_ / "missing.safetensors").string(), 1.0f}};
  EXPECT_EQ(Model::open(testing::tiny(), lo).status().code(), Code::kNotFound);
  lo.loras = {{(dir_ / "x.safetensors").string(), std::nanf("")}};
  EXPECT_EQ(Model::open(testing::tiny(), lo).status().code(), Code::kInvalidArgument);
}

// The C API's lora_paths / lora_scales / lora_mode reach LoadOptions: a resident open reads the
// files (a bad mode or a missing file fails with its code).
TEST(Lora, CApiLoadParams) {
  const std::string good = (lora_dir() / "lora_diffusers.safetensors").string();
  const char* paths[] = {good.c_str()};
  const float scales[] = {0.5f};
  klein_load_params lp = klein_load_default_params();
  EXPECT_EQ(lp.num_loras, 0);
  lp.threads = 1;
  lp.memory = KLEIN_MEMORY_RESIDENT;
  lp.lora_paths = paths;
  lp.lora_scales = scales;
  lp.num_loras = 1;
  lp.lora_mode = KLEIN_LORA_RUNTIME;
  klein_model* model = nullptr;
  klein_error err;
  ASSERT_EQ(klein_model_open(testing::tiny().c_str(), &lp, &model, &err), KLEIN_OK) << err.message;
  klein_model_free(model);
  lp.lora_mode = 7;
  EXPECT_EQ(klein_model_open(testing::tiny().c_str(), &lp, &model, &err), KLEIN_INVALID_ARGUMENT);
  lp.lora_mode = KLEIN_LORA_AUTO;
  const char* missing[] = {"/nonexistent/lora.safetensors"};
  lp.lora_paths = missing;
  EXPECT_EQ(klein_model_open(testing::tiny().c_str(), &lp, &model, &err), KLEIN_NOT_FOUND);
  EXPECT_NE(std::string(err.message).find("/nonexistent/lora.safetensors"), std::string::npos) << err.message;
}

// `klein generate --lora FILE:SCALE --lora-mode runtime` gives diffusers' LoRA latents; a
// missing file or a bad scale is one line naming it and a non-zero exit.
TEST(Lora, Cli) {
  const fs::path dir = testing::make_temp_dir("lora_cli");
  const std::string lora = (lora_dir() / "lora_kohya.safetensors").string();
  auto r = testing::run_cli("generate --model " + testing::tiny() +
                            " -p 'A cat holding a sign that says hello world' -W 64 -H 64 --steps 4 --seed 42 "
                            "--precision fp32 --threads 2 --quiet --lora '" + lora + ":1' --lora-mode runtime -o '" +
                            (dir / "a.png").string() + "' --dump '" + dir.string() + "' --dump-filter latents_final");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LE(max_rel_err(must_read_f32(dir / "latents_final.npy"), must_read_f32(lora_dir() / "kohya_s1" / "latents_final.npy")),
            1e-5);
  r = testing::run_cli("generate --model " + testing::tiny() + " -p x -W 64 -H 64 --steps 1 --quiet --lora '" +
                       (dir / "missing.safetensors").string() + "' -o '" + (dir / "b.png").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("missing.safetensors"), std::string::npos) << r.err;
  r = testing::run_cli("generate --model " + testing::tiny() + " -p x --quiet --lora '" + lora + ":1e9' -o '" +
                       (dir / "c.png").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--lora"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "b.png"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace klein

namespace klein {

// The one-call klein::generate takes LoRAs too: the same picture as Model::open with them.
TEST(LoraOneShot, GenerateOptionsCarryLoras) {
  const fs::path dump = testing::make_temp_dir("lora_oneshot");
  GenerateOptions o;
  o.model_dir = testing::tiny();
  o.prompt = "A cat holding a sign that says hello world";
  o.width = o.height = 64;
  o.steps = 4;
  o.seed = 42;
  o.threads = 2;
  o.precision = Precision::kFp32;
  o.loras.push_back({(lora_dir() / "lora_diffusers.safetensors").string(), 0.5f});
  o.dump_dir = dump.string();
  o.dump_filter = "latents_final";
  auto r = generate(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_LE(max_rel_err(must_read_f32(dump / "latents_final.npy"),
                        must_read_f32(lora_dir() / "diffusers_s05" / "latents_final.npy")),
            1e-5);
  o.loras = {{(lora_dir() / "missing.safetensors").string(), 1.0f}};
  EXPECT_EQ(generate(o).status().code(), Code::kNotFound);
  fs::remove_all(dump);
}

}  // namespace klein
