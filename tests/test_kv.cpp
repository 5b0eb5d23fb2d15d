// The 9B family: the 9B-shaped tiny model (tests/data/tiny_9b) against diffusers' Flux2KleinPipeline,
// and the KV-cached reference-editing variant (FLUX.2 klein 9B-KV, tests/data/tiny_9b_kv) against
// the real Flux2KleinKVPipeline, in float32 (tests/data/ref_9b from
// scripts/reference/dump_9b_reference.py); the transformer's extract and cached calls against each
// other, the memory plan's count of the cache, the pairing check, and the variant's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "api/memory_needs.h"
#include "backend/cpu/cpu_backend.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::testing::max_rel_err;
using klein::testing::must_read_f32;

namespace {

fs::path kv_ref_dir() { return klein::testing::data_dir() / "ref_9b"; }
std::string tiny_kv() { return (klein::testing::data_dir() / "tiny_9b_kv").string(); }
std::string tiny_9b() { return (klein::testing::data_dir() / "tiny_9b").string(); }

struct KvCase {
  std::string name, prompt, kind, model;
  int width = 0, height = 0, width_arg = 0, height_arg = 0, steps = 0;
  uint64_t seed = 0;
  int64_t ref_tokens = 0;
  std::vector<std::string> refs;
};
void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name; }

std::vector<KvCase> kv_cases() {
  std::vector<KvCase> r;
  auto j = klein::read_json_file(kv_ref_dir() / "manifest.json");
  if (!j.ok()) return r;
  for (const auto& c : (*j)["cases"]) {
    KvCase k;
    k.name = c["name"];
    k.kind = c["kind"];
    k.model = c["model_dir"];
    k.prompt = c["prompt"];
    k.width = c["width"];
    k.height = c["height"];
    k.width_arg = c["width_arg"].is_number() ? c["width_arg"].get<int>() : 0;
    k.height_arg = c["height_arg"].is_number() ? c["height_arg"].get<int>() : 0;
    k.steps = c["num_inference_steps"];
    k.seed = c["seed"];
    k.ref_tokens = c["ref_tokens"];
    k.refs = c["refs"].get<std::vector<std::string>>();
    r.push_back(std::move(k));
  }
  return r;
}

class NineBRef : public ::testing::TestWithParam<KvCase> {};

// Every step's velocity (KV edits: step 1 is the extract call, later steps the cached calls) and
// latents, the decoder input, the float image and the 8-bit picture equal diffusers'.
TEST_P(NineBRef, MatchesDiffusers) {
  const KvCase& c = GetParam();
  const fs::path ref = kv_ref_dir() / c.name;
  const fs::path dump = klein::testing::make_temp_dir("kv_ref");
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.precision = klein::Precision::kFp32;  // the exact path is diffusers' float32 pipeline
  auto model = klein::Model::open((klein::testing::data_dir() / fs::path(c.model).filename()).string(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_TRUE((*model)->distilled());
  klein::GenerateRequest g;
  g.prompt = c.prompt;
  g.width = c.width_arg;
  g.height = c.height_arg;
  g.steps = c.steps;
  g.seed = c.seed;
  for (const auto& f : c.refs) g.reference_images.push_back((ref / f).string());
  g.dump = {dump.string(), "noise,velocity_step,latents_step,latents_final,image"};
  auto r = (*model)->generate(g);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->width, c.width);
  EXPECT_EQ(r->height, c.height);
  EXPECT_EQ(must_read_f32(dump / "noise.npy"), must_read_f32(ref / "noise.npy"));
  for (int k = 1; k <= c.steps; ++k) {
    for (const char* what : {"velocity_step", "latents_step"}) {
      const std::string n = what + std::to_string(k) + ".npy";
      const double err = max_rel_err(must_read_f32(dump / n), must_read_f32(ref / n));
      std::printf("[kv %s] %s: max|ours-ref|/max|ref| = %.3g\n", c.name.c_str(), n.c_str(), err);
      EXPECT_LE(err, 1e-5) << n;
    }
  }
  EXPECT_LE(max_rel_err(must_read_f32(dump / "latents_final.npy"), must_read_f32(ref / "latents_final.npy")), 1e-5);
  EXPECT_LE(max_rel_err(must_read_f32(dump / "image.npy"), must_read_f32(ref / "image.npy")), 1e-5) << "float image";
  auto u8 = klein::read_npy(ref / "image_u8.npy");
  ASSERT_TRUE(u8.ok());
  const auto [equal, maxd] = klein::testing::u8_agreement(u8->bytes, r->image.rgb);
  EXPECT_GE(equal, 0.999);
  EXPECT_LE(maxd, 1);
  fs::remove_all(dump);
}

INSTANTIATE_TEST_SUITE_P(Tiny, NineBRef, ::testing::ValuesIn(kv_cases()),
                         [](const auto& info) { return info.param.name; });

klein::Tensor random_tensor(const klein::Shape& s, uint32_t seed) {
  klein::Tensor t(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = d(g);
  return t;
}

}  // namespace

TEST(KvVariant, FixturesCoverOneTwoAndFourReferences) {
  std::vector<int> counts;
  int nine = 0;
  for (const auto& c : kv_cases()) {
    if (c.kind == "kv") counts.push_back(static_cast<int>(c.refs.size()));
    nine += c.kind == "9b";
  }
  for (int n : {0, 1, 2, 4}) EXPECT_NE(std::find(counts.begin(), counts.end(), n), counts.end()) << n << " refs";
  EXPECT_GE(nine, 2);
}

// A 9B transformer with a 4B text encoder (and the reverse): one line naming both files and the
// widths, before anything loads.
TEST(NineB, WrongEncoderPairingNamesBothFiles) {
  const fs::path d = klein::testing::data_dir();
  const std::string te4 = (d / "tiny" / "text_encoder" / "model.safetensors").string();
  const std::string te9 = (d / "tiny_9b" / "text_encoder" / "model.safetensors").string();
  const std::string dit9 = (d / "tiny_9b" / "transformer" / "diffusion_pytorch_model.safetensors").string();
  const std::string dit4 = (d / "tiny" / "transformer" / "diffusion_pytorch_model.safetensors").string();
  for (auto [model, te, dit] : {std::tuple{tiny_9b(), te4, dit9}, std::tuple{klein::testing::tiny(), te9, dit4}}) {
    klein::LoadOptions lo;
    lo.text_encoder = te;
    auto m = klein::Model::open(model, lo);
    ASSERT_FALSE(m.ok()) << te;
    const std::string msg = m.status().message();
    EXPECT_NE(msg.find("wrong pairing"), std::string::npos) << msg;
    EXPECT_NE(msg.find(te), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // The right encoder as a file: it opens.
  klein::LoadOptions lo;
  lo.text_encoder = te9;
  auto ok = klein::Model::open(tiny_9b(), lo);
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

// The cache holds what the extract call's image rows attended to: a cached call on the same
// inputs gives the extract call's output (the same keys and values, summed in another order),
// and the cache has one [R, 2D] layer per block.
TEST(KvVariant, CachedCallEqualsTheExtractCall) {
  using namespace klein;
  auto m = Flux2Transformer::load(klein::testing::tiny_model_dir() / "transformer");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const Flux2Config& c = m->config();
  CpuBackend be(CpuBackendOptions{2, Isa::kCount, kernels::Precision::kFp32});
  RunContext ctx;
  ctx.backend = &be;
  const int64_t T = 7, N = 12, R = 10;  // 3x4 noise tokens, a 2x5 reference
  Tensor txt = random_tensor({T, c.joint_attention_dim}, 1);
  Tensor noise = random_tensor({N, c.in_channels}, 2), refs = random_tensor({R, c.in_channels}, 3);
  Tensor both({R + N, c.in_channels});
  std::copy(refs.data(), refs.data() + refs.numel(), both.data());
  std::copy(noise.data(), noise.data() + noise.numel(), both.data() + refs.numel());
  Flux2Ids ids = flux2_image_ids(2, 5, 10), img_ids = flux2_image_ids(3, 4, 0);
  ids.insert(ids.end(), img_ids.begin(), img_ids.end());
  const Flux2Ids txt_ids = flux2_text_ids(static_cast<int>(T));
  Flux2KvCache cache;
  Flux2KvStep ex;
  ex.mode = Flux2KvStep::Mode::kExtract;
  ex.ref_tokens = R;
  ex.cache = &cache;
  auto a = m->forward(both, txt, 0.75f, ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &ex);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_EQ(a->dim(0), N);
  ASSERT_TRUE(cache.filled());
  EXPECT_EQ(cache.layers.size(), static_cast<size_t>(c.num_layers + c.num_single_layers));
  EXPECT_EQ(cache.bytes(), Flux2KvCache::bytes_for(R, c.num_layers + c.num_single_layers, c.inner_dim()));
  Flux2KvStep ca;
  ca.mode = Flux2KvStep::Mode::kCached;
  ca.cache = &cache;
  auto b = m->forward(noise, txt, 0.75f, img_ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &ca);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const std::vector<float> va(a->data(), a->data() + a->numel()), vb(b->data(), b->data() + b->numel());
  EXPECT_LE(max_rel_err(vb, va), 1e-5);
  // The references change the output (they are attended to), and trimming to fewer rows keeps
  // the leading rows' values.
  auto plain = m->forward(noise, txt, 0.75f, img_ids, txt_ids, ctx);
  ASSERT_TRUE(plain.ok());
  const std::vector<float> vp(plain->data(), plain->data() + plain->numel());
  EXPECT_GT(max_rel_err(vp, va), 1e-3);
  auto trimmed = m->forward(noise, txt, 0.75f, img_ids, txt_ids, ctx, std::nullopt, 5, nullptr, nullptr, &ca);
  ASSERT_TRUE(trimmed.ok());
  const std::vector<float> vt(trimmed->data(), trimmed->data() + trimmed->numel());
  EXPECT_LE(max_rel_err(vt, std::vector<float>(va.begin(), va.begin() + vt.size())), 1e-5);

  // A bf16 cache (fast's): half the bytes, the cached call within bf16 rounding of the extract call.
  Flux2KvCache half;
  Flux2KvStep exh = ex;
  exh.cache = &half;
  exh.bf16 = true;
  ASSERT_TRUE(m->forward(both, txt, 0.75f, ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &exh).ok());
  EXPECT_TRUE(half.bf16);
  EXPECT_EQ(half.bytes() * 2, cache.bytes());
  Flux2KvStep cah = ca;
  cah.cache = &half;
  auto h = m->forward(noise, txt, 0.75f, img_ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &cah);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const double herr = max_rel_err(std::vector<float>(h->data(), h->data() + h->numel()), va);
  std::printf("cached call through a bf16 cache vs the extract call: max rel err %.3g\n", herr);
  EXPECT_GT(herr, 0.0);
  EXPECT_LE(herr, 1e-2);

  // Misuse: no cache, an unfilled cache, references covering every token, too many outputs.
  Flux2KvStep bad = ca;
  bad.cache = nullptr;
  EXPECT_EQ(m->forward(noise, txt, 0.75f, img_ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &bad).status().code(),
            Code::kInvalidArgument);
  Flux2KvCache empty;
  bad.cache = &empty;
  EXPECT_EQ(m->forward(noise, txt, 0.75f, img_ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &bad).status().code(),
            Code::kInvalidArgument);
  Flux2KvStep all = ex;
  all.ref_tokens = R + N;
  Flux2KvCache c2;
  all.cache = &c2;
  EXPECT_EQ(m->forward(both, txt, 0.75f, ids, txt_ids, ctx, std::nullopt, -1, nullptr, nullptr, &all).status().code(),
            Code::kInvalidArgument);
  EXPECT_FALSE(c2.filled()) << "a failed extract leaves no usable cache";
  Flux2KvCache c3;
  Flux2KvStep over = ex;
  over.cache = &c3;
  EXPECT_EQ(m->forward(both, txt, 0.75f, ids, txt_ids, ctx, std::nullopt, N + 1, nullptr, nullptr, &over).status().code(),
            Code::kInvalidArgument);
}

TEST(KvVariant, MemoryPlanCountsTheCache) {
  klein::api::WeightSizes w;
  klein::Qwen3Config te;
  te.hidden_size = 64, te.num_heads = 4, te.num_kv_heads = 2, te.head_dim = 16;
  te.intermediate_size = 128;
  auto dit = klein::Flux2Config::from_json(
      {{"num_layers", 8}, {"num_single_layers", 24}, {"attention_head_dim", 128}, {"num_attention_heads", 32},
       {"in_channels", 128}, {"joint_attention_dim", 12288}, {"axes_dims_rope", {32, 32, 32, 32}}},
      "9B-shaped");
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  klein::Flux2VaeConfig vae;
  vae.block_out_channels = {128, 256, 512, 512};
  klein::api::RequestShape r;
  r.width = r.height = 1024;
  r.ref_tokens = 4096;  // one 1024² reference
  r.editing = true;
  const auto plain = klein::api::estimate_needs(w, te, *dit, vae, r);
  r.kv = true;
  const auto kv = klein::api::estimate_needs(w, te, *dit, vae, r);
  // 9B, one 1024² reference: 2 (K, V) x 4096 tokens x 4096 x 4 bytes x 32 blocks = 4 GiB in float32.
  EXPECT_EQ(kv.dit_activations - plain.dit_activations, uint64_t{4} << 30);
  r.kv_bf16 = true;  // fast: half
  EXPECT_EQ(klein::api::estimate_needs(w, te, *dit, vae, r).dit_activations - plain.dit_activations, uint64_t{2} << 30);
}

// The packed bf16 store: the CPU backend's in-place conversion gives the default composition's
// bits (through the host), each value torch's round-to-nearest-even bf16, strided views included.
TEST(KvVariant, Bf16PackRoundTrips) {
  using namespace klein;
  CpuBackend be(CpuBackendOptions{2});
  const int64_t R = 37, C = 300;  // more than one 256-value chunk per row
  Tensor src = random_tensor({R, 2 * C + 6}, 9);
  src.data()[5] = std::numeric_limits<float>::infinity();
  src.data()[7] = 1.0f + 1.0f / 256;  // a tie: rounds to even (1.0)
  const TensorView wide = src.view().col_range(3, 3 + 2 * C);
  Tensor p1({R, C}), p2({R, C}), back({R, 2 * C});
  ASSERT_TRUE(be.pack_bf16(wide, p1).ok());
  ASSERT_TRUE(be.Backend::pack_bf16(wide, p2).ok());
  EXPECT_EQ(std::memcmp(p1.data(), p2.data(), sizeof(float) * R * C), 0);
  ASSERT_TRUE(be.unpack_bf16(p1, back).ok());
  Tensor back2({R, 2 * C});
  ASSERT_TRUE(be.Backend::unpack_bf16(p1, back2).ok());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < 2 * C; ++c) {
      const float want = round_bf16(src.data()[r * (2 * C + 6) + 3 + c]);
      ASSERT_EQ(back.data()[r * 2 * C + c], want) << r << "," << c;
      ASSERT_EQ(back2.data()[r * 2 * C + c], want) << r << "," << c;
    }
  EXPECT_EQ(back.data()[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(back.data()[4], 1.0f);
  Tensor bad({R, C + 1});
  EXPECT_EQ(be.pack_bf16(wide, bad).code(), Code::kInvalidArgument);
  EXPECT_EQ(be.Backend::unpack_bf16(bad, back).code(), Code::kInvalidArgument);
}

TEST(KvVariant, VariantComesFromTheFolderOrTheOption) {
  auto kv = klein::Model::open(tiny_kv());
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  auto info = klein::Model::inspect(tiny_kv());
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_TRUE(info->kv);
  EXPECT_TRUE(info->distilled);
  auto plain = klein::Model::inspect(klein::testing::tiny());
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->kv);
  // --variant kv on a folder that is not the KV pipeline's: one line naming model_index.json.
  klein::LoadOptions lo;
  lo.variant = klein::Variant::kKv;
  auto bad = klein::Model::open(klein::testing::tiny(), lo);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model_index.json"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("Flux2KleinKVPipeline"), std::string::npos) << bad.status().to_string();
}

// The KV fixtures do test the KV path: the same edit through the plain pipeline (tiny_9b, the same
// weights) ends elsewhere (the references are modulated and attended differently).
TEST(KvVariant, PlainPipelineMissesTheKvFixture) {
  const fs::path ref = kv_ref_dir() / "kv_1ref";
  const fs::path dump = klein::testing::make_temp_dir("kv_plain");
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.precision = klein::Precision::kFp32;
  auto model = klein::Model::open(tiny_9b(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  klein::GenerateRequest g;
  g.prompt = "A cat holding a sign that says hello world";
  g.width = g.height = 64;
  g.steps = 3;
  g.seed = 42;
  g.reference_images = {(ref / "ref0.png").string()};
  g.dump = {dump.string(), "velocity_step"};
  ASSERT_TRUE((*model)->generate(g).ok());
  EXPECT_GT(max_rel_err(must_read_f32(dump / "velocity_step1.npy"), must_read_f32(ref / "velocity_step1.npy")), 1e-3);
  fs::remove_all(dump);
}
