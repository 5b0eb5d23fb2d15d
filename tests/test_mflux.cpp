// mflux packs (per-component folders of N.safetensors shards, mflux's names, OHWI VAE convs) and
// MLX 8-bit groups of 64 (Q8_G64): the format against its formula on every ISA's linear kernel,
// the name maps, the packs written by scripts/reference/make_mflux_pack.py (mlx itself) against
// diffusers run with MLX's dequantized weights, the whole pipeline from a pack, broken packs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "api/layout.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "io/mapped_source.h"
#include "io/name_map.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;

// A named namespace: a unity batch may hold test_fp8.cpp's helpers of the same names.
namespace klein::mflux_test {

fs::path mflux_dir() { return testing::data_dir() / "mflux"; }
std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// --- Q8_G64: the format ------------------------------------------------------------------------

struct Q8Weight {
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales, biases;  // bf16, as MLX stores them
  Weight w;
};

Q8Weight make_q8(int64_t rows, int64_t cols, uint32_t seed) {
  Q8Weight t;
  std::mt19937 rng(seed);
  t.q.resize(rows * cols);
  for (auto& b : t.q) b = static_cast<uint8_t>(rng() & 0xff);
  for (int64_t i = 0; i < rows * cols / 64; ++i) {
    t.scales.push_back(f32_to_bf16(std::ldexp(static_cast<float>(1 + rng() % 31), -9)));
    t.biases.push_back(f32_to_bf16(static_cast<float>(static_cast<int>(rng() % 17) - 8) / 16.0f));
  }
  t.w.name = "q8.weight";
  t.w.dtype = DType::kQ8G64;
  t.w.shape = {rows, cols};
  t.w.data = t.q.data();
  t.w.nbytes = t.q.size();
  t.w.scales = t.scales.data();
  t.w.offsets = t.biases.data();
  t.w.scale_dtype = DType::kBF16;
  return t;
}

// MLX's dequantization, w = scales · q + biases per group of 64, written out from its definition.
float q8_formula(const Q8Weight& t, int64_t r, int64_t c) {
  const int64_t g = r * (t.w.shape[1] / 64) + c / 64;
  return bf16_to_f32(t.biases[g]) + bf16_to_f32(t.scales[g]) * static_cast<float>(t.q[r * t.w.shape[1] + c]);
}

TEST(Q8G64Format, ScalarRowIsMlxsFormula) {
  const Q8Weight t = make_q8(5, 192, 7);
  ASSERT_TRUE(validate_weight(t.w).ok());
  const FormatTraits& f = format_traits(DType::kQ8G64);
  EXPECT_EQ(f.name, "Q8_G64");
  EXPECT_EQ(format_row_bytes(DType::kQ8G64, 192), 192);
  std::vector<float> row(192);
  for (int64_t r = 0; r < 5; ++r) {
    f.row_to_f32(t.w, r, 0, 192, row.data());
    for (int64_t c = 0; c < 192; ++c) ASSERT_EQ(row[c], q8_formula(t, r, c)) << r << "," << c;
    f.row_to_f32(t.w, r, 64, 128, row.data());  // a range starting at a later group
    for (int64_t c = 0; c < 128; ++c) ASSERT_EQ(row[c], q8_formula(t, r, 64 + c));
  }
}

// Every ISA's linear kernel (the AVX2 unpack of q8_unpack.h among them) against the scalar row:
// x = I picks W's columns one by one, so y is W transposed exactly under fp32. M = K runs the
// packed GEMM, M = 3 the small-M path.
class Q8G64Kernels : public ::testing::TestWithParam<Isa> {};
INSTANTIATE_TEST_SUITE_P(Isa, Q8G64Kernels, ::testing::ValuesIn(CpuFeatures::host().isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_name(i.param)); });

TEST_P(Q8G64Kernels, LinearGivesTheScalarRowsExactly) {
  constexpr int64_t N = 40, K = 128;
  const Q8Weight t = make_q8(N, K, 99);
  ThreadPool pool(2);
  const auto set = kernels::KernelSet::select(CpuFeatures::host(), GetParam(), kernels::Precision::kFp32);
  const auto& e = set.get(kernels::Op::kLinear, DType::kQ8G64);
  std::vector<float> ref(K);
  for (int64_t M : {K, int64_t{3}}) {
    std::vector<float> x(M * K, 0.0f), y(M * N, -1.0f);
    for (int64_t i = 0; i < M; ++i) x[i * K + i] = 1.0f;
    kernels::run_linear(set, x.data(), M, K, t.w, nullptr, y.data(), pool);
    for (int64_t r = 0; r < N; ++r) {
      format_traits(DType::kQ8G64).row_to_f32(t.w, r, 0, K, ref.data());
      for (int64_t i = 0; i < M; ++i) ASSERT_EQ(y[i * N + r], ref[i]) << e.name << " M=" << M << " row " << r;
    }
  }
}

// A quantized token embedding (mflux's nn.quantize quantizes Qwen3's embed_tokens where its width
// allows): the backend's row gather dequantizes the rows asked for.
TEST(Q8G64Format, EmbeddingGatherDequantizesTheRows) {
  const Q8Weight t = make_q8(6, 128, 3);
  CpuBackend backend(CpuBackendOptions{1});
  Tensor out({3, 128});
  ASSERT_TRUE(backend.gather_rows(t.w, {4, 0, 4}, out).ok());
  const int rows[] = {4, 0, 4};
  for (int i = 0; i < 3; ++i)
    for (int64_t c = 0; c < 128; ++c) ASSERT_EQ(out.data()[i * 128 + c], q8_formula(t, rows[i], c));
}

// The header's quantization_level decides 8-bit groups of 64 against 4-bit groups of 128 (the same
// 512 bits per group); an mlx-lm "quantization" entry is checked against it.
TEST(Q8G64Format, HeaderLevelDecidesAndConfigIsChecked) {
  auto q8 = SafetensorsSource::open(mflux_dir() / "q8" / "transformer");
  ASSERT_TRUE(q8.ok()) << q8.status().to_string();
  auto w = (*q8)->get("x_embedder.weight");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->dtype, DType::kQ8G64);
  EXPECT_EQ(w->shape, (Shape{32, 128}));
  const nlohmann::json ok = {{"quantization", {{"bits", 8}, {"group_size", 64}}}};
  EXPECT_TRUE((*q8)->check_quantization(ok, "config.json").ok());
  const nlohmann::json wrong = {{"quantization", {{"bits", 4}, {"group_size", 64}}}};
  const Status st = (*q8)->check_quantization(wrong, "config.json");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("fits MLX 4-bit with groups of 128 or 8-bit with groups of 64"), std::string::npos)
      << st.message();
}

// --- the name maps ------------------------------------------------------------------------------

TEST(MfluxNameMap, RenamesAsFlux2WeightMapping) {
  auto one = [](const NameMap& m, const std::string& s) {
    auto t = map_name(m, s);
    return t.size() == 1 ? t[0].target : std::string("?");
  };
  EXPECT_EQ(one(mflux_flux2_dit_map(), "time_guidance_embed.linear_1.weight"),
            "time_guidance_embed.timestep_embedder.linear_1.weight");
  EXPECT_EQ(one(mflux_flux2_dit_map(), "transformer_blocks.1.attn.to_out.weight"),
            "transformer_blocks.1.attn.to_out.0.weight");
  EXPECT_EQ(one(mflux_flux2_dit_map(), "single_transformer_blocks.1.attn.to_out.weight"),
            "single_transformer_blocks.1.attn.to_out.weight");
  EXPECT_EQ(one(mflux_flux2_vae_map(), "decoder.mid_block.attentions.0.to_out.bias"),
            "decoder.mid_block.attentions.0.to_out.0.bias");
  EXPECT_EQ(one(mflux_qwen3_map(), "layers.3.mlp.up_proj.weight"), "model.layers.3.mlp.up_proj.weight");
  auto back = unmap_name(mflux_flux2_dit_map(), "transformer_blocks.0.attn.to_out.0.weight");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->source, "transformer_blocks.0.attn.to_out.weight");
  // The permutation's shape, and its refusal of a tensor that is not 4-D.
  const auto conv = map_name(mflux_flux2_vae_map(), "encoder.down_blocks.2.resnets.1.conv_shortcut.weight");
  ASSERT_EQ(conv.size(), 1u);
  EXPECT_EQ(mflux_flux2_vae_map().rules[conv[0].rule].op, NameOp::kOhwiToOihw);
  auto s = mapped_shape(mflux_flux2_vae_map(), conv[0], "c", Shape{8, 3, 3, 4});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (Shape{8, 4, 3, 3}));
  EXPECT_FALSE(mapped_shape(mflux_flux2_vae_map(), conv[0], "c", Shape{8, 4}).ok());
}

// The OHWI → OIHW copy gives back the tiny VAE's diffusers tensors bit for bit: mlx wrote every
// conv transposed (0, 2, 3, 1), so every weight must come back equal, conv or not.
TEST(MfluxNameMap, PackVaeEqualsTheDiffusersVae) {
  auto pack = SafetensorsSource::open(mflux_dir() / "q4" / "vae");
  ASSERT_TRUE(pack.ok()) << pack.status().to_string();
  auto mapped = MappedSource::create(*pack, mflux_flux2_vae_map());
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  auto tiny = WeightStore::open(testing::tiny_model_dir() / "vae");
  ASSERT_TRUE(tiny.ok());
  int convs = 0;
  for (const std::string& n : tiny->names()) {
    if (n.ends_with("num_batches_tracked")) continue;
    auto w = (*mapped)->get(n);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const TensorEntry* e = tiny->entry(n);
    ASSERT_EQ(w->shape, e->shape) << n;
    ASSERT_EQ(w->dtype, e->dtype) << n;
    ASSERT_EQ(std::memcmp(w->data, e->data, e->nbytes), 0) << n;
    convs += e->shape.size() == 4;
  }
  EXPECT_GT(convs, 20);
}

// --- the packs against diffusers ------------------------------------------------------------------

struct Compare {
  double rel = 0, psnr = 0;
};

// max|a - b| / max|b| and PSNR (peak = max|b|) of a against b.
Compare compare(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0, se = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num = std::max(num, std::fabs(d));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
    se += d * d;
  }
  const double mse = se / static_cast<double>(b.size());
  return {num / den, mse > 0 ? 10 * std::log10(den * den / mse) : INFINITY};
}

// The pack's component as the resolver opens it.
api::ComponentSpec pack_spec(const std::string& pack, const std::string& role) {
  auto l = api::resolve_layout({(mflux_dir() / pack).string()});
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return {};
  EXPECT_EQ(l->kind, "mflux pack");
  const api::ComponentSlot& s = role == "transformer" ? l->transformer : role == "vae" ? l->vae : l->text_encoder;
  EXPECT_TRUE(s.spec.has_value()) << s.error.to_string();
  return s.spec ? *s.spec : api::ComponentSpec{};
}

TEST(MfluxPack, TransformerMatchesDiffusersWithMlxDequantizedWeights) {
  const fs::path d = mflux_dir();
  Tensor img = testing::must_read_npy(d / "hidden_states.npy").to_tensor(), txt = testing::must_read_npy(d / "encoder_hidden_states.npy").to_tensor();
  const float t = testing::must_read_npy(d / "timestep.npy").to_f32()[0];
  const Flux2Ids iid = testing::flux2_ids_of(testing::must_read_npy(d / "img_ids.npy")), tid = testing::flux2_ids_of(testing::must_read_npy(d / "txt_ids.npy"));
  const std::vector<float> full = testing::must_read_npy(d / "full_transformer.npy").to_f32();
  CpuBackend backend(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &backend;
  for (const auto& [pack, format] : {std::pair<std::string, DType>{"q4", DType::kQ4G64}, {"q8", DType::kQ8G64}}) {
    SCOPED_TRACE(pack);
    const api::ComponentSpec spec = pack_spec(pack, "transformer");
    ASSERT_EQ(spec.role, "transformer");
    auto src = spec.open();
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    auto x = (*src)->get("x_embedder.weight");
    ASSERT_TRUE(x.ok());
    EXPECT_EQ(x->dtype, format);
    auto model = Flux2Transformer::load(*src, spec.config, spec.config_where);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto out = model->forward(img, txt, t, iid, tid, ctx);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const std::vector<float> ref = testing::must_read_npy(d / pack / "ref_transformer.npy").to_f32();
    ASSERT_EQ(out->numel(), static_cast<int64_t>(ref.size()));
    const Compare vs_ref = compare(out->data(), ref), vs_full = compare(out->data(), full);
    std::printf("[mflux %s] transformer vs diffusers (MLX-dequantized weights): rel %.3g; vs full precision: "
                "PSNR %.1f dB\n", pack.c_str(), vs_ref.rel, vs_full.psnr);
    EXPECT_LE(vs_ref.rel, 1e-4);
  }
}

TEST(MfluxPack, VaeDecodeMatchesDiffusers) {
  const api::ComponentSpec spec = pack_spec("q4", "vae");
  auto src = spec.open();
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  auto vae = Flux2Vae::load(*src, spec.config, spec.config_where);
  ASSERT_TRUE(vae.ok()) << vae.status().to_string();
  CpuBackend backend(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &backend;
  auto img = vae->decode(testing::must_read_npy(mflux_dir() / "z.npy").to_tensor(), ctx);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  const std::vector<float> ref = testing::must_read_npy(mflux_dir() / "q4" / "ref_vae_decode.npy").to_f32();
  ASSERT_EQ(img->numel(), static_cast<int64_t>(ref.size()));
  const Compare c = compare(img->data(), ref);
  std::printf("[mflux q4] VAE decode vs diffusers: rel %.3g\n", c.rel);
  EXPECT_LE(c.rel, 1e-4);
}

// The pack's text encoder is the tiny one's bf16 weights under mflux's names (none of its layers
// is 64 wide): through the map it must give the tiny model's hidden states bit for bit.
TEST(MfluxPack, TextEncoderEqualsTheTinyOnesThroughTheMap) {
  const api::ComponentSpec spec = pack_spec("q4", "text_encoder");
  auto src = spec.open();
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  auto pack = Qwen3Encoder::load(*src, spec.config, spec.config_where, 27);
  ASSERT_TRUE(pack.ok()) << pack.status().to_string();
  auto tiny = Qwen3Encoder::load(testing::tiny_model_dir() / "text_encoder", 27);
  ASSERT_TRUE(tiny.ok()) << tiny.status().to_string();
  CpuBackend backend(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &backend;
  const std::vector<int32_t> ids = {151644, 872, 198, 64, 2518, 23739, 151645, 198}, mask(ids.size(), 1);
  auto a = pack->encode(ids, mask, {9, 18, 27}, ctx), b = tiny->encode(ids, mask, {9, 18, 27}, ctx);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->numel(), b->numel());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), sizeof(float) * a->numel()), 0);
}

// --- the whole pipeline -------------------------------------------------------------------------

GenerateRequest request() {
  GenerateRequest r;
  r.prompt = "a red cube on a table";
  r.width = 64;
  r.height = 48;
  r.seed = 11;
  return r;
}

double image_psnr(const Image& a, const Image& b) {
  double se = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) se += (double(a.rgb[i]) - b.rgb[i]) * (double(a.rgb[i]) - b.rgb[i]);
  const double mse = se / static_cast<double>(a.rgb.size());
  return mse > 0 ? 10 * std::log10(255.0 * 255.0 / mse) : INFINITY;
}

TEST(MfluxPack, ApiGeneratesFromEachPackAndReportsPsnr) {
  auto full = Model::open(testing::tiny());
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  auto want = (*full)->generate(request());
  ASSERT_TRUE(want.ok());
  // The q8 pack holds the transformer only: the tiny model's text encoder and VAE files are added.
  LoadOptions add;
  add.text_encoder = (testing::tiny_model_dir() / "text_encoder" / "model.safetensors").string();
  add.vae = (testing::tiny_model_dir() / "vae" / "diffusion_pytorch_model.safetensors").string();
  for (const auto& [pack, options] : {std::pair<std::string, LoadOptions>{"q4", {}}, {"q8", add}}) {
    SCOPED_TRACE(pack);
    auto m = Model::open((mflux_dir() / pack).string(), options);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto got = (*m)->generate(request());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->image.rgb.size(), want->image.rgb.size());
    const double psnr = image_psnr(got->image, want->image);
    std::printf("[mflux %s] image PSNR vs the full-precision tiny model: %.1f dB\n", pack.c_str(), psnr);
    EXPECT_GT(psnr, 10.0);  // the same picture, not noise (q4 of a 32-wide model is coarse)
  }
}

TEST(MfluxPack, CliInfoNamesThePackAndGenerates) {
  const fs::path q4 = mflux_dir() / "q4";
  auto r = testing::run_cli("info --model " + quoted(q4));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mflux pack"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mflux"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MLX 4-bit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 file(s)"), std::string::npos) << r.out;  // the transformer's two shards
  const fs::path dir = testing::make_temp_dir("mflux_cli");
  r = testing::run_cli("generate --model " + quoted(q4) +
                       " -q -W 64 -H 48 --seed 11 --prompt 'a red cube' --threads 2 -o " + quoted(dir / "a.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(dir / "a.png"));
}

// --- broken packs ---------------------------------------------------------------------------------

fs::path copy_pack(const std::string& tag) {
  const fs::path dir = testing::make_temp_dir(tag) / "pack";
  fs::copy(mflux_dir() / "q4", dir, fs::copy_options::recursive);
  return dir;
}

// One line naming what is wrong and where.
void expect_error(const fs::path& pack, const std::string& a, const std::string& b) {
  auto m = Model::open(pack.string());
  ASSERT_FALSE(m.ok());
  const std::string msg = m.status().message();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find(a), std::string::npos) << msg;
  EXPECT_NE(msg.find(b), std::string::npos) << msg;
}

// The variant cannot be read from weights: a pack whose folder name says "base" gets the note.
TEST(MfluxPack, APackNamedBaseGetsTheVariantNote) {
  const fs::path dir = testing::make_temp_dir("mflux_base") / "flux2-klein-base-4b-mflux-4bit";
  fs::copy(mflux_dir() / "q4", dir, fs::copy_options::recursive);
  auto l = api::resolve_layout({dir.string()});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  ASSERT_EQ(l->notes.size(), 1u);
  EXPECT_TRUE(l->notes[0].starts_with("flux2-klein-base-4b-mflux-4bit: ")) << l->notes[0];
}

TEST(MfluxPack, AMissingShardIsNamed) {
  const fs::path pack = copy_pack("mflux_shard");
  fs::remove(pack / "transformer" / "1.safetensors");
  expect_error(pack, "transformer", "1.safetensors");
}

TEST(MfluxPack, AQuantizedWeightWithoutScalesIsNamed) {
  const fs::path pack = copy_pack("mflux_scales");
  // Shard 0 rewritten without one quantized weight's scales (its biases stay).
  const fs::path shard = pack / "transformer" / "0.safetensors";
  std::string dropped;
  {
    auto st = WeightStore::open(mflux_dir() / "q4" / "transformer" / "0.safetensors");
    ASSERT_TRUE(st.ok());
    std::vector<TensorToWrite> keep;
    for (const std::string& n : st->names()) {
      const TensorEntry* e = st->entry(n);
      if (dropped.empty() && n.ends_with(".scales")) {
        dropped = n;
        continue;
      }
      keep.push_back({n, e->dtype, e->shape, e->data});
    }
    ASSERT_FALSE(dropped.empty());
    ASSERT_TRUE(write_safetensors(pack / "transformer" / "0.tmp", keep, st->metadata()).ok());
  }
  fs::rename(pack / "transformer" / "0.tmp", shard);
  fs::remove(pack / "transformer" / "model.safetensors.index.json");  // the shards alone
  expect_error(pack, dropped, "missing");
}

TEST(MfluxPack, AnUnknownQuantizationLevelIsRefused) {
  const fs::path pack = copy_pack("mflux_level");
  for (const char* f : {"0.safetensors", "1.safetensors"}) {
    auto st = WeightStore::open(mflux_dir() / "q4" / "transformer" / f);
    ASSERT_TRUE(st.ok());
    std::vector<TensorToWrite> all;
    for (const std::string& n : st->names()) {
      const TensorEntry* e = st->entry(n);
      all.push_back({n, e->dtype, e->shape, e->data});
    }
    auto meta = st->metadata();
    meta["quantization_level"] = "3";
    ASSERT_TRUE(write_safetensors(pack / "transformer" / (std::string(f) + ".tmp"), all, meta).ok());
    fs::rename(pack / "transformer" / (std::string(f) + ".tmp"), pack / "transformer" / f);
  }
  expect_error(pack, "quantization_level \"3\"", "klein computes MLX 4-bit");
}

}  // namespace klein::mflux_test
