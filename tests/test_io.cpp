// Loading: safetensors validation, sharded indexes, model folders, .npy round trips.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_folder.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;

namespace {

// Writes a raw safetensors file from a header string and a data blob.
void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header << data;
}

std::string blob(size_t n) { return std::string(n, '\x01'); }

}  // namespace

TEST(Safetensors, RoundTripAllPlainDtypes) {
  auto dir = klein::testing::make_temp_dir("st");
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 0.125f, 7.0f};  // exact in bf16 and f16
  std::vector<uint16_t> bf(6), f16(6);
  for (int i = 0; i < 6; ++i) {
    bf[i] = f32_to_bf16(f32[i]);
    f16[i] = f32_to_f16(f32[i]);
  }
  ASSERT_TRUE(write_safetensors(dir / "a.safetensors",
                                {{"w.f32", DType::kF32, {2, 3}, f32.data()},
                                 {"w.bf16", DType::kBF16, {2, 3}, bf.data()},
                                 {"w.f16", DType::kF16, {3, 2}, f16.data()}},
                                {{"format", "pt"}})
                  .ok());
  auto s = WeightStore::open(dir / "a.safetensors");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->names().size(), 3u);
  EXPECT_EQ(s->metadata().at("format"), "pt");
  for (const char* n : {"w.f32", "w.bf16", "w.f16"}) {
    auto w = s->get(n);
    ASSERT_TRUE(w.ok());
    Tensor t = weight_to_tensor(*w);
    for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(t.data()[i], f32[i]) << n << " element " << i;
  }
  // Shape check against the config.
  auto bad = s->get("w.f32", {3, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("w.f32"), std::string::npos);
  EXPECT_NE(bad.status().message().find("[2, 3]"), std::string::npos);
  auto missing = s->get("nope");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  fs::remove_all(dir);
}

TEST(Safetensors, RecognisesQuantStorageDtypes) {
  auto dir = klein::testing::make_temp_dir("st");
  write_raw(dir / "q.safetensors",
            R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"c":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[6,8]}})",
            blob(8));
  auto s = WeightStore::open(dir / "q.safetensors");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->entry("a")->dtype, DType::kI8);
  EXPECT_EQ(s->entry("b")->dtype, DType::kU8);
  EXPECT_EQ(s->entry("c")->dtype, DType::kF8E4M3);
  fs::remove_all(dir);
}

struct BadCase {
  const char* name;
  std::string header;
  size_t data_bytes;
  const char* expect;  // substring of the message
};

TEST(Safetensors, RejectsMalformedHeaders) {
  const std::vector<BadCase> cases = {
      {"bad_json", "{\"a\": [", 0, "not valid JSON"},
      {"not_object", "[1,2]", 0, "not a JSON object"},
      {"unknown_dtype", R"({"t":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1, "unknown dtype 'Q7'"},
      {"missing_fields", R"({"t":{"dtype":"F32","shape":[1]}})", 4, "data_offsets"},
      {"out_of_bounds", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "out of bounds"},
      {"size_mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12"},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap"},
      {"negative_dim", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "negative"},
      {"reversed_offsets", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8, "out of bounds"},
  };
  auto dir = klein::testing::make_temp_dir("stbad");
  for (const auto& c : cases) {
    auto p = dir / (std::string(c.name) + ".safetensors");
    write_raw(p, c.header, blob(c.data_bytes));
    auto s = WeightStore::open(p);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_NE(s.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << s.status().message();
    EXPECT_NE(s.status().message().find(p.filename().string()), std::string::npos)
        << c.name << " message should name the file: " << s.status().message();
  }
  fs::remove_all(dir);
}

TEST(Safetensors, RejectsTruncatedFiles) {
  auto dir = klein::testing::make_temp_dir("sttrunc");
  std::vector<float> v(64, 1.0f);
  ASSERT_TRUE(write_safetensors(dir / "full.safetensors", {{"t", DType::kF32, {64}, v.data()}}).ok());
  std::ifstream in(dir / "full.safetensors", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  for (size_t keep : {size_t{0}, size_t{5}, size_t{20}, all.size() - 1}) {
    auto p = dir / ("cut" + std::to_string(keep) + ".safetensors");
    std::ofstream(p, std::ios::binary) << all.substr(0, keep);
    auto s = WeightStore::open(p);
    ASSERT_FALSE(s.ok()) << "kept " << keep;
    EXPECT_EQ(s.status().code(), Code::kFormatError) << s.status().to_string();
  }
  auto s = WeightStore::open(dir / "does_not_exist.safetensors");
  EXPECT_EQ(s.status().code(), Code::kNotFound);
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedIndex) {
  auto dir = klein::testing::make_temp_dir("shard");
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  ASSERT_TRUE(write_safetensors(dir / "model-00001-of-00002.safetensors", {{"a", DType::kF32, {2}, a.data()}}).ok());
  ASSERT_TRUE(write_safetensors(dir / "model-00002-of-00002.safetensors", {{"b", DType::kF32, {3}, b.data()}}).ok());
  nlohmann::json idx = {{"metadata", {{"total_size", 20}}},
                        {"weight_map", {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  auto s = WeightStore::open(dir);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->files().size(), 2u);
  auto wb = s->get("b");
  ASSERT_TRUE(wb.ok());
  EXPECT_EQ(static_cast<const float*>(wb->data)[2], 5.0f);

  // An index that names a tensor its shard lacks.
  idx["weight_map"]["c"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  auto bad = WeightStore::open(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'c'"), std::string::npos) << bad.status().message();
  // A missing shard.
  idx["weight_map"].erase("c");
  idx["weight_map"]["d"] = "model-00003-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  bad = WeightStore::open(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model-00003-of-00002.safetensors"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Npy, RoundTripAndErrors) {
  auto dir = klein::testing::make_temp_dir("npy");
  Tensor t({2, 3, 4});
  for (int i = 0; i < 24; ++i) t.data()[i] = i * 0.5f - 3;
  ASSERT_TRUE(write_npy(dir / "t.npy", t).ok());
  auto r = read_npy(dir / "t.npy");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->shape, (Shape{2, 3, 4}));
  auto v = r->to_f32();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], t.data()[i]);
  std::vector<int64_t> ids = {1, -2, 151643};
  ASSERT_TRUE(write_npy(dir / "i.npy", DType::kI64, {3}, ids.data()).ok());
  EXPECT_EQ(read_npy(dir / "i.npy")->to_i64(), ids);
  std::ofstream(dir / "bad.npy") << "hello";
  EXPECT_FALSE(read_npy(dir / "bad.npy").ok());
  // No temp files are left behind.
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  fs::remove_all(dir);
}

TEST(ModelFolder, FindsComponentsOfTheTinyModel) {
  auto m = ModelFolder::open(klein::testing::tiny_model_dir());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->pipeline_class(), "Flux2KleinPipeline");
  EXPECT_TRUE(m->is_distilled());
  for (const char* c : {"text_encoder", "tokenizer", "transformer", "vae", "scheduler"}) {
    EXPECT_TRUE(m->has(c)) << c;
    EXPECT_TRUE(m->component(c).ok()) << c;
  }
  EXPECT_EQ(m->component("text_encoder")->class_name, "Qwen3ForCausalLM");
  EXPECT_TRUE(m->config("transformer").ok());
  EXPECT_TRUE(m->config("scheduler").ok());
}

TEST(ModelFolder, ClearErrors) {
  auto dir = klein::testing::make_temp_dir("mf");
  auto r = ModelFolder::open(dir / "nothing");
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  r = ModelFolder::open(dir);
  EXPECT_NE(r.status().message().find("model_index.json"), std::string::npos);
  std::ofstream(dir / "model_index.json") << "{ not json";
  r = ModelFolder::open(dir);
  EXPECT_EQ(r.status().code(), Code::kFormatError);
  std::ofstream(dir / "model_index.json") << R"({"_class_name":"Flux2KleinPipeline","vae":["diffusers","AutoencoderKLFlux2"]})";
  r = ModelFolder::open(dir);
  ASSERT_TRUE(r.ok());
  auto c = r->component("vae");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("vae"), std::string::npos);
  EXPECT_FALSE(r->component("text_encoder").ok());
  fs::remove_all(dir);
}
