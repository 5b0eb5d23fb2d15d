// The models' tensor tables (the one list of each model's tensors that loading, for_each_weight,
// streaming and memory accounting read): on the tiny diffusers model, each table names exactly the
// file's tensors (less what load ignores by rule), with the file's shapes, every row bound after
// load, and for_each_weight / the per-block walks visiting the table's weights and nothing else.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"
#include "testing.h"

namespace klein {
namespace tables_test {

namespace fs = std::filesystem;

fs::path tiny(const char* part) { return klein::testing::data_dir() / "tiny" / part; }

std::map<std::string, Shape> file_shapes(const TensorSource& src) {
  std::map<std::string, Shape> m;
  for (const std::string& n : src.names()) {
    auto w = src.get(n);
    EXPECT_TRUE(w.ok()) << n;
    if (w.ok()) m[n] = w->shape;
  }
  return m;
}

TEST(TensorTables, VaeTableIsTheFileLessTheStepCounter) {
  auto vae = Flux2Vae::load(tiny("vae"));
  ASSERT_TRUE(vae.ok()) << vae.status().to_string();
  const auto file = file_shapes(vae->source());
  const auto table = vae->tensor_table();
  std::set<std::string> names;
  std::set<const Weight*> weights;
  int parts[3] = {0, 0, 0};
  for (const auto& r : table) {
    EXPECT_TRUE(names.insert(r.name).second) << "listed twice: " << r.name;
    ASSERT_TRUE(file.count(r.name)) << r.name << " is in the table but not in the file";
    EXPECT_EQ(file.at(r.name), r.shape) << r.name;
    ASSERT_NE(r.weight == nullptr, r.vector == nullptr) << r.name;
    if (r.weight) {
      EXPECT_FALSE(r.weight->empty()) << r.name << " was not bound";
      EXPECT_EQ(r.weight->shape, r.shape) << r.name;
      weights.insert(r.weight);
    } else {
      EXPECT_EQ(static_cast<int64_t>(r.vector->size()), r.shape[0]) << r.name;
    }
    ++parts[static_cast<int>(r.part)];
    // The part follows the name: what encoding and decoding read apart.
    const bool enc = r.name.rfind("encoder.", 0) == 0 || r.name.rfind("quant_conv.", 0) == 0;
    const bool dec = r.name.rfind("decoder.", 0) == 0 || r.name.rfind("post_quant_conv.", 0) == 0;
    EXPECT_EQ(r.part, enc   ? Flux2Vae::Part::kEncoder
                      : dec ? Flux2Vae::Part::kDecoder
                            : Flux2Vae::Part::kLatentNorm)
        << r.name;
  }
  for (const auto& [n, s] : file)
    if (n != "bn.num_batches_tracked") EXPECT_TRUE(names.count(n)) << n << " is in the file but not in the table";
  EXPECT_GT(parts[0], 10);
  EXPECT_GT(parts[1], 10);
  EXPECT_EQ(parts[2], 2);
  std::set<const Weight*> visited;
  ASSERT_TRUE(vae->for_each_weight([&](Weight& w) {
                   EXPECT_TRUE(visited.insert(&w).second);
                   return Status::Ok();
                 }).ok());
  EXPECT_EQ(visited, weights);
}

TEST(TensorTables, TransformerTableIsTheFileAndBlocksPartitionIt) {
  auto dit = Flux2Transformer::load(tiny("transformer"));
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  const auto file = file_shapes(dit->source());
  const auto table = dit->tensor_table();
  std::set<std::string> names;
  std::map<int, std::set<const Weight*>> by_block;
  int last_block = -1;
  for (const auto& r : table) {
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    ASSERT_TRUE(file.count(r.name)) << r.name;
    EXPECT_EQ(file.at(r.name), r.shape) << r.name;
    if (r.block >= 0) {
      EXPECT_GE(r.block, last_block) << r.name << ": blocks out of run order";
      last_block = r.block;
      EXPECT_LT(r.block, dit->num_blocks());
    }
    if (r.weight) by_block[r.block].insert(r.weight);
  }
  EXPECT_EQ(names.size(), file.size());
  EXPECT_EQ(last_block, dit->num_blocks() - 1);
  for (int b = 0; b < dit->num_blocks(); ++b) {
    std::set<const Weight*> walked;
    dit->for_each_block_weight(b, [&](const Weight& w) { walked.insert(&w); });
    EXPECT_EQ(walked, by_block[b]) << "block " << b;
  }
}

TEST(TensorTables, TextEncoderTableCoversTheLoadedLayers) {
  constexpr int kLayers = 3;
  auto te = Qwen3Encoder::load(tiny("text_encoder"), kLayers);
  ASSERT_TRUE(te.ok()) << te.status().to_string();
  const auto file = file_shapes(te->source());
  const auto table = te->tensor_table(0, te->num_blocks());
  std::set<int> blocks;
  for (const auto& r : table) {
    ASSERT_TRUE(file.count(r.name)) << r.name;
    EXPECT_EQ(file.at(r.name), r.shape) << r.name;
    blocks.insert(r.block);
    // Layers past the deepest one asked for stay out of the table.
    const auto layer = r.name.find("layers.");
    if (layer != std::string::npos) EXPECT_LT(std::stoi(r.name.substr(layer + 7)), te->num_blocks()) << r.name;
  }
  EXPECT_EQ(blocks.size(), static_cast<size_t>(te->num_blocks()) + 1);  // + the embedding's -1
  // One layer's rows are the same rows as in the whole table.
  const auto one = te->tensor_table(1, 2);
  for (const auto& r : one)
    if (r.block >= 0) EXPECT_EQ(r.block, 1) << r.name;
}

}  // namespace tables_test
}  // namespace klein
