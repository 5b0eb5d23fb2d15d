// The checkpoint layer (src/io/name_map, mapped_source, checkpoint_detect): name maps as tables,
// the ScopedSource / MappedSource decorators, detection and config presets — against the tiny
// model's real diffusers names (scripts/reference/tiny_keys.txt) and BFL-named single files that
// scripts/reference/make_single_files.py wrote from it (tests/data/single_file).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "io/checkpoint_detect.h"
#include "io/json_file.h"
#include "io/mapped_source.h"
#include "io/name_map.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;

namespace {

// The tensors of one section ("transformer", "vae", "text_encoder") of tiny_keys.txt.
std::vector<TensorInfo> tiny_keys(const std::string& component) {
  std::ifstream in(fs::path(KLEIN_SOURCE_DIR) / "scripts/reference/tiny_keys.txt");
  std::vector<TensorInfo> out;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.starts_with("# ") && line.find('/') != std::string::npos) {
      inside = line.substr(2, line.find('/') - 2) == component;
      continue;
    }
    if (!inside || line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name, shape;
    std::getline(ls, name, '\t');
    std::getline(ls, shape, '\t');
    TensorInfo t{name, {}};
    std::istringstream ss(shape.substr(1, shape.size() - 2));
    for (std::string d; std::getline(ss, d, ',');) t.shape.push_back(std::stoll(d));
    out.push_back(std::move(t));
  }
  return out;
}

std::set<std::string> names_of(const std::vector<TensorInfo>& t) {
  std::set<std::string> s;
  for (const auto& i : t) s.insert(i.name);
  return s;
}

// The inverse of a map over names and shapes: each diffusers tensor's source name, and the
// source's shape (split parts stacked, reshaped weights given back their 1×1 dimensions).
std::vector<TensorInfo> unmapped(const NameMap& map, const std::vector<TensorInfo>& diffusers) {
  std::map<std::string, Shape> src;
  for (const TensorInfo& t : diffusers) {
    auto s = unmap_name(map, t.name);
    EXPECT_TRUE(s.has_value()) << "no rule of " << map.name << " gives '" << t.name << "'";
    if (!s) continue;
    const NameRule& rule = map.rules[s->rule];
    Shape shape = t.shape;
    if (rule.op == NameOp::kSplitRows) shape[0] *= static_cast<int64_t>(rule.to.size());
    if (rule.op == NameOp::kReshape) shape.resize(4, 1);
    src[s->source] = shape;
  }
  std::vector<TensorInfo> out;
  for (auto& [n, s] : src) out.push_back({n, s});
  return out;
}

fs::path single_file(const std::string& name) { return klein::testing::data_dir() / "single_file" / name; }

std::shared_ptr<const TensorSource> open_file(const fs::path& p) {
  auto s = SafetensorsSource::open(p);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::shared_ptr<const TensorSource>(*s) : nullptr;
}

// A small f32 / int8 safetensors file written for one test.
struct TestFile {
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<uint8_t>> storage;
  void add(const std::string& name, DType dt, Shape shape, const std::vector<float>& values) {
    std::vector<uint8_t> bytes;
    if (dt == DType::kF32) {
      bytes.resize(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
    } else {  // kI8
      for (float v : values) bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(v)));
    }
    storage.push_back(std::move(bytes));
    tensors.push_back({name, dt, std::move(shape), nullptr});
  }
  std::shared_ptr<const TensorSource> write(const std::string& tag) {
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = storage[i].data();
    const fs::path p = klein::testing::make_temp_dir(tag) / "model.safetensors";
    EXPECT_TRUE(write_safetensors(p, tensors).ok());
    return open_file(p);
  }
};

std::vector<float> iota(int n, float from = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + static_cast<float>(i);
  return v;
}

std::vector<uint8_t> bytes_of(const Weight& w) {
  const auto* p = static_cast<const uint8_t*>(w.data);
  return {p, p + w.nbytes};
}

}  // namespace

// --- name maps -------------------------------------------------------------------------------

TEST(NameMap, RenamesWithBlockIndices) {
  const NameMap& m = bfl_flux2_dit_map();
  auto t = map_name(m, "double_blocks.12.img_attn.proj.weight");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].target, "transformer_blocks.12.attn.to_out.0.weight");
  t = map_name(m, "single_blocks.3.norm.key_norm.scale");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].target, "single_transformer_blocks.3.attn.norm_k.weight");
  // One spelling per index: "01" and an index without digits match nothing.
  EXPECT_TRUE(map_name(m, "double_blocks.01.img_attn.proj.weight").empty());
  EXPECT_TRUE(map_name(m, "double_blocks..img_attn.proj.weight").empty());
  EXPECT_TRUE(map_name(m, "double_blocks.1234567.img_attn.proj.weight").empty());
  EXPECT_TRUE(map_name(m, "img_in.").empty());  // {*} is never empty
}

TEST(NameMap, SplitsFusedQkvInOrder) {
  auto t = map_name(bfl_flux2_dit_map(), "double_blocks.0.txt_attn.qkv.weight");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].target, "transformer_blocks.0.attn.add_q_proj.weight");
  EXPECT_EQ(t[1].target, "transformer_blocks.0.attn.add_k_proj.weight");
  EXPECT_EQ(t[2].target, "transformer_blocks.0.attn.add_v_proj.weight");
  EXPECT_EQ(t[2].part, 2);
  auto back = unmap_name(bfl_flux2_dit_map(), "transformer_blocks.0.attn.add_k_proj.weight");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->source, "double_blocks.0.txt_attn.qkv.weight");
  EXPECT_EQ(back->part, 1);
}

TEST(NameMap, VaeDecoderLevelsAreReversed) {
  auto t = map_name(ldm_flux2_vae_map(), "decoder.up.0.block.2.nin_shortcut.weight");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].target, "decoder.up_blocks.3.resnets.2.conv_shortcut.weight");
  t = map_name(ldm_flux2_vae_map(), "decoder.up.3.upsample.conv.bias");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].target, "decoder.up_blocks.0.upsamplers.0.conv.bias");
  t = map_name(ldm_flux2_vae_map(), "encoder.quant_conv.weight");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].target, "quant_conv.weight");
}

// Every table is plain data that the engine can apply: targets use only placeholders their
// pattern captures, {*} comes last, split rules have several parts, reshape a rank.
TEST(NameMap, TablesAreWellFormed) {
  for (const char* name : {"bfl_flux2_dit", "ldm_flux2_vae", "hf_qwen3_single_file", "mflux_flux2_dit",
                           "mflux_flux2_vae", "mflux_qwen3"}) {
    const NameMap* m = name_map_by_name(name);
    ASSERT_NE(m, nullptr) << name;
    for (const NameRule& r : m->rules) {
      auto holes = [](const std::string& p) {
        std::set<std::string> s;
        for (size_t k = p.find('{'); k != std::string::npos; k = p.find('{', k + 1)) s.insert(p.substr(k, p.find('}', k) - k + 1));
        return s;
      };
      const auto from = holes(r.from);
      for (const std::string& h : from) EXPECT_TRUE(h == "{i}" || h == "{j}" || h == "{*}") << r.from;
      if (from.count("{*}")) {
        EXPECT_TRUE(r.from.ends_with("{*}")) << r.from;
      }
      ASSERT_FALSE(r.to.empty()) << r.from;
      for (const std::string& to : r.to) EXPECT_EQ(holes(to), from) << r.from << " -> " << to;
      EXPECT_EQ(r.op == NameOp::kSplitRows, r.to.size() > 1) << r.from;
      if (r.op == NameOp::kReshape) {
        EXPECT_GT(r.rank, 0) << r.from;
      }
    }
  }
  EXPECT_EQ(name_map_by_name("nope"), nullptr);
}

// Every diffusers name of the tiny model is produced by the map: the names (and shapes) the map
// takes back to the source scheme map forward to exactly the diffusers set.
TEST(NameMap, ProducesEveryTinyTransformerName) {
  const auto diffusers = tiny_keys("transformer");
  ASSERT_EQ(diffusers.size(), 49u);
  const auto bfl = unmapped(bfl_flux2_dit_map(), diffusers);
  EXPECT_EQ(bfl.size(), 49u - 2 * 2 * 2);  // each double block's two qkv triples are one tensor each
  auto back = map_tensor_infos(bfl_flux2_dit_map(), bfl, "tiny");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), diffusers.size());
  std::map<std::string, Shape> want;
  for (const auto& t : diffusers) want[t.name] = t.shape;
  for (const auto& t : *back) EXPECT_EQ(want.at(t.name), t.shape) << t.name;
  EXPECT_EQ(names_of(*back), names_of(diffusers));
}

TEST(NameMap, ProducesEveryTinyVaeName) {
  const auto diffusers = tiny_keys("vae");
  ASSERT_EQ(diffusers.size(), 251u);
  const auto ldm = unmapped(ldm_flux2_vae_map(), diffusers);
  EXPECT_EQ(ldm.size(), diffusers.size());
  // LDM names (diffusers' DIFFUSERS_TO_LDM_MAPPING), the 1×1 convs of the mid attention.
  const auto names = names_of(ldm);
  for (const char* n : {"encoder.quant_conv.weight", "decoder.post_quant_conv.bias", "decoder.up.3.block.0.conv1.weight",
                        "encoder.down.1.block.0.nin_shortcut.weight", "encoder.mid.attn_1.proj_out.weight",
                        "decoder.norm_out.weight", "bn.running_mean"})
    EXPECT_TRUE(names.count(n)) << n;
  auto back = map_tensor_infos(ldm_flux2_vae_map(), ldm, "tiny vae");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  std::map<std::string, Shape> want;
  for (const auto& t : diffusers) want[t.name] = t.shape;
  for (const auto& t : *back) EXPECT_EQ(want.at(t.name), t.shape) << t.name;
  EXPECT_EQ(names_of(*back), names_of(diffusers));
}

TEST(NameMap, UnmatchedAndClashingNamesAreOneError) {
  auto r = map_tensor_infos(bfl_flux2_dit_map(),
                            {{"img_in.weight", {4, 4}}, {"double_blocks.0.img_mod.lin.weight", {4, 4}}, {"extra", {1}}},
                            "f.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "f.safetensors: 2 tensors match no rule of the name map bfl_flux2_dit: "
            "'double_blocks.0.img_mod.lin.weight', 'extra'");
  // FLUX.2's quant convs sit under encoder./decoder., older LDM files' at the top: a file with
  // both would give quant_conv.weight twice.
  r = map_tensor_infos(ldm_flux2_vae_map(), {{"encoder.quant_conv.weight", {2, 2, 1, 1}}, {"quant_conv.weight", {2, 2, 1, 1}}},
                       "ae.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "ae.safetensors: tensors 'encoder.quant_conv.weight' and 'quant_conv.weight' both map to "
            "'quant_conv.weight' (name map ldm_flux2_vae)");
  // A fused tensor whose rows do not split in three.
  r = map_tensor_infos(bfl_flux2_dit_map(), {{"double_blocks.0.img_attn.qkv.weight", {8, 4}}}, "f.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'double_blocks.0.img_attn.qkv.weight' [8, 4]"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("8 rows do not divide"), std::string::npos) << r.status().message();
}

// --- decorators ------------------------------------------------------------------------------

TEST(ScopedSource, ShowsOnlyThePrefixStripped) {
  TestFile f;
  f.add("model.diffusion_model.a", DType::kF32, {2}, {1, 2});
  f.add("model.diffusion_model.b.c", DType::kF32, {3}, {3, 4, 5});
  f.add("vae.a", DType::kF32, {1}, {9});
  auto src = f.write("scoped");
  ASSERT_TRUE(src);
  auto s = ScopedSource::create(src, "model.diffusion_model.");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->names(), (std::vector<std::string>{"a", "b.c"}));
  EXPECT_TRUE((*s)->has("b.c"));
  EXPECT_FALSE((*s)->has("vae.a"));
  EXPECT_FALSE((*s)->has(""));
  auto w = (*s)->get("b.c");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(weight_to_vector(*w), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(w->data, src->get("model.diffusion_model.b.c")->data);  // a view, not a copy
  EXPECT_EQ((*s)->total_bytes(), 5u * 4u);
  auto missing = (*s)->get("vae.a");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tensors under 'model.diffusion_model.'"), std::string::npos);
  auto none = ScopedSource::create(src, "text_encoders.");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no tensor name starts with 'text_encoders.'"), std::string::npos);
}

TEST(MappedSource, SplitsRowsAsViews) {
  TestFile f;
  f.add("double_blocks.0.img_attn.qkv.weight", DType::kF32, {6, 2}, iota(12));
  auto src = f.write("split");
  ASSERT_TRUE(src);
  auto m = MappedSource::create(src, bfl_flux2_dit_map());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->names(), (std::vector<std::string>{"transformer_blocks.0.attn.to_k.weight",
                                                     "transformer_blocks.0.attn.to_q.weight",
                                                     "transformer_blocks.0.attn.to_v.weight"}));
  auto v = (*m)->get("transformer_blocks.0.attn.to_v.weight");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->shape, (Shape{2, 2}));
  EXPECT_EQ(weight_to_vector(*v), (std::vector<float>{8, 9, 10, 11}));
  const auto* base = static_cast<const uint8_t*>(src->get("double_blocks.0.img_attn.qkv.weight")->data);
  EXPECT_EQ(v->data, base + 2 * 2 * 2 * sizeof(float));  // rows 4-5 in place
  EXPECT_EQ(v->owner, nullptr);
  EXPECT_EQ(v->name, "transformer_blocks.0.attn.to_v.weight");
  EXPECT_EQ((*m)->file_of("transformer_blocks.0.attn.to_v.weight"),
            src->file_of("double_blocks.0.img_attn.qkv.weight") + " (as 'double_blocks.0.img_attn.qkv.weight')");
}

TEST(MappedSource, SwapsTheFinalModulationHalvesWithTheirScales) {
  TestFile f;
  // A q8 weight (int8 rows + one scale per row): the scales move with their rows.
  f.add("final_layer.adaLN_modulation.1.weight", DType::kI8, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  f.add("final_layer.adaLN_modulation.1.weight_scale", DType::kF32, {4}, {1, 10, 100, 1000});
  auto src = f.write("swap");
  ASSERT_TRUE(src);
  auto m = MappedSource::create(src, bfl_flux2_dit_map());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto w = (*m)->get("norm_out.linear.weight");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->dtype, DType::kQ8Row);
  EXPECT_NE(w->owner, nullptr);  // an owned copy: the file's bytes stay as they are
  EXPECT_TRUE(validate_weight(*w).ok());
  // BFL (shift, scale) rows 0-1 / 2-3 become diffusers (scale, shift).
  EXPECT_EQ(weight_to_vector(*w), (std::vector<float>{500, 600, 7000, 8000, 1, 2, 30, 40}));
  EXPECT_EQ(weight_to_vector(*src->get("final_layer.adaLN_modulation.1.weight")),
            (std::vector<float>{1, 2, 30, 40, 500, 600, 7000, 8000}));
}

TEST(MappedSource, ReshapesOneByOneConvsToLinear) {
  TestFile f;
  f.add("encoder.mid.attn_1.q.weight", DType::kF32, {2, 2, 1, 1}, iota(4));
  f.add("encoder.mid.attn_1.k.weight", DType::kF32, {2, 1, 2, 1}, iota(4));
  auto src = f.write("reshape");
  ASSERT_TRUE(src);
  auto m = MappedSource::create(src, ldm_flux2_vae_map());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto q = (*m)->get("encoder.mid_block.attentions.0.to_q.weight");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->shape, (Shape{2, 2}));
  EXPECT_EQ(q->data, src->get("encoder.mid.attn_1.q.weight")->data);
  // A [2, 1, 2, 1] "conv" is not a 1×1 conv: the error names the stored tensor and its file.
  auto k = (*m)->get("encoder.mid_block.attentions.0.to_k.weight");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find(src->file_of("encoder.mid.attn_1.k.weight") +
                                       ": tensor 'encoder.mid.attn_1.k.weight' [2, 1, 2, 1] (name map ldm_flux2_vae) is "
                                       "reshaped to rank 2, which drops only dimensions of size 1"),
            std::string::npos)
      << k.status().message();
}

TEST(MappedSource, UnknownNamesFailAtCreation) {
  TestFile f;
  f.add("img_in.weight", DType::kF32, {1}, {1});
  f.add("double_blocks.0.img_mod.lin.weight", DType::kF32, {1}, {1});
  auto src = f.write("unknown");
  ASSERT_TRUE(src);
  auto m = MappedSource::create(src, bfl_flux2_dit_map());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), src->origin() +
                                      ": 1 tensor match no rule of the name map bfl_flux2_dit: "
                                      "'double_blocks.0.img_mod.lin.weight'");
}

// --- the BFL single files made by make_single_files.py ---------------------------------------

namespace {

void expect_same_tensors(const TensorSource& got, const TensorSource& want) {
  ASSERT_EQ(got.names(), want.names());
  for (const std::string& n : want.names()) {
    auto a = got.get(n), b = want.get(n);
    ASSERT_TRUE(a.ok() && b.ok()) << n;
    EXPECT_EQ(a->dtype, b->dtype) << n;
    EXPECT_EQ(a->shape, b->shape) << n;
    EXPECT_EQ(bytes_of(*a), bytes_of(*b)) << n;
  }
}

}  // namespace

TEST(SingleFile, BflDitMapsBackToTheDiffusersTensors) {
  auto want = open_file(klein::testing::tiny_model_dir() / "transformer");
  auto file = open_file(single_file("tiny-flux2-bfl-comfy.safetensors"));
  ASSERT_TRUE(want && file);
  auto scoped = ScopedSource::create(file, "model.diffusion_model.");
  ASSERT_TRUE(scoped.ok()) << scoped.status().to_string();
  auto mapped = MappedSource::create(*scoped, bfl_flux2_dit_map());
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  expect_same_tensors(**mapped, *want);

  auto plain = open_file(single_file("tiny-flux2-bfl.safetensors"));
  ASSERT_TRUE(plain);
  auto mapped_plain = MappedSource::create(plain, bfl_flux2_dit_map());
  ASSERT_TRUE(mapped_plain.ok()) << mapped_plain.status().to_string();
  expect_same_tensors(**mapped_plain, *want);
}

TEST(SingleFile, TransformerLoadsFromTheBflFileWithAPresetConfig) {
  auto file = open_file(single_file("tiny-flux2-bfl-comfy.safetensors"));
  ASSERT_TRUE(file);
  auto info = detect_checkpoint(*file);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->parts.size(), 1u);
  const CheckpointPart& p = info->parts[0];
  EXPECT_EQ(p.component, Component::kTransformer);
  EXPECT_EQ(p.scheme, NamingScheme::kBfl);
  EXPECT_EQ(p.family, Family::kFlux2Other);
  EXPECT_EQ(p.prefix, "model.diffusion_model.");
  EXPECT_EQ(p.map, &bfl_flux2_dit_map());
  EXPECT_EQ(info->description,
            "FLUX.2-architecture transformer, BFL names (D 32, text width 48, 2 double + 2 single blocks) under "
            "'model.diffusion_model.'");
  // The preset is the tiny model's own config.json (less the writer's version stamp).
  auto preset = preset_config(p, file->origin());
  ASSERT_TRUE(preset.ok()) << preset.status().to_string();
  auto cfg = read_json_file(klein::testing::tiny_model_dir() / "transformer/config.json");
  ASSERT_TRUE(cfg.ok());
  cfg->erase("_diffusers_version");
  EXPECT_EQ(*preset, *cfg) << preset->dump() << "\n" << cfg->dump();

  auto scoped = ScopedSource::create(file, p.prefix);
  ASSERT_TRUE(scoped.ok());
  auto mapped = MappedSource::create(*scoped, *p.map);
  ASSERT_TRUE(mapped.ok());
  auto dit = Flux2Transformer::load(*mapped, *preset, "preset");
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  EXPECT_EQ(dit->config().num_layers, 2);
  EXPECT_EQ(dit->config().joint_attention_dim, 48);

  // A config asking for a block the file lacks: the message names the file, the prefix and the
  // map through which the diffusers name was looked for.
  (*preset)["num_layers"] = 3;
  auto bad = Flux2Transformer::load(*mapped, *preset, "preset");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), file->origin() +
                                        " (tensors under 'model.diffusion_model.') via name map bfl_flux2_dit: tensor "
                                        "'transformer_blocks.2.attn.to_q.weight' is missing");
}

TEST(SingleFile, LdmVaeMapsBackAndLoads) {
  auto want = open_file(klein::testing::tiny_model_dir() / "vae");
  auto file = open_file(single_file("tiny-flux2-vae-ldm.safetensors"));
  ASSERT_TRUE(want && file);
  auto info = detect_checkpoint(*file);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->parts.size(), 1u);
  EXPECT_EQ(info->description, "FLUX.2 VAE, LDM names (channels 8/16/32/32, 32 latent channels)");
  ASSERT_EQ(info->parts[0].map, &ldm_flux2_vae_map());
  auto mapped = MappedSource::create(file, ldm_flux2_vae_map());
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  expect_same_tensors(**mapped, *want);
  auto cfg = read_json_file(klein::testing::tiny_model_dir() / "vae/config.json");
  ASSERT_TRUE(cfg.ok());
  auto vae = Flux2Vae::load(*mapped, *cfg, "vae/config.json");
  ASSERT_TRUE(vae.ok()) << vae.status().to_string();
}

// --- detection and presets -------------------------------------------------------------------

namespace {

// BFL names and shapes of a FLUX.2 transformer of width d (heads of 128, MLP 3d).
std::vector<TensorInfo> bfl_dit(int64_t d, int64_t ctx, int nd, int ns, bool guidance = false) {
  const int64_t f = 3 * d, head = 128;
  std::vector<TensorInfo> t = {{"img_in.weight", {d, 128}},
                               {"txt_in.weight", {d, ctx}},
                               {"time_in.in_layer.weight", {d, 256}},
                               {"time_in.out_layer.weight", {d, d}},
                               {"double_stream_modulation_img.lin.weight", {6 * d, d}},
                               {"double_stream_modulation_txt.lin.weight", {6 * d, d}},
                               {"single_stream_modulation.lin.weight", {3 * d, d}},
                               {"final_layer.adaLN_modulation.1.weight", {2 * d, d}},
                               {"final_layer.linear.weight", {128, d}}};
  if (guidance) {
    t.push_back({"guidance_in.in_layer.weight", {d, 256}});
    t.push_back({"guidance_in.out_layer.weight", {d, d}});
  }
  for (int i = 0; i < nd; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".";
    for (const char* s : {"img", "txt"}) {
      const std::string a = b + s + "_attn.", mlp = b + s + "_mlp.";
      t.push_back({a + "qkv.weight", {3 * d, d}});
      t.push_back({a + "proj.weight", {d, d}});
      t.push_back({a + "norm.query_norm.scale", {head}});
      t.push_back({a + "norm.key_norm.scale", {head}});
      t.push_back({mlp + "0.weight", {2 * f, d}});
      t.push_back({mlp + "2.weight", {d, f}});
    }
  }
  for (int i = 0; i < ns; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".";
    t.push_back({b + "linear1.weight", {3 * d + 2 * f, d}});
    t.push_back({b + "linear2.weight", {d, d + f}});
    t.push_back({b + "norm.query_norm.scale", {head}});
    t.push_back({b + "norm.key_norm.scale", {head}});
  }
  return t;
}

nlohmann::json klein_config(int64_t heads, int64_t ctx, int nd, int ns) {
  // docs/design formats-and-variants.md / diffusers convert_flux2_to_diffusers.py klein-4b.
  return {{"_class_name", "Flux2Transformer2DModel"},
          {"attention_head_dim", 128},
          {"axes_dims_rope", {32, 32, 32, 32}},
          {"eps", 1e-6},
          {"guidance_embeds", false},
          {"in_channels", 128},
          {"joint_attention_dim", ctx},
          {"mlp_ratio", 3.0},
          {"num_attention_heads", heads},
          {"num_layers", nd},
          {"num_single_layers", ns},
          {"out_channels", nullptr},
          {"patch_size", 1},
          {"rope_theta", 2000},
          {"timestep_guidance_channels", 256}};
}

CheckpointPart only_part(const std::vector<TensorInfo>& t) {
  auto info = detect_checkpoint(t, "test.safetensors");
  EXPECT_TRUE(info.ok()) << info.status().to_string();
  if (!info.ok() || info->parts.size() != 1) {
    ADD_FAILURE() << "expected one part";
    return {};
  }
  return info->parts[0];
}

}  // namespace

TEST(Detect, Klein4BAnd9BFromShapes) {
  CheckpointPart p = only_part(bfl_dit(3072, 7680, 5, 20));
  EXPECT_EQ(p.family, Family::kFlux2Klein4B);
  EXPECT_EQ(p.description,
            "FLUX.2 [klein] 4B transformer, BFL names (D 3072, text width 7680, 5 double + 20 single blocks)");
  auto cfg = preset_config(p, "test");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(*cfg, klein_config(24, 7680, 5, 20)) << cfg->dump();

  p = only_part(bfl_dit(4096, 12288, 8, 24));
  EXPECT_EQ(p.family, Family::kFlux2Klein9B);
  cfg = preset_config(p, "test");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(*cfg, klein_config(32, 12288, 8, 24)) << cfg->dump();

  // FLUX.2 [dev]: 48 heads, text width 15360 and the guidance embedder.
  p = only_part(bfl_dit(6144, 15360, 8, 48, true));
  EXPECT_EQ(p.family, Family::kFlux2Dev);
  cfg = preset_config(p, "test");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ((*cfg)["guidance_embeds"], true);
  EXPECT_EQ((*cfg)["num_attention_heads"], 48);
}

TEST(Detect, NamesFlux1AndGivesItNoPreset) {
  // FLUX.1 [dev]: per-block modulation, biases, a 64-channel img_in and guidance_in.
  CheckpointPart p = only_part({{"img_in.weight", {3072, 64}},
                                {"img_in.bias", {3072}},
                                {"guidance_in.in_layer.weight", {3072, 256}},
                                {"double_blocks.0.img_mod.lin.weight", {18432, 3072}},
                                {"double_blocks.0.img_attn.qkv.weight", {9216, 3072}}});
  EXPECT_EQ(p.family, Family::kFlux1);
  EXPECT_FALSE(p.supported());
  EXPECT_EQ(p.description, "FLUX.1 transformer, BFL names (klein runs FLUX.2 models only)");
  auto cfg = preset_config(p, "flux1-dev.safetensors");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().message(),
            "flux1-dev.safetensors: no config preset for FLUX.1 transformer, BFL names (klein runs FLUX.2 models only)");
}

TEST(Detect, DiffusersComponentsOfTheTinyModel) {
  CheckpointPart dit = only_part(tiny_keys("transformer"));
  EXPECT_EQ(dit.scheme, NamingScheme::kDiffusers);
  EXPECT_EQ(dit.map, nullptr);
  EXPECT_EQ(dit.family, Family::kFlux2Other);

  CheckpointPart vae = only_part(tiny_keys("vae"));
  EXPECT_EQ(vae.component, Component::kVae);
  EXPECT_EQ(vae.family, Family::kFlux2Vae);
  EXPECT_EQ(vae.description, "FLUX.2 VAE, diffusers names (channels 8/16/32/32, 32 latent channels)");
  auto cfg = preset_config(vae, "vae");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto want = read_json_file(klein::testing::tiny_model_dir() / "vae/config.json");
  ASSERT_TRUE(want.ok());
  want->erase("_diffusers_version");
  // Group norms keep one weight per channel whatever their groups: the count is not in the
  // weights, and the preset says 32 (the released VAE); the tiny model uses 4.
  EXPECT_EQ((*cfg)["norm_num_groups"], 32);
  (*want)["norm_num_groups"] = 32;
  EXPECT_EQ(*cfg, *want) << cfg->dump() << "\n" << want->dump();
}

TEST(Detect, QwenPresetReadsTheTinyEncodersSizes) {
  auto src = open_file(klein::testing::tiny_model_dir() / "text_encoder");
  ASSERT_TRUE(src);
  auto info = detect_checkpoint(*src);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->parts.size(), 1u);
  const CheckpointPart& p = info->parts[0];
  EXPECT_EQ(p.family, Family::kQwen3);
  EXPECT_EQ(p.scheme, NamingScheme::kHfTransformers);
  auto cfg = preset_config(p, "te");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto want = read_json_file(klein::testing::tiny_model_dir() / "text_encoder/config.json");
  ASSERT_TRUE(want.ok());
  for (const char* k : {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "vocab_size", "rms_norm_eps", "attention_bias", "tie_word_embeddings", "rope_parameters"})
    EXPECT_EQ((*cfg)[k], (*want)[k]) << k;
  // The preset's layer count is what the file holds, and the encoder loads with it.
  auto enc = Qwen3Encoder::load(src, *cfg, "preset", 1);
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
}

TEST(Detect, SplitsAComfyAllInOneCheckpointByPrefix) {
  std::vector<TensorInfo> all;
  for (const auto& t : unmapped(bfl_flux2_dit_map(), tiny_keys("transformer")))
    all.push_back({"model.diffusion_model." + t.name, t.shape});
  for (const auto& t : unmapped(ldm_flux2_vae_map(), tiny_keys("vae"))) all.push_back({"vae." + t.name, t.shape});
  for (const auto& t : tiny_keys("text_encoder"))
    all.push_back({"text_encoders.qwen3_4b.transformer." + t.name, t.shape});
  auto info = detect_checkpoint(all, "all.safetensors");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->parts.size(), 3u);
  std::map<std::string, const CheckpointPart*> by_prefix;
  for (const auto& p : info->parts) by_prefix[p.prefix] = &p;
  ASSERT_TRUE(by_prefix.count("model.diffusion_model."));
  ASSERT_TRUE(by_prefix.count("vae."));
  ASSERT_TRUE(by_prefix.count("text_encoders.qwen3_4b.transformer."));
  EXPECT_EQ(by_prefix["model.diffusion_model."]->scheme, NamingScheme::kBfl);
  EXPECT_EQ(by_prefix["vae."]->scheme, NamingScheme::kLdm);
  EXPECT_EQ(by_prefix["vae."]->family, Family::kFlux2Vae);
  EXPECT_EQ(names_of(by_prefix["vae."]->tensors), names_of(tiny_keys("vae")));
  EXPECT_EQ(by_prefix["text_encoders.qwen3_4b.transformer."]->family, Family::kQwen3);
  for (const auto& p : info->parts) {
    EXPECT_TRUE(p.supported()) << p.description;
    EXPECT_TRUE(preset_config(p, "all.safetensors").ok()) << p.description;
  }
}

TEST(Detect, UnknownNamesArePartOfTheAnswerNotAnError) {
  CheckpointPart p = only_part({{"foo.weight", {2}}, {"bar", {1}}});
  EXPECT_EQ(p.family, Family::kUnknown);
  EXPECT_FALSE(p.supported());
  EXPECT_EQ(p.description, "2 tensors in no known naming scheme (first: 'bar')");
  // A FLUX.2 file whose block indices have a hole is an error naming the blocks.
  auto t = bfl_dit(256, 512, 3, 1);
  std::erase_if(t, [](const TensorInfo& i) { return i.name.starts_with("double_blocks.1."); });
  auto info = detect_checkpoint(t, "holes.safetensors");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().message(),
            "holes.safetensors: 2 blocks 'transformer_blocks.N' are present, but N runs to 2 (a block is missing)");
}
