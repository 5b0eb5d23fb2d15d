// klein's quantized paths against the Python oracle of the same quantization
// (scripts/reference/dump_quant_reference.py; fixtures tests/data/ref_quant, described in
// scripts/reference/README.md §7): `klein quantize --type q8|q4` must write the recipes' bytes,
// and `--precision fast` on every ISA of this CPU must compute what the oracle computes — the
// diffusers pipeline in float32 with klein's W8A8 / W4A8 / bf16-dot arithmetic on every Linear.
//
// Which arithmetic an ISA gets is klein's kernel selection, so each run asks its KernelSet
// whether Q4_G64 linears are W4A8 (under fast; dequantized float32 under fp32) and whether float linears are bf16
// dot products (else float32), and compares with the fixture of that combination.
//
// Every component is fed the reference's input, so that a difference is the component's own:
// text encoder <- prompt (and each of layers 8, 17, 26 <- the reference's hidden state),
// denoising <- reference prompt_embeds, each transformer step <- reference latents, VAE <-
// reference latents. Errors are ||klein - ref|| / ||ref||.
//
// Why not 1e-4 everywhere: int8 (and bf16) activation rounding turns a last-bit float32
// difference (klein's norms, attention and GEMMs sum in another order than torch's) into a whole
// quantization step when a value lies on a rounding boundary. With the same input a layer agrees
// to ~5e-8 except for such flips, each confined to one token (measured); through the stack they
// grow: the oracle moves itself by up to 2e-2 (prompt_embeds) and 4e-3 (velocities) when its
// own rounding inputs change by one ulp (the manifest's "envelope"), which is as large as the
// whole effect of quantization. So:
//   - arithmetic without activation rounding (q4 dequantized to float32, float32 float layers;
//     the VAE wherever its convs are float32, the Winograd form's too): every boundary <= 1e-4;
//   - the VAE's image where its convs round to bf16 (AVX512_BF16, AMX): within 1.25 × the
//     oracle's own envelope or kBf16ConvImage, whichever is larger. A single flipped bf16 input of
//     the tiny VAE's mid-block attention moves the image by ~7e-3 (measured), as far as bf16 convs
//     are from float32 ones, so on the tiny model this bound cannot tell those apart;
//     test_conv2d.cpp's FastMatchesItsRef pins the conv's bf16 arithmetic against
//     ref::conv2d_bf16 (and ref::conv2d_bf16_subpixel) instead;
//   - text-encoder layers: at most 1 % of the 512 tokens beyond 1e-4 (a flip moves one token);
//   - transformer steps: within half the distance between the reference and the same
//     computation without quantization (rel_to_unquantized), i.e. klein computes the quantized
//     model, not the unquantized one; flips make a tighter bound unreliable;
//   - prompt_embeds and the free-running denoising loop with rounding: printed, not bounded
//     (their flip envelope reaches the size of the quantization effect).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/cpu_features.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/qwen3.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;

namespace {

fs::path ref_root() { return klein::testing::data_dir() / "ref_quant"; }

// The tiny VAE's image with bf16 convs is 6e-3 to 2.3e-2 from the float32 one (measured on Zen 4
// from the q8 and q4 fixtures' latents), while the q4 fixture's envelope is 5.9e-3. The
// AVX512_BF16 conv's sub-pixel upsampling, whose summed taps round once, moved the q4 one from
// 6.1e-3 to 1.2e-2 and the q8 one from 1.2e-2 to 1.3e-2; its Winograd form of the other 3×3
// convs, whose transformed operands round (each conv ~2× the direct form's rounding error, see
// Conv2dRef.WinogradFormEqualsConv), to 2.3e-2 and 2.1e-2. Summing the wrong 3×3 taps into a
// phase (subpixel_hi off by one) moved it by 1.1 (measured).
constexpr double kBf16ConvImage = 3e-2;

nlohmann::json manifest() {
  auto j = read_json_file(ref_root() / "manifest.json");
  return j.ok() ? *j : nlohmann::json::object();
}

// The fixture cases (one per type and arithmetic), from the manifest.
std::vector<nlohmann::json> cases() {
  std::vector<nlohmann::json> r;
  for (const auto& c : manifest().value("cases", nlohmann::json::array())) r.push_back(c);
  return r;
}

// Temporary folders of this process (a model copy and quantized folders, ~60 MB), removed at exit.
struct TempDirs {
  std::vector<fs::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) fs::remove_all(d, ec);
  }
  fs::path make(const std::string& tag) { return dirs.emplace_back(klein::testing::make_temp_dir(tag)); }
};
TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}

std::string variant_of(const nlohmann::json& c) { return c["variant"].is_string() ? c["variant"].get<std::string>() : ""; }

// The model a case quantizes: tests/data/tiny, or tiny with text_encoder/ and transformer/ of
// tests/data/tiny_<variant> (the variant holds only those two; see make_tiny_model.py).
fs::path source_model(const std::string& variant) {
  if (variant.empty()) return klein::testing::tiny_model_dir();
  static std::map<std::string, fs::path> made;
  if (made.count(variant)) return made[variant];
  const fs::path d = temp_dirs().make("tiny_" + variant) / "model";
  fs::copy(klein::testing::tiny_model_dir(), d, fs::copy_options::recursive);
  for (const char* comp : {"text_encoder", "transformer"}) {
    fs::remove_all(d / comp);
    fs::copy(klein::testing::data_dir() / ("tiny_" + variant) / comp, d / comp, fs::copy_options::recursive);
  }
  return made[variant] = d;
}

// `klein quantize --type type` of that model, once per process.
fs::path quantized(const std::string& type, const std::string& variant) {
  static std::map<std::string, fs::path> made;
  const std::string key = type + "/" + variant;
  if (made.count(key)) return made[key];
  const fs::path out = temp_dirs().make("quant_ref_" + type) / "model";
  QuantizeOptions o;
  o.model = source_model(variant).string();
  o.output = out.string();
  o.type = type;
  o.threads = 2;
  const Status st = quantize_model(o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return made[key] = out;
}

uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::vector<float> load(const fs::path& p) {
  auto a = read_npy(p);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? a->to_f32() : std::vector<float>{};
}

// ||a - b|| / ||b|| in double.
double rel(const float* a, const float* b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    m += static_cast<double>(b[i]) * b[i];
  }
  return m > 0 ? std::sqrt(d / m) : std::sqrt(d);
}
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return a.size() == b.size() ? rel(a.data(), b.data(), a.size()) : INFINITY;
}

// Rows (tokens) of `cols` values whose error ||a_r - b_r|| exceeds tol × the RMS row norm of b.
// a and b are [rows, ·] with row strides lda, ldb.
int rows_beyond(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t cols, double tol) {
  double ms = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ms += static_cast<double>(b[r * ldb + c]) * b[r * ldb + c];
  const double rms = std::sqrt(ms / rows);
  int n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double d = 0;
    for (int64_t c = 0; c < cols; ++c) d += std::pow(static_cast<double>(a[r * lda + c]) - b[r * ldb + c], 2);
    n += std::sqrt(d) > tol * rms;
  }
  return n;
}

// [1, C, h, w] latents <-> [h·w, C] tokens (token n = y·w + x), as the pipeline packs them.
Tensor pack(const std::vector<float>& lat, int64_t C, int64_t h, int64_t w) {
  Tensor t({h * w, C});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < h * w; ++n) t.data()[n * C + c] = lat[c * h * w + n];
  return t;
}
std::vector<float> unpack(const float* tok, int64_t C, int64_t h, int64_t w) {
  std::vector<float> r(C * h * w);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < h * w; ++n) r[c * h * w + n] = tok[n * C + c];
  return r;
}

}  // namespace

TEST(QuantRef, FixturesArePresent) {
  const auto cs = cases();
  ASSERT_EQ(cs.size(), 5u) << ref_root() / "manifest.json";
  for (const auto& c : cs)
    for (const auto& [f, desc] : c["files"].items()) EXPECT_TRUE(fs::exists(ref_root() / c["dir"].get<std::string>() / f)) << f;
}

// klein quantize writes exactly the bytes the oracle re-derived from the bf16 weights with the
// recipes of core/quantize.h (the oracle asserts that before hashing): every quantized tensor,
// its scales and biases.
TEST(QuantRef, KleinQuantizeWritesTheRecipeBytes) {
  std::map<std::string, nlohmann::json> by_model;  // one case per (type, variant) suffices
  for (const auto& c : cases()) by_model[c["type"].get<std::string>() + "/" + variant_of(c)] = c;
  ASSERT_EQ(by_model.size(), 2u);
  for (const auto& [key, c] : by_model) {
    SCOPED_TRACE(key);
    const fs::path q = quantized(c["type"], variant_of(c));
    for (const auto& [comp, hashes] : c["quantized_tensor_fnv1a64"].items()) {
      auto store = WeightStore::open(q / comp);
      ASSERT_TRUE(store.ok()) << store.status().to_string();
      size_t n_quant = 0;
      for (const std::string& name : store->names()) {
        const TensorEntry* e = store->entry(name);
        const bool companion = name.ends_with("_scale") || name.ends_with(".scales") || name.ends_with(".biases");
        if (e->dtype == DType::kI8 || e->dtype == DType::kU32 || companion) {
          ++n_quant;
          ASSERT_TRUE(hashes.contains(name)) << comp << "/" << name << " is quantized but not in the manifest";
          char hex[17];
          std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(e->data, e->nbytes)));
          EXPECT_EQ(hex, hashes[name].get<std::string>()) << comp << "/" << name;
        }
      }
      EXPECT_EQ(n_quant, hashes.size()) << comp;
      EXPECT_GT(n_quant, 0u) << comp;
    }
  }
}

struct QuantRun {
  std::string type;  // "q8" or "q4"
  Isa isa;
  kernels::Precision precision = kernels::Precision::kFast;
};

std::string run_name(const QuantRun& r) {
  return r.type + "_" + std::string(isa_name(r.isa)) + (r.precision == kernels::Precision::kFp32 ? "_fp32" : "");
}
void PrintTo(const QuantRun& r, std::ostream* os) { *os << run_name(r); }

// Every ISA under --precision fast, and q4 also under fp32: there Q4_G64 linears compute the
// dequantized weights in float32 (the q4_deq_f32 fixture: no activation rounding, so exact).
std::vector<QuantRun> quant_runs() {
  std::vector<QuantRun> r;
  for (const char* t : {"q8", "q4"})
    for (Isa isa : CpuFeatures::host().isas()) r.push_back({t, isa});
  for (Isa isa : CpuFeatures::host().isas()) r.push_back({"q4", isa, kernels::Precision::kFp32});
  return r;
}

class QuantRefPipeline : public ::testing::TestWithParam<QuantRun> {};

TEST_P(QuantRefPipeline, MatchesTheOracleAtEveryBoundary) {
  const QuantRun& run = GetParam();
  // The arithmetic this ISA gets at the run's precision, and the fixture of that arithmetic.
  const auto ks = kernels::KernelSet::select(CpuFeatures::host(), run.isa, run.precision);
  const std::string q4 = run.type == "q8" ? "none" : ks.get(kernels::Op::kLinear, DType::kQ4G64).fast ? "w4a8" : "deq";
  const std::string flt = ks.get(kernels::Op::kLinear, DType::kBF16).fast ? "bf16" : "f32";
  nlohmann::json c;
  for (const auto& x : cases())
    if (x["type"] == run.type && x["q4_linear"] == q4 && x["float_linear"] == flt) c = x;
  ASSERT_FALSE(c.is_null()) << "no fixture for " << run.type << " with Q4_G64 " << q4 << ", float linears " << flt;
  const std::string name = c["name"];
  SCOPED_TRACE(name);
  const bool exact = run.type == "q4" && q4 == "deq" && flt == "f32";  // no activation rounding anywhere
  const fs::path dir = ref_root() / name, qdir = quantized(run.type, variant_of(c));
  const int W = c["width"], H = c["height"], steps = c["steps"], h = H / 16, w = W / 16;
  const std::vector<float> pe = load(dir / "prompt_embeds.npy");
  const int64_t L = 512, E = static_cast<int64_t>(pe.size()) / L;  // prompt_embeds [1, L, E = 3·hidden]
  std::map<std::string, double> err;  // boundary -> ||klein - ref|| / ||ref||
  auto unquantized = [&](const std::string& k) { return c["rel_to_unquantized"][k].get<double>(); };

  LoadOptions lo;
  lo.threads = 2;
  lo.memory = MemoryPolicy::kResident;
  lo.isa = std::string(isa_name(run.isa));
  lo.precision = run.precision == kernels::Precision::kFast ? Precision::kFast : Precision::kFp32;
  auto model = Model::open(qdir.string(), lo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();

  // Text encoder, from the prompt.
  auto enc = (*model)->encode_prompt(c["prompt"].get<std::string>());
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
  err["prompt_embeds"] = rel(enc->data, pe);

  // Single text-encoder layers from the reference's hidden state: layer te_layers[i] maps
  // te_hidden_in[i] [L, hidden] to prompt_embeds columns [i·hidden, (i+1)·hidden).
  CpuBackend be(CpuBackendOptions{2, run.isa, run.precision});
  RunContext ctx;
  ctx.backend = &be;
  {
    auto te = Qwen3Encoder::load(qdir / "text_encoder", 27);
    ASSERT_TRUE(te.ok()) << te.status().to_string();
    ASSERT_TRUE(te->prepare(be).ok());
    const std::vector<float> hin = load(dir / "te_hidden_in.npy");  // [3, L, hidden]
    const int64_t hid = E / 3;
    const auto layers = c["te_layers"].get<std::vector<int>>();
    for (size_t i = 0; i < layers.size(); ++i) {
      Tensor x({L, hid});
      std::copy_n(hin.data() + i * L * hid, L * hid, x.data());
      auto y = te->run_layers(x, enc->mask, layers[i], layers[i] + 1, ctx);
      ASSERT_TRUE(y.ok()) << y.status().to_string();
      std::vector<float> want(L * hid);
      for (int64_t t = 0; t < L; ++t) std::copy_n(pe.data() + t * E + i * hid, hid, want.data() + t * hid);
      const std::string k = "te_layer" + std::to_string(layers[i]);
      err[k] = rel(y->data(), want.data(), want.size());
      const int beyond = rows_beyond(y->data(), hid, want.data(), hid, L, hid, 1e-4);
      if (exact) EXPECT_LE(err[k], 1e-4) << k;
      EXPECT_LE(beyond, L / 100) << k << ": tokens beyond 1e-4 (a rounding flip moves one token)";
    }
  }

  // Each transformer step alone, from the reference's latents.
  {
    auto dit = Flux2Transformer::load(qdir / "transformer");
    ASSERT_TRUE(dit.ok()) << dit.status().to_string();
    ASSERT_TRUE(dit->prepare(be).ok());
    Tensor txt({L, E});
    std::copy(pe.begin(), pe.end(), txt.data());
    const auto ts = c["timesteps"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int>(ts.size()), steps);
    for (int k = 1; k <= steps; ++k) {
      const std::vector<float> lat = load(dir / (k == 1 ? "noise.npy" : "latents_step" + std::to_string(k - 1) + ".npy"));
      auto v = dit->forward(pack(lat, 128, h, w), txt, ts[k - 1], flux2_image_ids(h, w), flux2_text_ids(L), ctx);
      ASSERT_TRUE(v.ok()) << v.status().to_string();
      const std::string key = "tf_velocity_step" + std::to_string(k);
      err[key] = rel(unpack(v->data(), 128, h, w), load(dir / ("velocity_step" + std::to_string(k) + ".npy")));
      EXPECT_LE(err[key], exact ? 1e-4 : 0.5 * unquantized(key)) << key;
    }
  }

  // The denoising loop from the reference's prompt_embeds (its own latents from step 2 on).
  const fs::path dump = klein::testing::make_temp_dir("quant_ref_dump");
  {
    PromptEmbeddings p;
    p.shape = {1, L, E};
    p.data = pe;
    DenoiseParams dp;
    dp.width = W;
    dp.height = H;
    dp.steps = steps;
    dp.seed = c["seed"];
    dp.dump.dir = dump.string();
    auto z = (*model)->denoise(p, {}, dp);
    ASSERT_TRUE(z.ok()) << z.status().to_string();
    for (int k = 1; k <= steps; ++k)
      for (const char* s : {"velocity_step", "latents_step"}) {
        const std::string f = s + std::to_string(k);
        err[f] = rel(load(dump / (f + ".npy")), load(dir / (f + ".npy")));
        if (exact) EXPECT_LE(err[f], 1e-4) << f;
      }
  }

  // The VAE, from the reference's final latents.
  {
    Latents z;
    z.shape = {1, 128, h, w};
    z.data = load(dir / ("latents_step" + std::to_string(steps) + ".npy"));
    DumpOptions d{dump.string(), "latents_final,image"};
    auto img = (*model)->decode(z, {}, d);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    // (The float32 Winograd conv, fast on CPUs without bf16 convs, is held to 1e-4 as float32.)
    const std::string_view conv = ks.get(kernels::Op::kConv2d, DType::kBF16).name;
    const bool bf16_convs = conv == "conv2d_bf16_avx512bf16" || conv == "conv2d_bf16_amx";
    for (const char* f : {"latents_final", "image"}) {
      err[f] = rel(load(dump / (std::string(f) + ".npy")), load(dir / (std::string(f) + ".npy")));
      if (bf16_convs && std::string(f) == "image")
        EXPECT_LE(err[f], std::max(kBf16ConvImage, 1.25 * c["envelope"]["rel"]["image"].back().get<double>())) << f;
      else
        EXPECT_LE(err[f], 1e-4) << f;
    }
  }
  fs::remove_all(dump);
  if (exact) EXPECT_LE(err["prompt_embeds"], 1e-4);

  std::string line;
  for (const auto& [k, e] : err) {
    char b[64];
    std::snprintf(b, sizeof b, " %s=%.1e", k.c_str(), e);
    line += b;
  }
  std::printf("[ info ] %s %s:%s\n", name.c_str(), std::string(isa_name(run.isa)).c_str(), line.c_str());
}

INSTANTIATE_TEST_SUITE_P(Isa, QuantRefPipeline, ::testing::ValuesIn(quant_runs()), [](const auto& info) {
  return run_name(info.param);
});
