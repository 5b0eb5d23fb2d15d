// klein quantize: the q8 / q4 recipes, the folder it writes (loads without conversion, every
// quantized weight within its format's error, kept tensors byte-identical, generates), its
// errors, and klein compare's metrics on images with known values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtype.h"
#include "core/quantize.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"
#include "klein/klein.h"
#include "corrupt.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;

namespace {

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

fs::path quantized_tiny(const std::string& type) {
  static std::map<std::string, fs::path> made;
  if (made.count(type)) return made[type];
  const fs::path out = klein::testing::make_temp_dir("quant_" + type) / "model";
  QuantizeOptions o;
  o.model = klein::testing::tiny_model_dir().string();
  o.output = out.string();
  o.type = type;
  Status st = quantize_model(o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return made[type] = out;
}

// The largest |w - dequant(w)| the format allows for row r (a bound, per row or group).
double allowed_error(const Weight& w, int64_t r, int64_t c) {
  if (w.dtype == DType::kQ8Row) return 0.5001 * scale_at(w.scales, w.scale_dtype, r) + 1e-30;
  const int64_t g = r * w.blocks_per_row() + c / 64;
  const double s = std::fabs(scale_at(w.scales, w.scale_dtype, g)), b = std::fabs(scale_at(w.offsets, w.scale_dtype, g));
  // One step (MLX's edge/q0 rescaling: see QuantizeRecipe.Q4GroupMatchesMlxDefinition), plus the
  // bf16 rounding of the stored scale (×15) and bias (MLX stores them bf16).
  return 1.0001 * s + 15 * s / 256 + b / 256 + 1e-30;
}

void check_component(const fs::path& orig_dir, const fs::path& quant_dir, DType qtype, int* quantized) {
  auto a = SafetensorsSource::open(orig_dir);
  auto b = SafetensorsSource::open(quant_dir);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->names(), (*b)->names());  // companions are hidden: the same logical tensors
  for (const std::string& n : (*a)->names()) {
    auto wa = (*a)->get(n);
    auto wb = (*b)->get(n);
    ASSERT_TRUE(wa.ok() && wb.ok()) << n;
    if (wb->dtype == qtype) {
      ++*quantized;
      ASSERT_EQ(wa->shape, wb->shape) << n;
      std::vector<float> ra(wa->cols()), rb(wb->cols());
      for (int64_t r = 0; r < wa->rows(); ++r) {
        weight_row_to_f32(*wa, r, ra.data());
        weight_row_to_f32(*wb, r, rb.data());
        for (int64_t c = 0; c < wa->cols(); ++c)
          ASSERT_LE(std::fabs(ra[c] - rb[c]), allowed_error(*wb, r, c)) << n << " [" << r << ", " << c << "]";
      }
    } else {
      ASSERT_EQ(wa->dtype, wb->dtype) << n;
      ASSERT_EQ(wa->shape, wb->shape) << n;
      ASSERT_EQ(wa->nbytes, wb->nbytes) << n;
      EXPECT_EQ(std::memcmp(wa->data, wb->data, wa->nbytes), 0) << n << " kept but not byte-identical";
    }
  }
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

}  // namespace

// [a; b] is one Weight only where b's rows, scales and offsets start exactly where a's end, and
// both have one format, column count and owner; rows read through it are a's then b's.
TEST(Weight, StackedWithNeedsAdjacentRowsScalesAndOffsets) {
  constexpr int64_t R = 3, C = 128, G = C / 64;
  std::vector<uint8_t> nib(2 * R * C / 2);
  std::vector<uint16_t> sc(2 * R * G), of(2 * R * G);
  for (size_t i = 0; i < nib.size(); ++i) nib[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = f32_to_bf16(0.01f * static_cast<float>(i + 1));
  for (size_t i = 0; i < of.size(); ++i) of[i] = f32_to_bf16(-0.5f + 0.03f * static_cast<float>(i));
  auto q4 = [&](int64_t r0, const char* name) {
    Weight w;
    w.name = name;
    w.dtype = DType::kQ4G64;
    w.shape = {R, C};
    w.data = nib.data() + r0 * C / 2;
    w.nbytes = R * C / 2;
    w.scales = sc.data() + r0 * G;
    w.offsets = of.data() + r0 * G;
    w.scale_dtype = DType::kBF16;
    return w;
  };
  const Weight a = q4(0, "gate"), b = q4(R, "up");
  ASSERT_TRUE(validate_weight(a).ok() && validate_weight(b).ok());
  auto s = a.stacked_with(b);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->shape, (Shape{2 * R, C}));
  EXPECT_TRUE(validate_weight(*s).ok());
  std::vector<float> x(C), y(C);
  for (int64_t r = 0; r < 2 * R; ++r) {
    weight_row_to_f32(r < R ? a : b, r % R, x.data());
    weight_row_to_f32(*s, r, y.data());
    ASSERT_EQ(x, y) << "row " << r;
  }
  EXPECT_FALSE(b.stacked_with(a).has_value());  // the order matters
  Weight t = b;
  t.data = nib.data() + R * C / 2 + 1;  // a gap in the data
  EXPECT_FALSE(a.stacked_with(t).has_value());
  t = b, t.scales = sc.data() + R * G + 1;  // a gap in the scales
  EXPECT_FALSE(a.stacked_with(t).has_value());
  t = b, t.offsets = nullptr;  // offsets on one side only
  EXPECT_FALSE(a.stacked_with(t).has_value());
  t = b, t.offsets = of.data();  // offsets not after a's
  EXPECT_FALSE(a.stacked_with(t).has_value());
  t = b, t.scale_dtype = DType::kF16;
  EXPECT_FALSE(a.stacked_with(t).has_value());
  t = b, t.owner = std::make_shared<int>(0);  // storage kept alive by different owners
  EXPECT_FALSE(a.stacked_with(t).has_value());
  t = b, t.layout = Layout::kPacked;
  EXPECT_FALSE(a.stacked_with(t).has_value());
  EXPECT_FALSE(a.stacked_with(Weight()).has_value());
  // Plain formats: rows only; another column count is never stacked.
  std::vector<float> f(2 * R * C);
  Weight p;
  p.dtype = DType::kF32;
  p.shape = {R, C};
  p.data = f.data();
  p.nbytes = R * C * 4;
  Weight p2 = p;
  p2.data = f.data() + R * C;
  EXPECT_TRUE(p.stacked_with(p2).has_value());
  p2.shape = {R * 2, C / 2};
  EXPECT_FALSE(p.stacked_with(p2).has_value());
}

TEST(QuantizeRecipe, ScalesToF32EqualsScaleAtForEveryScaleType) {
  // The range conversion the AMX kernels use equals the per-element one, at an offset, for the
  // three stored scale types (bf16 as MLX stores them, f16, f32).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3, 3);
  std::vector<float> f32(40);
  std::vector<uint16_t> b16(40), h16(40);
  for (size_t i = 0; i < f32.size(); ++i) {
    f32[i] = d(rng);
    b16[i] = f32_to_bf16(f32[i]);
    h16[i] = f32_to_f16(f32[i]);
  }
  for (auto [p, t] : {std::pair<const void*, DType>{f32.data(), DType::kF32}, {b16.data(), DType::kBF16},
                      {h16.data(), DType::kF16}}) {
    std::vector<float> out(29, -1.0f);
    scales_to_f32(p, t, 7, 29, out.data());
    for (int64_t i = 0; i < 29; ++i) EXPECT_EQ(out[i], scale_at(p, t, 7 + i)) << dtype_name(t) << " " << i;
    EXPECT_NE(out[0], scale_at(p, t, 6));  // the offset is applied
  }
}

TEST(QuantizeRecipe, Q8RowIsSymmetricRoundHalfEven) {
  const float w[4] = {1.27f, -0.5f, 0.005f, 0.015f};
  int8_t qv[4];
  const float s = quantize_row_q8(w, 4, qv);
  EXPECT_FLOAT_EQ(s, 1.27f / 127.0f);
  EXPECT_EQ(qv[0], 127);
  EXPECT_EQ(qv[1], static_cast<int8_t>(std::nearbyint(-0.5f / s)));
  EXPECT_EQ(qv[2], static_cast<int8_t>(std::nearbyint(0.005f / s)));  // 0.5 → 0 (half to even)
  const float z[3] = {0, 0, 0};
  EXPECT_EQ(quantize_row_q8(z, 3, qv), 0.0f);
  EXPECT_EQ(qv[0], 0);
}

TEST(QuantizeRecipe, Q4GroupMatchesMlxDefinition) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.1f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    float w[64];
    for (float& v : w) v = round_bf16(nd(rng));
    uint8_t packed[32];
    float s, b;
    quantize_group_q4(w, packed, &s, &b);
    float lo = w[0], hi = w[0];
    for (float v : w) lo = std::min(lo, v), hi = std::max(hi, v);
    // The edge of larger magnitude is exact: bias (or bias + 15·scale) reproduces it.
    const float edge = std::fabs(lo) > std::fabs(hi) ? lo : hi;
    EXPECT_EQ(b, edge);
    for (int k = 0; k < 64; ++k) {
      const int qk = (packed[k / 2] >> (4 * (k % 2))) & 0xf;
      // Not half a step: MLX rounds edge / scale to an integer q0 and rescales to edge / q0, so the
      // far end of the range can fall short of the other extreme by up to 15/16 of a step.
      EXPECT_LE(std::fabs(b + s * qk - w[k]), std::fabs(s) * 1.0001f) << k;
    }
  }
}

TEST(Quantize, Q8AndQ4FoldersLoadWithinTheFormatErrorAndKeepTheRestByteIdentical) {
  for (const auto& [type, dt] : {std::pair{"q8", DType::kQ8Row}, std::pair{"q4", DType::kQ4G64}}) {
    const fs::path out = quantized_tiny(type);
    ASSERT_TRUE(fs::exists(out / "model_index.json"));
    for (const char* f : {"tokenizer/tokenizer.json", "scheduler/scheduler_config.json", "vae/config.json",
                          "vae/diffusion_pytorch_model.safetensors", "text_encoder/generation_config.json"})
      EXPECT_TRUE(fs::exists(out / f)) << f;
    int n = 0;
    check_component(klein::testing::tiny_model_dir() / "transformer", out / "transformer", dt, &n);
    check_component(klein::testing::tiny_model_dir() / "text_encoder", out / "text_encoder", dt, &n);
    check_component(klein::testing::tiny_model_dir() / "vae", out / "vae", dt, &n);
    EXPECT_GT(n, 0) << type;
    const auto cfg = read_json(out / "transformer" / "config.json");
    ASSERT_TRUE(cfg.contains("quantization"));
    EXPECT_EQ(cfg["quantization"]["type"], type);
    const auto kept = cfg["quantization"]["kept"].get<std::vector<std::string>>();
    for (const char* k : {"x_embedder.weight", "proj_out.weight", "norm_out.linear.weight",
                          "double_stream_modulation_img.linear.weight", "time_guidance_embed.timestep_embedder.linear_1.weight"})
      EXPECT_NE(std::find(kept.begin(), kept.end(), k), kept.end()) << type << " " << k;
    const auto te = read_json(out / "text_encoder" / "config.json")["quantization"]["kept"].get<std::vector<std::string>>();
    EXPECT_NE(std::find(te.begin(), te.end(), "model.embed_tokens.weight"), te.end());
  }
  // q8 quantizes every other Linear of the tiny model; q4 only those with 64-multiple inputs.
  auto src = SafetensorsSource::open(quantized_tiny("q8") / "text_encoder");
  ASSERT_TRUE(src.ok());
  EXPECT_EQ((*src)->get("model.layers.0.mlp.down_proj.weight")->dtype, DType::kQ8Row);
  // A row view of a Q8_ROW weight (one scale per row, not per element) dequantises to exactly
  // the same rows: the transformer's fused projection is split this way.
  auto w = (*src)->get("model.layers.0.mlp.down_proj.weight");
  ASSERT_TRUE(w.ok());
  const int64_t r0 = 3, r1 = w->rows() - 2, C = w->cols();
  auto v = w->row_range(r0, r1);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  std::vector<float> a(C), b(C);
  for (int64_t r = r0; r < r1; ++r) {
    weight_row_to_f32(*w, r, a.data());
    weight_row_to_f32(*v, r - r0, b.data());
    ASSERT_EQ(a, b) << "row " << r;
  }
  EXPECT_TRUE(validate_weight(*v).ok());
}

TEST(Quantize, QuantizedFoldersGenerateInBothPrecisions) {
  for (const char* type : {"q8", "q4"})
    for (Precision p : {Precision::kFp32, Precision::kFast}) {
      LoadOptions lo;
      lo.precision = p;
      auto m = Model::open(quantized_tiny(type).string(), lo);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      GenerateRequest g;
      g.prompt = "a cat";
      g.width = 48;
      g.height = 32;
      g.steps = 2;
      g.seed = 42;
      auto r = (*m)->generate(g);
      ASSERT_TRUE(r.ok()) << type << ": " << r.status().to_string();  // generate refuses non-finite images
      EXPECT_EQ(r->image.width, 48);
      EXPECT_EQ(r->image.height, 32);
      EXPECT_EQ(r->image.rgb.size(), 48u * 32u * 3u);
    }
}

TEST(Quantize, KeepGlobsAreKeptAndBadOptionsGiveOneClearError) {
  const fs::path d = klein::testing::make_temp_dir("quant_opts");
  QuantizeOptions o;
  o.model = klein::testing::tiny_model_dir().string();
  o.output = (d / "k").string();
  o.type = "q8";
  o.keep = {"transformer_blocks.0.*"};
  ASSERT_TRUE(quantize_model(o).ok());
  auto src = SafetensorsSource::open(d / "k" / "transformer");
  ASSERT_TRUE(src.ok());
  EXPECT_EQ((*src)->get("transformer_blocks.0.attn.to_q.weight")->dtype, DType::kBF16);
  EXPECT_EQ((*src)->get("transformer_blocks.1.attn.to_q.weight")->dtype, DType::kQ8Row);

  auto expect_error = [&](QuantizeOptions bad, const std::string& needle) {
    Status st = quantize_model(bad);
    ASSERT_FALSE(st.ok()) << needle;
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
  };
  QuantizeOptions bad = o;
  bad.output = (d / "x").string();
  bad.keep = {};
  bad.type = "q5";
  expect_error(bad, "--type 'q5'");
  bad.type = "q4";
  bad.keep = {"no_such_layer.*"};
  expect_error(bad, "--keep 'no_such_layer.*'");
  bad.keep = {"[abc"};
  expect_error(bad, "--keep '[abc'");
  bad.keep = {};
  bad.output = o.model;
  expect_error(bad, "is the input folder");
  bad.output = o.model + "/transformer/q";
  expect_error(bad, "inside the input folder");
  bad.output = (d / "k").string();
  expect_error(bad, "already exists");
  EXPECT_FALSE(fs::exists(d / "x"));

  auto r = klein::testing::run_cli("quantize --model " + q(o.model) + " --type int3 -o " + q(d / "y"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--type 'int3'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "y"));
}

// A q8 or q4 folder as input: its integer weights would be copied under a config naming the new
// scheme, or re-quantized after one rounding already. Refused, naming the component and a
// tensor; a bf16 folder (float weights) quantizes as any other.
TEST(Quantize, AnAlreadyQuantizedFolderIsRefused) {
  const fs::path d = klein::testing::make_temp_dir("quant_twice");
  for (const auto& [from, to] : {std::pair{"q8", "q4"}, std::pair{"q4", "q8"}, std::pair{"q8", "bf16"}}) {
    QuantizeOptions o;
    o.model = quantized_tiny(from).string();
    o.output = (d / (std::string(from) + "_to_" + to)).string();
    o.type = to;
    Status st = quantize_model(o);
    ASSERT_FALSE(st.ok()) << from << " -> " << to;
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
    EXPECT_NE(st.message().find("is already quantized"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(from == std::string("q8") ? "is I8" : "is U32"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
    EXPECT_FALSE(fs::exists(o.output));
  }
  for (const auto& e : fs::directory_iterator(d)) ADD_FAILURE() << "left behind: " << e.path();
  QuantizeOptions o;
  o.model = klein::testing::tiny_model_dir().string();
  o.output = (d / "bf16").string();
  o.type = "bf16";
  ASSERT_TRUE(quantize_model(o).ok());
  o.model = o.output;
  o.output = (d / "bf16_to_q8").string();
  o.type = "q8";
  Status st = quantize_model(o);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto src = SafetensorsSource::open(d / "bf16_to_q8" / "transformer");
  ASSERT_TRUE(src.ok());
  EXPECT_EQ((*src)->get("transformer_blocks.1.attn.to_q.weight")->dtype, DType::kQ8Row);
  EXPECT_EQ(read_json(d / "bf16_to_q8" / "transformer" / "config.json")["quantization"]["type"], "q8");
}

// A sharded component (as the real text encoder's model-0000N-of-0000M files): each output shard
// holds the quantized tensors of its input shard with their companions, and the index maps every
// output tensor to its file. The tensors are the single file's bytes, the image its bits.
TEST(Quantize, ShardedInputKeepsItsIndexWithTheCompanions) {
  const fs::path d = klein::testing::make_temp_dir("quant_shards");
  fs::copy(klein::testing::tiny_model_dir(), d / "in", fs::copy_options::recursive);
  const fs::path tdir = d / "in" / "transformer";
  {
    auto st = WeightStore::open(klein::testing::tiny_model_dir() / "transformer");
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    const std::vector<std::string> names = st->names();
    std::vector<TensorToWrite> shard[2];
    nlohmann::json map = nlohmann::json::object();
    uint64_t total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const TensorEntry* e = st->entry(names[i]);
      const int k = i < names.size() / 2 ? 0 : 1;
      shard[k].push_back({names[i], e->dtype, e->shape, e->data});
      map[names[i]] = "diffusion_pytorch_model-0000" + std::to_string(k + 1) + "-of-00002.safetensors";
      total += e->nbytes;
    }
    for (int k = 0; k < 2; ++k) {
      Status w = write_safetensors(tdir / ("diffusion_pytorch_model-0000" + std::to_string(k + 1) + "-of-00002.safetensors"),
                                   shard[k]);
      ASSERT_TRUE(w.ok()) << w.to_string();
    }
    std::ofstream(tdir / "diffusion_pytorch_model.safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2);
  }
  fs::remove(tdir / "diffusion_pytorch_model.safetensors");
  QuantizeOptions o;
  o.model = (d / "in").string();
  o.output = (d / "out").string();
  o.type = "q8";
  Status st = quantize_model(o);
  ASSERT_TRUE(st.ok()) << st.to_string();

  const fs::path qdir = d / "out" / "transformer";
  ASSERT_FALSE(fs::exists(qdir / "diffusion_pytorch_model.safetensors"));
  const auto idx = read_json(qdir / "diffusion_pytorch_model.safetensors.index.json");
  auto whole = WeightStore::open(quantized_tiny("q8") / "transformer");
  ASSERT_TRUE(whole.ok());
  uint64_t total = 0;
  size_t mapped = 0;
  for (const auto& [name, file] : idx["weight_map"].items()) {
    auto shard = WeightStore::open(qdir / file.get<std::string>());
    ASSERT_TRUE(shard.ok()) << file;
    const TensorEntry* e = shard->entry(name);
    ASSERT_NE(e, nullptr) << name << " is not in " << file;
    const TensorEntry* w = whole->entry(name);
    ASSERT_NE(w, nullptr) << name;
    ASSERT_EQ(e->nbytes, w->nbytes) << name;
    EXPECT_EQ(std::memcmp(e->data, w->data, e->nbytes), 0) << name;
    total += e->nbytes;
    ++mapped;
  }
  EXPECT_EQ(mapped, whole->names().size());  // every tensor, companions included
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(idx["weight_map"]["transformer_blocks.1.attn.to_q.weight_scale"],
            idx["weight_map"]["transformer_blocks.1.attn.to_q.weight"]);

  GenerateRequest g;
  g.prompt = "a cat";
  g.width = g.height = 32;
  g.steps = 2;
  g.seed = 7;
  std::vector<uint8_t> rgb[2];
  for (int k = 0; k < 2; ++k) {
    auto m = Model::open(k ? qdir.parent_path().string() : quantized_tiny("q8").string());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto r = (*m)->generate(g);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    rgb[k] = r->image.rgb;
  }
  EXPECT_EQ(rgb[0], rgb[1]);
}

TEST(Quantize, AFailureLeavesNothingBehind) {
  // A transformer file truncated after its header: the copy of the other files succeeds, the
  // quantization of the transformer fails; neither OUT nor OUT.tmp-* may remain.
  const fs::path d = klein::testing::make_temp_dir("quant_fail");
  fs::copy(klein::testing::tiny_model_dir(), d / "in", fs::copy_options::recursive);
  const fs::path tf = d / "in" / "transformer" / "diffusion_pytorch_model.safetensors";
  fs::resize_file(tf, fs::file_size(tf) - 64);
  QuantizeOptions o;
  o.model = (d / "in").string();
  o.output = (d / "out").string();
  o.type = "q8";
  Status st = quantize_model(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("diffusion_pytorch_model.safetensors"), std::string::npos) << st.message();
  for (const auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().filename(), "in") << e.path();
}

// A Hugging Face snapshot is a folder of links into a blob store elsewhere: the copy follows them
// but keeps the folder's own layout, and writes nothing outside OUT (it once resolved each link's
// path first, so the copies went beside the blobs).
TEST(Quantize, LinkedFilesAreCopiedUnderTheOutput) {
  const fs::path d = klein::testing::make_temp_dir("quant_links");
  fs::copy(klein::testing::tiny_model_dir(), d / "blobs", fs::copy_options::recursive);
  size_t blob_files = 0;
  for (const auto& e : fs::recursive_directory_iterator(d / "blobs")) {
    const fs::path rel = e.path().lexically_relative(d / "blobs");
    if (e.is_directory()) {
      fs::create_directories(d / "snapshot" / rel);
    } else {
      fs::create_symlink(e.path(), d / "snapshot" / rel);
      ++blob_files;
    }
  }
  QuantizeOptions o;
  o.model = (d / "snapshot").string() + "/";
  o.output = (d / "out").string();
  o.type = "q8";
  const Status st = quantize_model(o);
  ASSERT_TRUE(st.ok()) << st.to_string();
  size_t after = 0;
  for (const auto& e : fs::recursive_directory_iterator(d / "blobs")) after += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(after, blob_files) << "a file was written into the blob store";
  for (const char* f : {"model_index.json", "scheduler/scheduler_config.json", "tokenizer/tokenizer.json",
                        "vae/diffusion_pytorch_model.safetensors", "transformer/config.json",
                        "text_encoder/model.safetensors"}) {
    EXPECT_TRUE(fs::is_regular_file(d / "out" / f)) << f;
    EXPECT_FALSE(fs::is_symlink(d / "out" / f)) << f;
  }
  EXPECT_EQ(klein::testing::slurp_file(d / "out" / "model_index.json"),
            klein::testing::slurp_file(d / "blobs" / "model_index.json"));
}

TEST(Quantize, CliWritesAFolderThatGenerates) {
  const fs::path d = klein::testing::make_temp_dir("quant_cli");
  auto r = klein::testing::run_cli("quantize -q --model " + q(klein::testing::tiny_model_dir()) + " --type bf16 -o " +
                                   q(d / "m"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = klein::testing::run_cli("generate -q --model " + q(d / "m") + " -p 'a cat' -W 32 -H 32 --steps 1 -o " +
                              q(d / "a.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = klein::testing::run_cli("compare " + q(d / "a.png") + " " + q(d / "a.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("psnr         inf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ssim         1.000000"), std::string::npos) << r.out;
}

// generate / encode on a q8 or q4 folder under --precision fp32 say once that the weights are
// dequantized to float32 and that fast runs them on the int8 kernels; not under the default
// precision (fast), not with --quiet, not for float weights.
TEST(Quantize, CliNotesQuantizedWeightsUnderFp32) {
  const fs::path d = klein::testing::make_temp_dir("quant_note");
  const std::string note = "weights under --precision fp32 are dequantized";
  const std::string args = " -p 'a cat' -W 32 -H 32 --steps 1 -o " + q(d / "a.png");
  for (const auto& [type, fmt] : {std::pair{"q8", "Q8_ROW"}, std::pair{"q4", "Q4_G64"}}) {
    const std::string m = " --model " + q(quantized_tiny(type));
    auto r = klein::testing::run_cli("generate" + m + " --precision fp32" + args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(std::string("note: ") + fmt + " " + note), std::string::npos) << r.err;
    r = klein::testing::run_cli("encode" + m + " --precision fp32 -p 'a cat' -o " + q(d / "e.npy"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(note), std::string::npos) << r.err;
    for (const std::string extra : {"", " --precision fast", " --precision fp32 -q"}) {
      r = klein::testing::run_cli("generate" + m + extra + args);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.err.find(note), std::string::npos) << extra << ": " << r.err;
    }
  }
  auto r = klein::testing::run_cli("generate --precision fp32 --model " + q(klein::testing::tiny_model_dir()) + args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find(note), std::string::npos) << r.err;
}

namespace {
Image ramp(int w, int h) {
  Image im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) im.rgb[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(20 + 3 * x + 2 * y + 10 * c);
  return im;
}
}  // namespace

TEST(Compare, KnownValues) {
  const Image a = ramp(40, 30);
  auto same = compare_images(a, a);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(std::isinf(same->psnr));
  EXPECT_DOUBLE_EQ(same->ssim, 1.0);
  EXPECT_DOUBLE_EQ(same->correlation, 1.0);

  // b = a + 10: MSE 100 → PSNR 10·log10(255²/100); correlation 1; SSIM's contrast-structure term
  // is 1 and its luminance term (2μaμb + C1)/(μa² + μb² + C1) is evaluated per window — luma
  // shifts by exactly 10 too, and the Gaussian window sums to 1, so μb = μa + 10 everywhere.
  Image b = a;
  for (uint8_t& v : b.rgb) v = static_cast<uint8_t>(v + 10);
  auto r = compare_images(a, b);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->psnr, 10 * std::log10(255.0 * 255.0 / 100.0), 1e-9);
  EXPECT_NEAR(r->correlation, 1.0, 1e-12);
  // For this ramp the window means of luma are 0.299·L_R + ... = the centre value; check the
  // average of the luminance term over the valid positions.
  const double c1 = 6.5025;
  double expect = 0;
  int n = 0;
  for (int y = 5; y < 25; ++y)
    for (int x = 5; x < 35; ++x) {
      const double mu = 20 + 3 * x + 2 * y + 0.587 * 10 + 0.114 * 20;  // a linear ramp: the Gaussian mean is the centre
      expect += (2 * mu * (mu + 10) + c1) / (mu * mu + (mu + 10) * (mu + 10) + c1);
      ++n;
    }
  EXPECT_NEAR(r->ssim, expect / n, 1e-9);

  Image inv = a;
  for (uint8_t& v : inv.rgb) v = static_cast<uint8_t>(255 - v);
  auto ri = compare_images(a, inv);
  ASSERT_TRUE(ri.ok());
  EXPECT_NEAR(ri->correlation, -1.0, 1e-12);
  EXPECT_LT(ri->ssim, 0.05);  // a gentle ramp: its local variance is below C2, so not far below 0

  auto bad = compare_images(a, ramp(30, 30));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("differ in size"), std::string::npos);
}

TEST(Compare, ArraysKnownValues) {
  // a = (3, 4), b = (4, 3): cosine 24/25, |a − b| = √2 so rel_l2 = √2/5, max diff 1.
  FloatArray a{{2}, {3, 4}}, b{{2}, {4, 3}};
  auto r = compare_arrays(a, b);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->cosine, 24.0 / 25.0, 1e-15);
  EXPECT_NEAR(r->rel_l2, std::sqrt(2.0) / 5.0, 1e-15);
  EXPECT_DOUBLE_EQ(r->max_abs, 1.0);
  EXPECT_EQ(r->count, 2);
  auto same = compare_arrays(a, a);
  ASSERT_TRUE(same.ok());
  EXPECT_DOUBLE_EQ(same->cosine, 1.0);
  EXPECT_DOUBLE_EQ(same->rel_l2, 0.0);
  // -a: cosine -1, rel_l2 2.
  FloatArray n{{2}, {-3, -4}};
  EXPECT_NEAR(compare_arrays(a, n)->cosine, -1.0, 1e-15);
  EXPECT_NEAR(compare_arrays(a, n)->rel_l2, 2.0, 1e-15);

  auto shape = compare_arrays(a, FloatArray{{1, 2}, {3, 4}});
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("differ in shape ([2] and [1, 2])"), std::string::npos)
      << shape.status().message();
  FloatArray nan{{2}, {3, std::nanf("")}};
  auto bad = compare_arrays(a, nan);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("non-finite value at flat index 1 of the second"), std::string::npos)
      << bad.status().message();
}
