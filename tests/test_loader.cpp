// Loading as source + bind: quantized triples resolved by SafetensorsSource, the Binder's checks
// (shape, format, unused tensors) and the three models' load() on top of them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include <set>

#include "backend/cpu/cpu_backend.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"
#include "models/bind.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::shared_ptr<SafetensorsSource> open_source(const fs::path& p) {
  auto s = SafetensorsSource::open(p);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : nullptr;
}

// Scales in f32 or bf16, from exactly representable values.
struct Scales {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Scales(DType t, const std::vector<float>& v) : dtype(t), f32(v) {
    for (float x : v) bf16.push_back(f32_to_bf16(x));
  }
  const void* data() const { return dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : bf16.data(); }
};

// Nibble value of element (r, c) in the Q4 tests.
int q4_value(int64_t r, int64_t c) { return static_cast<int>((r * 7 + c * 3 + c / 5) % 16); }

}  // namespace

TEST(Loader, Q8RowTripleLoadsAndDequantizes) {
  const int64_t rows = 3, cols = 5;
  std::vector<int8_t> q(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) q[i] = static_cast<int8_t>((i * 37) % 255 - 127);
  for (DType sd : {DType::kF32, DType::kBF16}) {
    for (Shape sshape : {Shape{rows}, Shape{rows, 1}}) {
      const Scales sc(sd, {0.5f, -0.25f, 0.125f});
      auto dir = klein::testing::make_temp_dir("q8");
      ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"lin.weight", DType::kI8, {rows, cols}, q.data()},
                                                            {"lin.weight_scale", sd, sshape, sc.data()}})
                      .ok());
      auto src = open_source(dir / "m.safetensors");
      ASSERT_TRUE(src);
      // The companion is folded into the weight: not listed, not separately gettable.
      EXPECT_EQ(src->names(), std::vector<std::string>{"lin.weight"});
      EXPECT_FALSE(src->has("lin.weight_scale"));
      Binder b(*src);
      Weight w;
      ASSERT_TRUE(b.required("lin.weight", {rows, cols}, &w).ok());
      EXPECT_EQ(w.dtype, DType::kQ8Row);
      EXPECT_EQ(w.scale_dtype, sd);
      EXPECT_EQ(w.nbytes, static_cast<size_t>(rows * cols));
      std::vector<float> row(cols);
      for (int64_t r = 0; r < rows; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(row[c], sc.f32[r] * q[r * cols + c]) << r << "," << c;
      }
      EXPECT_TRUE(b.finish().ok()) << "the scale counts as used";
      fs::remove_all(dir);
    }
  }
}

TEST(Loader, Q4G64TripleLoadsAndDequantizes) {
  const int64_t rows = 3, cols = 128, groups = cols / 64;
  std::vector<uint32_t> words(rows * cols / 8, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      words[(r * cols + c) / 8] |= static_cast<uint32_t>(q4_value(r, c)) << (4 * (c % 8));  // MLX: low nibble first
  std::vector<float> s, m;
  for (int64_t i = 0; i < rows * groups; ++i) {
    s.push_back(0.125f * static_cast<float>(i + 1));
    m.push_back(-1.0f + 0.5f * static_cast<float>(i));
  }
  for (DType sd : {DType::kF32, DType::kBF16}) {
    const Scales scales(sd, s), biases(sd, m);
    auto dir = klein::testing::make_temp_dir("q4");
    ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"lin.weight", DType::kU32, {rows, cols / 8}, words.data()},
                                                          {"lin.scales", sd, {rows, groups}, scales.data()},
                                                          {"lin.biases", sd, {rows, groups}, biases.data()}})
                    .ok());
    auto src = open_source(dir / "m.safetensors");
    ASSERT_TRUE(src);
    EXPECT_EQ(src->names(), std::vector<std::string>{"lin.weight"});
    Binder b(*src);
    Weight w;
    ASSERT_TRUE(b.required("lin.weight", {rows, cols}, &w).ok());  // the logical shape
    EXPECT_EQ(w.dtype, DType::kQ4G64);
    EXPECT_EQ(w.scale_dtype, sd);
    EXPECT_EQ(w.nbytes, static_cast<size_t>(rows * cols / 2));
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      weight_row_to_f32(w, r, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = r * groups + c / 64;
        ASSERT_EQ(row[c], m[g] + s[g] * static_cast<float>(q4_value(r, c))) << r << "," << c;
      }
    }
    EXPECT_TRUE(b.finish().ok());

    // A row view carries the matching scales and offsets along.
    auto v = w.row_range(1, 3);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->shape, (Shape{2, cols}));
    EXPECT_EQ(v->nbytes, static_cast<size_t>(2 * cols / 2));
    for (int64_t r = 0; r < 2; ++r) {
      weight_row_to_f32(*v, r, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = (r + 1) * groups + c / 64;
        ASSERT_EQ(row[c], m[g] + s[g] * static_cast<float>(q4_value(r + 1, c))) << r << "," << c;
      }
    }
    EXPECT_TRUE(validate_weight(*v).ok());
    fs::remove_all(dir);
  }
}

// Other MLX layouts (its 8-bit default, other group sizes) pack into the same U32 words; the file
// gives only bits per group, so the error names every layout that fits and the one klein computes.
TEST(Loader, OtherMlxBitsAndGroupSizesAreNamedAndRefused) {
  const int64_t rows = 2, cols = 256;
  struct Case {
    int64_t words_per_row, groups_per_row;
    std::vector<std::string> named;
  };
  const Case cases[] = {
      {cols / 4, cols / 64, {"MLX 4-bit with groups of 128 or 8-bit with groups of 64"}},  // MLX 8-bit
      {cols / 8, cols / 32, {"MLX 2-bit with groups of 64 or 4-bit with groups of 32"}},
      {cols / 8, cols / 128, {"MLX 4-bit with groups of 128 or 8-bit with groups of 64"}},
      {3, 4, {"24 bits per group, no MLX layout"}},
  };
  for (const Case& c : cases) {
    auto dir = klein::testing::make_temp_dir("mlx_layout");
    std::vector<uint32_t> words(rows * c.words_per_row, 0x76543210u);
    std::vector<float> s(rows * c.groups_per_row, 0.5f);
    ASSERT_TRUE(write_safetensors(dir / "m.safetensors",
                                  {{"lin.weight", DType::kU32, {rows, c.words_per_row}, words.data()},
                                   {"lin.scales", DType::kF32, {rows, c.groups_per_row}, s.data()},
                                   {"lin.biases", DType::kF32, {rows, c.groups_per_row}, s.data()}})
                    .ok());
    auto src = open_source(dir / "m.safetensors");
    ASSERT_TRUE(src);
    Binder b(*src);
    Weight w;
    Status st = b.required("lin.weight", {rows, c.words_per_row * 8}, &w);
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
    for (const std::string& n : c.named) EXPECT_TRUE(has(st.message(), n)) << st.message();
    EXPECT_TRUE(has(st.message(), "'lin.weight'") && has(st.message(), "4-bit with groups of 64")) << st.message();
    fs::remove_all(dir);
  }
}

// Files written by MLX itself (tests/data/mlx, scripts/reference/make_mlx_fixture.py): its 4-bit
// groups-of-64 layout loads and dequantizes as MLX does; its 8-bit groups-of-32 layout packs into
// the same 256 bits per group, and must be named, with or without mlx-lm's config entry, rather
// than read as a 4-bit matrix twice as wide.
fs::path mlx_fixture(const std::string& name) { return klein::testing::data_dir() / "mlx" / name; }

TEST(Loader, MlxWrittenQ4G64LoadsAndDequantizesAsMlx) {
  auto src = open_source(mlx_fixture("q4g64.safetensors"));
  auto ref = open_source(mlx_fixture("q4g64_dequantized.safetensors"));
  ASSERT_TRUE(src && ref);
  auto cfg = read_json_file(mlx_fixture("q4g64_config.json"));
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(src->check_quantization(*cfg, "q4g64_config.json").ok());
  Binder b(*src);
  Weight w;
  ASSERT_TRUE(b.required("lin.weight", {8, 128}, &w).ok());
  EXPECT_EQ(w.dtype, DType::kQ4G64);
  auto want = ref->get("lin.weight");
  ASSERT_TRUE(want.ok());
  std::vector<float> row(128);
  for (int64_t r = 0; r < 8; ++r) {
    weight_row_to_f32(w, r, row.data());
    for (int64_t c = 0; c < 128; ++c) {
      float x;  // MLX writes the data unaligned: copied out, not read through a float pointer
      std::memcpy(&x, static_cast<const char*>(want->data) + (r * 128 + c) * sizeof(float), sizeof(float));
      ASSERT_NEAR(row[c], x, 1e-6f * std::max(1.0f, std::abs(x))) << r << "," << c;
    }
  }
}

TEST(Loader, MlxWrittenQ8G32IsNamedNotReadAs4Bit) {
  auto src = open_source(mlx_fixture("q8g32.safetensors"));
  ASSERT_TRUE(src);
  // Without a config: the model's column count tells the layout.
  Binder b(*src);
  Weight w;
  Status st = b.required("lin.weight", {8, 128}, &w);
  EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
  EXPECT_TRUE(has(st.message(), "q8g32.safetensors: tensor 'lin.weight'") &&
              has(st.message(), "MLX 8-bit with groups of 32") && has(st.message(), "4-bit with groups of 64"))
      << st.message();
  // With mlx-lm's config entry, at open, before any shape is known.
  auto cfg = read_json_file(mlx_fixture("q8g32_config.json"));
  ASSERT_TRUE(cfg.ok());
  st = src->check_quantization(*cfg, "m/config.json");
  EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
  EXPECT_TRUE(has(st.message(), "'lin.weight'") && has(st.message(), "m/config.json") &&
              has(st.message(), "MLX 8-bit with groups of 32") && has(st.message(), "4-bit with groups of 64"))
      << st.message();
}

// A config.json "quantization" entry against the tensors: the schemes klein quantize and MLX
// write pass where they match and are refused, naming the config and a tensor, where not.
TEST(Loader, QuantizationConfigMustMatchTheTensors) {
  auto dir = klein::testing::make_temp_dir("qcfg");
  std::vector<int8_t> q(2 * 128, 3);
  std::vector<float> one(8, 1.0f), plain(2 * 128, 0.5f);
  ASSERT_TRUE(write_safetensors(dir / "q8.safetensors", {{"lin.weight", DType::kI8, {2, 128}, q.data()},
                                                         {"lin.weight_scale", DType::kF32, {2}, one.data()}})
                  .ok());
  ASSERT_TRUE(write_safetensors(dir / "bf.safetensors", {{"lin.weight", DType::kF32, {2, 128}, plain.data()}}).ok());
  const fs::path q4 = mlx_fixture("q4g64.safetensors");
  const std::string cfg = "x/config.json";
  struct Case {
    fs::path file;
    const char* quantization;  // JSON
    Code code;                 // kOk: loads
  };
  const Case cases[] = {
      {q4, R"j({"group_size": 64, "bits": 4})j", Code::kOk},
      {q4, R"j({"type": "q4", "group_size": 64, "bits": 4, "mode": "affine (MLX)", "kept": []})j", Code::kOk},
      {q4, R"j({"group_size": 64, "bits": 8})j", Code::kFormatError},
      {q4, R"j({"group_size": 32, "bits": 4})j", Code::kFormatError},
      {q4, R"j({"type": "q8"})j", Code::kFormatError},
      {q4, R"j({"type": "bf16"})j", Code::kFormatError},
      {dir / "q8.safetensors", R"j({"type": "q8", "mode": "int8 symmetric per output row, f32 scale"})j", Code::kOk},
      {dir / "q8.safetensors", R"j({"group_size": 64, "bits": 4})j", Code::kFormatError},
      {dir / "bf.safetensors", R"j({"type": "bf16", "kept": []})j", Code::kOk},
      {dir / "bf.safetensors", R"j({"type": "q8"})j", Code::kFormatError},
      {dir / "bf.safetensors", R"j({"type": "q4"})j", Code::kFormatError},
      {dir / "bf.safetensors", R"j({"bits": 4, "group_size": 64})j", Code::kFormatError},
      // klein quantize lists the weights it kept as stored: all of them where none fits q4.
      {dir / "bf.safetensors", R"j({"type": "q4", "group_size": 64, "bits": 4, "kept": ["lin.weight"]})j", Code::kOk},
      {dir / "bf.safetensors", R"j({"type": "q8", "kept": []})j", Code::kFormatError},
      {dir / "bf.safetensors", R"j({"type": "q8", "kept": 5})j", Code::kFormatError},
      // mlx-lm's per-layer overrides ("lin" for lin.weight) take precedence.
      {q4, R"j({"group_size": 64, "bits": 8, "lin": {"group_size": 64, "bits": 4}})j", Code::kOk},
      {q4, R"j({"group_size": 64, "bits": 4, "lin": {"group_size": 64, "bits": 8}})j", Code::kFormatError},
      {q4, R"j({"type": "q3"})j", Code::kUnsupported},
      {q4, R"j({"group_size": 32, "bits": 4, "mode": "mxfp4"})j", Code::kUnsupported},
      {q4, R"j({"group_size": 64, "bits": 7})j", Code::kUnsupported},
      {q4, R"j({"kept": []})j", Code::kUnsupported},
      {q4, R"j({"group_size": "64", "bits": 4})j", Code::kFormatError},
      {q4, R"j(5)j", Code::kFormatError},
      {q4, R"j(null)j", Code::kOk},
  };
  for (const Case& c : cases) {
    auto src = open_source(c.file);
    ASSERT_TRUE(src);
    nlohmann::json config = {{"hidden_size", 16}};
    config["quantization"] = nlohmann::json::parse(c.quantization);
    const Status st = src->check_quantization(config, cfg);
    EXPECT_EQ(st.code(), c.code) << c.file.filename() << " " << c.quantization << ": " << st.to_string();
    if (c.code == Code::kOk) continue;
    EXPECT_TRUE(has(st.message(), cfg + ": \"quantization\"")) << st.message();
    if (c.code == Code::kFormatError && c.quantization[0] == '{' && !has(c.quantization, "\"64\"") &&
        !has(c.quantization, ": 5"))
      EXPECT_TRUE(has(st.message(), "tensor 'lin.weight' in ")) << st.message();
  }
  // No entry: nothing to check.
  EXPECT_TRUE(open_source(q4)->check_quantization({{"hidden_size", 16}}, cfg).ok());
  fs::remove_all(dir);
}

TEST(Loader, MissingCompanionIsAClearError) {
  auto dir = klein::testing::make_temp_dir("qmiss");
  std::vector<int8_t> q(8, 1);
  std::vector<uint32_t> words(2 * 8, 0);
  std::vector<float> s(2, 1.0f);
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"a.weight", DType::kI8, {2, 4}, q.data()},
                                                        {"b.weight", DType::kU32, {2, 8}, words.data()},
                                                        {"b.scales", DType::kF32, {2, 1}, s.data()}})
                  .ok());
  auto src = open_source(dir / "m.safetensors");
  ASSERT_TRUE(src);
  Binder bind(*src);
  Weight w;
  Status st = bind.required("a.weight", {2, 4}, &w);
  EXPECT_EQ(st.code(), Code::kFormatError);
  EXPECT_TRUE(has(st.message(), "m.safetensors") && has(st.message(), "'a.weight_scale'")) << st.message();
  st = bind.required("b.weight", {2, 64}, &w);
  EXPECT_EQ(st.code(), Code::kFormatError);
  EXPECT_TRUE(has(st.message(), "m.safetensors") && has(st.message(), "'b.biases'")) << st.message();
  fs::remove_all(dir);
}

TEST(Loader, I64TensorBoundAsWeightIsRefused) {
  auto dir = klein::testing::make_temp_dir("i64");
  std::vector<int64_t> n = {7};
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"bn.num_batches_tracked", DType::kI64, {}, n.data()}}).ok());
  auto src = open_source(dir / "m.safetensors");
  ASSERT_TRUE(src);
  EXPECT_TRUE(src->has("bn.num_batches_tracked"));  // the source hands it out...
  Binder b(*src);
  Weight w;
  const Status st = b.required("bn.num_batches_tracked", {}, &w);  // ...binding refuses it
  EXPECT_EQ(st.code(), Code::kUnsupported);
  EXPECT_TRUE(has(st.message(), "m.safetensors") && has(st.message(), "'bn.num_batches_tracked'") &&
              has(st.message(), "I64"))
      << st.message();
  fs::remove_all(dir);
}

TEST(Loader, ShapeMismatchNamesFileTensorAndBothShapes) {
  auto dir = klein::testing::make_temp_dir("shape");
  std::vector<float> v(6, 1.0f);
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"w", DType::kF32, {2, 3}, v.data()}}).ok());
  auto src = open_source(dir / "m.safetensors");
  ASSERT_TRUE(src);
  Binder b(*src);
  Weight w;
  const Status st = b.required("w", {3, 2}, &w);
  EXPECT_EQ(st.code(), Code::kFormatError);
  EXPECT_TRUE(has(st.message(), (dir / "m.safetensors").string() + ": tensor 'w' has shape [2, 3] but the config implies [3, 2]"))
      << st.message();
  fs::remove_all(dir);
}

TEST(Loader, BinderOptionalIgnoredAndBoundTwice) {
  auto dir = klein::testing::make_temp_dir("bind");
  std::vector<float> v(4, 2.0f);
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"a", DType::kF32, {4}, v.data()},
                                                        {"skip.me", DType::kF32, {4}, v.data()},
                                                        {"left", DType::kF32, {4}, v.data()}})
                  .ok());
  auto src = open_source(dir / "m.safetensors");
  ASSERT_TRUE(src);
  Binder b(*src);
  Weight w;
  EXPECT_TRUE(b.optional("absent", {4}, &w).ok());
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(b.required("absent2", {4}, &w).code(), Code::kNotFound);
  std::vector<float> f;
  ASSERT_TRUE(b.vector_f32("a", 4, &f).ok());
  EXPECT_EQ(f, std::vector<float>(4, 2.0f));
  EXPECT_EQ(b.required("a", {4}, &w).code(), Code::kInternal);  // each tensor is bound once
  b.ignore_prefix("skip.");
  const Status st = b.finish();
  EXPECT_EQ(st.code(), Code::kFormatError);
  EXPECT_TRUE(has(st.message(), "m.safetensors: tensor 'left'")) << st.message();
  EXPECT_FALSE(has(st.message(), "skip.me"));
  fs::remove_all(dir);
}

// Data at an odd offset (header length not padded to 8): 2-byte reads must not assume alignment.
TEST(Loader, OddHeaderLengthReadsMisalignedBf16) {
  auto dir = klein::testing::make_temp_dir("odd");
  const std::string header = R"j({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})j";
  ASSERT_EQ(header.size() % 2, 1u);
  const fs::path p = dir / "odd.safetensors";
  {
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << header;
    for (float x : {1.5f, -2.0f, 0.25f}) {
      const uint16_t h = f32_to_bf16(x);
      f.put(static_cast<char>(h & 0xff));
      f.put(static_cast<char>(h >> 8));
    }
  }
  auto src = open_source(p);
  ASSERT_TRUE(src);
  Binder b(*src);
  std::vector<float> v;
  ASSERT_TRUE(b.vector_f32("w", 3, &v).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 0.25f}));
  fs::remove_all(dir);
}

namespace {

// A copy of tests/data/tiny/<component> whose weights file has every tensor plus `extra`
// (an f32 [4] tensor of that name).
fs::path copy_with_extra(const std::string& component, const std::string& extra) {
  const fs::path src = klein::testing::tiny_model_dir() / component;
  const fs::path dir = klein::testing::make_temp_dir("extra_" + component);
  static const std::vector<float> v(4, 0.5f);
  fs::path weights;
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().extension() == ".safetensors") weights = e.path();
    else fs::copy_file(e.path(), dir / e.path().filename());
  }
  auto store = WeightStore::open(weights);
  EXPECT_TRUE(store.ok());
  std::vector<TensorToWrite> tensors;
  for (const auto& n : store->names()) {
    const TensorEntry* t = store->entry(n);
    tensors.push_back({n, t->dtype, t->shape, t->data});
  }
  tensors.push_back({extra, DType::kF32, {4}, v.data()});
  EXPECT_TRUE(write_safetensors(dir / weights.filename(), tensors).ok());
  return dir;
}

void expect_unused(const Status& st, const fs::path& dir, const std::string& extra) {
  EXPECT_EQ(st.code(), Code::kFormatError) << st.to_string();
  EXPECT_TRUE(has(st.message(), dir.string()) && has(st.message(), "tensor '" + extra + "' is not part of the model"))
      << st.message();
}

}  // namespace

TEST(Loader, UnusedTensorIsAnErrorForEachModel) {
  {
    const fs::path d = copy_with_extra("transformer", "transformer_blocks.0.attn.to_q.bias");
    expect_unused(Flux2Transformer::load(d).status(), d, "transformer_blocks.0.attn.to_q.bias");
    fs::remove_all(d);
  }
  {
    const fs::path d = copy_with_extra("vae", "decoder.mid_block.resnets.0.conv_shortcut.weight");
    expect_unused(Flux2Vae::load(d).status(), d, "decoder.mid_block.resnets.0.conv_shortcut.weight");
    fs::remove_all(d);
  }
  {
    const fs::path d = copy_with_extra("text_encoder", "model.layers.0.self_attn.o_proj.bias");
    expect_unused(Qwen3Encoder::load(d, 27).status(), d, "model.layers.0.self_attn.o_proj.bias");
    fs::remove_all(d);
  }
  {
    // The LM head is never read: present or not, the text encoder loads.
    const fs::path d = copy_with_extra("text_encoder", "lm_head.weight");
    auto r = Qwen3Encoder::load(d, 27);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    fs::remove_all(d);
  }
}

// The source-based load() binds the same model as the folder overload.
TEST(Loader, ModelsLoadFromASource) {
  const fs::path dir = klein::testing::tiny_model_dir() / "vae";
  auto src = open_source(dir);
  ASSERT_TRUE(src);
  std::ifstream f(dir / "config.json");
  const auto j = nlohmann::json::parse(f);
  auto vae = Flux2Vae::load(src, j, (dir / "config.json").string());
  ASSERT_TRUE(vae.ok()) << vae.status().to_string();
  EXPECT_EQ(vae->bn_mean().size(), static_cast<size_t>(vae->config().patch_channels()));
}

// for_each_weight visits every tensor a model bound exactly once: the walk that weight
// preparation (Backend::prepare_weight), memory accounting and `klein info` rely on. A stacked
// weight ("a + b", Weight::stacked_with: the text encoder's gate and up) counts as its tensors.
TEST(Loader, ForEachWeightVisitsEveryBoundTensorOnce) {
  const fs::path tiny = klein::testing::tiny_model_dir();
  auto count = [](auto& model, std::set<std::string>* names) {
    int64_t n = 0;
    EXPECT_TRUE(model.for_each_weight([&](Weight& w) {
                       if (w.empty()) return Status::Ok();
                       std::string rest = w.name;
                       for (size_t p; (p = rest.find(" + ")) != std::string::npos; rest = rest.substr(p + 3)) {
                         ++n;
                         EXPECT_TRUE(names->insert(rest.substr(0, p)).second) << "visited twice: " << w.name;
                       }
                       ++n;
                       EXPECT_TRUE(names->insert(rest).second) << "visited twice: " << w.name;
                       return Status::Ok();
                     }).ok());
    return n;
  };
  auto tensors_in = [](const fs::path& dir) {
    auto s = WeightStore::open(dir);
    EXPECT_TRUE(s.ok());
    return s->names();
  };
  {
    auto m = Flux2Transformer::load(tiny / "transformer");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    std::set<std::string> seen;
    int64_t files = 0;  // the q/k norm weights are f32 vectors since load, not Weights
    for (const auto& n : tensors_in(tiny / "transformer")) files += n.find("attn.norm_") == std::string::npos;
    EXPECT_EQ(count(*m, &seen), files);
    CpuBackend be(CpuBackendOptions{1});
    EXPECT_TRUE(m->prepare(be).ok());
  }
  {
    auto m = Flux2Vae::load(tiny / "vae");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    std::set<std::string> seen;
    int64_t files = 0;
    for (const auto& n : tensors_in(tiny / "vae")) files += n.rfind("bn.", 0) != 0;  // bn.*: f32 vectors
    EXPECT_EQ(count(*m, &seen), files);
  }
  {
    auto m = Qwen3Encoder::load(tiny / "text_encoder", 30);  // every layer of the tiny encoder
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    std::set<std::string> seen;
    int64_t files = 0;
    for (const auto& n : tensors_in(tiny / "text_encoder")) files += n != "model.norm.weight";
    EXPECT_EQ(count(*m, &seen), files);
    EXPECT_EQ(seen.count("model.layers.0.mlp.gate_proj.weight") + seen.count("model.layers.0.mlp.up_proj.weight"), 2u);
  }
}
