// FP8 (F8_E4M3 with a per-tensor scale) and ComfyUI int8_tensorwise: the format, the kernels on
// every ISA of this CPU, the source's pairing of scales and ComfyUI metadata, bad files, and the
// tiny transformer from files written by scripts/reference/make_fp8_files.py against diffusers
// run with the dequantized weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "io/json_file.h"
#include "io/mapped_source.h"
#include "io/name_map.h"
#include "io/npy.h"
#include "io/quant_meta.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/flux2_dit.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein {
namespace {

// The e4m3fn value of `code` from the bit layout, written out independently of klein's decoder:
// s eeee mmm, bias 7; e = 0 is subnormal (m · 2^-9); e = 15 with m = 7 is NaN (no infinities).
float e4m3_formula(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? m * std::pow(2.0, -9) : (8 + m) * std::pow(2.0, e - 10);
  return static_cast<float>(s ? -mag : mag);
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// An F8_E4M3_SCALED weight over `q` with the one scale at `scale`.
Weight scaled_fp8(const std::vector<uint8_t>& q, Shape shape, const float* scale) {
  Weight w;
  w.name = "codes.weight";
  w.dtype = DType::kF8E4M3Scaled;
  w.shape = std::move(shape);
  w.data = q.data();
  w.nbytes = q.size();
  w.scales = scale;
  return w;
}

TEST(Fp8Format, EveryE4M3CodeMatchesTheBitFormula) {
  // Spot values from the OCP FP8 spec: max normal 448, min normal 2^-6, min subnormal 2^-9.
  EXPECT_EQ(e4m3_formula(0x7e), 448.0f);
  EXPECT_EQ(e4m3_formula(0x08), 0.015625f);
  EXPECT_EQ(e4m3_formula(0x01), 0.001953125f);
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  const float scale = 0.3f;
  const Weight w = scaled_fp8(codes, {1, 256}, &scale);
  ASSERT_TRUE(validate_weight(w).ok());
  std::vector<float> row(256);
  weight_row_to_f32(w, 0, row.data());
  for (int c = 0; c < 256; ++c) {
    EXPECT_TRUE(same_value(f8e4m3_to_f32(static_cast<uint8_t>(c)), e4m3_formula(c))) << "code " << c;
    EXPECT_TRUE(same_value(row[c], e4m3_formula(c) * scale)) << "code " << c;
  }
  // E5M2 is read too: the top byte of a half (1.0 = 0x3c, inf = 0x7c, NaN = 0x7d).
  EXPECT_EQ(f8e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(f8e5m2_to_f32(0xfc), -INFINITY);
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(0x7d)));
}

TEST(Fp8Format, APerTensorScaleIsSharedByRowViews) {
  std::vector<uint8_t> q(6 * 4, 0x38);  // 1.0
  const float scale = 2.5f;
  Weight w = scaled_fp8(q, {6, 4}, &scale);
  EXPECT_EQ(w.scales_per_row(), 0);
  auto v = w.row_range(2, 4);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->scales, &scale);
  EXPECT_EQ(v->data, q.data() + 8);
  EXPECT_EQ(weight_to_vector(*v), std::vector<float>(8, 2.5f));
  // Two row views of one tensor stack back into it (the split qkv of a layer).
  auto a = w.row_range(0, 3), b = w.row_range(3, 6);
  auto s = a->stacked_with(*b);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rows(), 6);
  w.scales = nullptr;
  EXPECT_FALSE(validate_weight(w).ok());
}

// Every code through the chosen linear kernel of each ISA: W [256, 16] holds code r at column
// r % 16 of row r (0x00 elsewhere) and x's row i is one-hot at column i, so y[i, r] is the decoded
// weight times the scale where i == r % 16 and 0 elsewhere, exactly — NaN in every row for the
// NaN codes (0 · NaN). M = 16 runs the packed GEMM, M = 3 the small-M path.
class Fp8Kernels : public ::testing::TestWithParam<Isa> {};
INSTANTIATE_TEST_SUITE_P(Isa, Fp8Kernels, ::testing::ValuesIn(CpuFeatures::host().isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_name(i.param)); });

TEST_P(Fp8Kernels, EveryCodeThroughTheLinearKernel) {
  constexpr int64_t N = 256, K = 16;
  std::vector<uint8_t> q(N * K, 0);
  for (int64_t r = 0; r < N; ++r) q[r * K + r % K] = static_cast<uint8_t>(r);
  const float scale = 0.0625f * 3;
  const Weight w = scaled_fp8(q, {N, K}, &scale);
  ThreadPool pool(2);
  for (auto prec : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
    const auto set = kernels::KernelSet::select(CpuFeatures::host(), GetParam(), prec);
    const auto& e = set.get(kernels::Op::kLinear, DType::kF8E4M3Scaled);
    for (int64_t M : {16, 3}) {
      std::vector<float> x(M * K, 0.0f), y(M * N, -1.0f);
      for (int64_t i = 0; i < M; ++i) x[i * K + i] = 1.0f;
      kernels::run_linear(set, x.data(), M, K, w, nullptr, y.data(), pool);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t r = 0; r < N; ++r) {
          const float v = e4m3_formula(static_cast<int>(r));
          // The bf16 kernels (fast) round W to bf16; an e4m3 value has 4 significant bits, and
          // times 3/16 at most 6, so it is exact in bf16's 8 as well.
          const float want = std::isnan(v) ? NAN : (i == r % K ? v * scale : 0.0f);
          ASSERT_TRUE(same_value(y[i * N + r], want))
              << e.name << " M=" << M << " code " << r << " row " << i << ": " << y[i * N + r] << " vs " << want;
        }
    }
  }
}

// --- the source: scales, input scales, ComfyUI metadata, bad files ---------------------------

fs::path fp8_dir() { return klein::testing::data_dir() / "fp8"; }

std::shared_ptr<SafetensorsSource> open_source(const fs::path& p) {
  auto s = SafetensorsSource::open(p);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : nullptr;
}

TEST(Fp8Source, BflFileResolvesScaleAndInputScale) {
  const fs::path file = fp8_dir() / "tiny-flux2-bfl-fp8.safetensors";
  auto src = open_source(file);
  ASSERT_TRUE(src);
  const std::string qkv = "double_blocks.0.img_attn.qkv.weight";
  auto w = src->get(qkv);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->dtype, DType::kF8E4M3Scaled);
  EXPECT_EQ(w->shape, (Shape{96, 32}));
  EXPECT_EQ(w->input_scale, 0.5f);
  // Stored 1 byte per weight, in the mapping: the data pointer is the file's.
  EXPECT_EQ(w->data, src->store().entry(qkv)->data);
  EXPECT_EQ(w->scales, src->store().entry("double_blocks.0.img_attn.qkv.weight_scale")->data);
  for (const std::string& n : src->names()) {
    EXPECT_FALSE(n.ends_with("_scale")) << n << " is a companion";
  }
  // Through the BFL map the fused qkv splits into views that keep the one scale.
  auto mapped = MappedSource::create(src, bfl_flux2_dit_map());
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  auto k = (*mapped)->get("transformer_blocks.0.attn.to_k.weight");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(k->dtype, DType::kF8E4M3Scaled);
  EXPECT_EQ(k->data, static_cast<const uint8_t*>(w->data) + 32 * 32);
  EXPECT_EQ(k->scales, w->scales);
}

// A tiny fp8 file: layer "a" (F8_E4M3 [2, 4]) with the given companions, plus layer "b" with a
// good scale, so that the file is a scaled one.
fs::path write_file(const std::string& tag, const std::vector<TensorToWrite>& extra,
                    const std::map<std::string, std::string>& meta = {}, bool with_a = true) {
  static const uint8_t q[8] = {0x38, 0x40, 0xb8, 0, 1, 2, 3, 4};
  static const float good = 0.25f;
  const fs::path p = klein::testing::make_temp_dir("fp8_" + tag) / "f.safetensors";
  std::vector<TensorToWrite> t = {{"b.weight", DType::kF8E4M3, {2, 4}, q}, {"b.weight_scale", DType::kF32, {}, &good}};
  if (with_a) t.push_back({"a.weight", DType::kF8E4M3, {2, 4}, q});
  t.insert(t.end(), extra.begin(), extra.end());
  EXPECT_TRUE(write_safetensors(p, t, meta).ok());
  return p;
}

std::string get_error(const fs::path& p, const std::string& name = "a.weight") {
  auto src = SafetensorsSource::open(p);
  if (!src.ok()) return src.status().message();
  auto w = (*src)->get(name);
  return w.ok() ? "" : w.status().message();
}

void expect_error(const std::string& msg, std::initializer_list<std::string> parts) {
  EXPECT_FALSE(msg.empty());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(Fp8Source, BadScalesAreOneErrorNamingTensorAndFile) {
  const fs::path none = write_file("none", {});
  expect_error(get_error(none), {none.string(), "'a.weight'", "'a.weight_scale' is missing"});
  const float four[4] = {1, 1, 1, 1};
  const fs::path shape = write_file("shape", {{"a.weight_scale", DType::kF32, {4}, four}});
  expect_error(get_error(shape), {shape.string(), "'a.weight'", "'a.weight_scale' has shape [4]", "scalar"});
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    const fs::path p = write_file("value", {{"a.scale_weight", DType::kF32, {}, &bad}});
    expect_error(get_error(p), {p.string(), "'a.weight'", "'a.scale_weight'", "finite and > 0"});
  }
  const float ok = 0.5f, bad_in[2] = {1, 2};
  const fs::path input = write_file("input", {{"a.weight_scale", DType::kF32, {}, &ok},
                                              {"a.input_scale", DType::kF32, {2}, bad_in}});
  expect_error(get_error(input), {input.string(), "'a.input_scale' has shape [2]"});
  // The legacy ComfyUI spelling and a [1] scale are fine; the value is the scale.
  const fs::path legacy = write_file("legacy", {{"a.scale_weight", DType::kF32, {1}, &ok}});
  auto src = open_source(legacy);
  auto w = src->get("a.weight");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(weight_to_vector(*w), (std::vector<float>{0.5f, 1.0f, -0.5f, 0.0f, 0.5f * 0.001953125f,
                                                      0.5f * 0.00390625f, 0.5f * 0.005859375f, 0.5f * 0.0078125f}));
  EXPECT_FALSE(src->has("a.scale_weight"));
}

TEST(Fp8Source, AConfigClaimingQ8OverFp8WeightsNamesTheFp8) {
  // A config.json "quantization" entry (klein's or MLX's schemes) over fp8 weights: the scaled
  // fp8 weights are not int8 ones, and the message says what they are.
  const float ok = 0.5f;
  auto src = open_source(write_file("claim", {{"a.weight_scale", DType::kF32, {}, &ok}}));
  const Status st = src->check_quantization({{"quantization", {{"type", "q8"}}}}, "t/config.json");
  expect_error(st.message(), {"t/config.json", "says q8", "no weight is quantized", "F8_E4M3"});
}

TEST(Fp8Source, LegacyScaledFp8MarkerAndSpellings) {
  // ComfyUI's first scaled-fp8 files: a `scaled_fp8` marker tensor and scale_weight / scale_input.
  static const uint8_t q[4] = {0x38, 0x40, 0xb8, 0};
  static const float sw = 2.0f, si = 0.125f;
  const fs::path p = klein::testing::make_temp_dir("fp8_legacy") / "f.safetensors";
  ASSERT_TRUE(write_safetensors(p, {{"model.diffusion_model.scaled_fp8", DType::kF8E4M3, {0}, q},
                                    {"model.diffusion_model.a.weight", DType::kF8E4M3, {1, 4}, q},
                                    {"model.diffusion_model.a.scale_weight", DType::kF32, {}, &sw},
                                    {"model.diffusion_model.a.scale_input", DType::kF32, {}, &si},
                                    {"model.diffusion_model.b.weight", DType::kF8E4M3, {1, 4}, q}})
                  .ok());
  auto src = open_source(p);
  EXPECT_EQ(src->names(), (std::vector<std::string>{"model.diffusion_model.a.weight", "model.diffusion_model.b.weight"}));
  auto a = src->get("model.diffusion_model.a.weight");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->input_scale, 0.125f);
  EXPECT_EQ(weight_to_vector(*a), (std::vector<float>{2, 4, -2, 0}));
  // In a scaled file an fp8 weight without a scale is broken, not plain.
  expect_error(get_error(p, "model.diffusion_model.b.weight"),
               {p.string(), "'model.diffusion_model.b.weight_scale' is missing"});
}

TEST(Fp8Source, UnscaledFp8FilesStayPlain) {
  // No scale anywhere in the file: F8_E4M3 is a plain type (ComfyUI's unscaled fp8 files).
  static const uint8_t q[4] = {0x38, 0x40, 0xb8, 0};
  const fs::path p = klein::testing::make_temp_dir("fp8_plain") / "f.safetensors";
  ASSERT_TRUE(write_safetensors(p, {{"a.weight", DType::kF8E4M3, {1, 4}, q}}).ok());
  auto src = open_source(p);
  auto w = src->get("a.weight");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->dtype, DType::kF8E4M3);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(Fp8Source, ComfyQuantFormatsAreCheckedAndUnknownOnesNamed) {
  const float ok = 0.5f;
  const auto unknown = bytes(R"({"format": "float9_e9m9"})"), nvfp4 = bytes(R"({"format": "nvfp4"})"),
             good = bytes(R"({"format": "float8_e4m3fn"})"), int8 = bytes(R"({"format": "int8_tensorwise"})"),
             broken = bytes(R"({"format": )");
  auto with_config = [&](const std::string& tag, const std::vector<uint8_t>& json) {
    return write_file(tag, {{"a.weight_scale", DType::kF32, {}, &ok},
                            {"a.comfy_quant", DType::kU8, {static_cast<int64_t>(json.size())}, json.data()}});
  };
  const fs::path p1 = with_config("unknown", unknown);
  expect_error(get_error(p1), {p1.string(), "'a.comfy_quant'", "\"float9_e9m9\" is unknown"});
  const fs::path p2 = with_config("nvfp4", nvfp4);
  expect_error(get_error(p2), {"\"nvfp4\" is not computed by klein"});
  const fs::path p3 = with_config("int8", int8);
  expect_error(get_error(p3), {"'a.weight'", "int8_tensorwise", "stored F8_E4M3"});
  const fs::path p4 = with_config("broken", broken);
  expect_error(get_error(p4), {"'a.comfy_quant'", "not valid JSON"});
  const fs::path p5 = with_config("good", good);
  auto src = open_source(p5);
  EXPECT_FALSE(src->has("a.comfy_quant"));
  EXPECT_TRUE(src->get("a.weight").ok());
  // The header's _quantization_metadata: an unknown format there fails every tensor's get.
  const fs::path p6 = write_file("meta", {{"a.weight_scale", DType::kF32, {}, &ok}},
                                 {{"_quantization_metadata",
                                   R"({"format_version": "1.0", "layers": {"a": {"format": "int4_magic"}}})"}});
  expect_error(get_error(p6, "b.weight"), {"_quantization_metadata", "layer 'a'", "\"int4_magic\" is unknown"});
}

// The normalized Hadamard matrix of size 4^k, entry by entry: the product over the base-4 digits
// of i and j of the seed h4 (comfy-kitchen's), over 2^k.
double hadamard_entry(int64_t i, int64_t j, int64_t n) {
  static const int h4[4][4] = {{1, 1, 1, -1}, {1, 1, -1, 1}, {1, -1, 1, 1}, {-1, 1, 1, 1}};
  double v = 1;
  for (int64_t m = n; m > 1; m /= 4, i /= 4, j /= 4) v *= h4[i % 4][j % 4] / 2.0;
  return v;
}

TEST(Convrot, HadamardGroupsIsTheMatrixProduct) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t g : {4, 16, 256}) {
    std::vector<float> x(2 * g);
    for (float& v : x) v = d(rng);
    std::vector<float> y = x;
    kernels::ref::hadamard_groups(y.data(), 2 * g, g);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < g; ++i) {
        double want = 0;
        for (int64_t j = 0; j < g; ++j) want += hadamard_entry(i, j, g) * x[b * g + j];
        EXPECT_NEAR(y[b * g + i], want, 1e-5) << "group " << g << " row " << i;
      }
  }
}

TEST(Fp8Source, Int8TensorwiseMapsOntoQ8RowWithConvrot) {
  static const int8_t q[8] = {1, -2, 3, 4, 5, -127, 7, 0};
  const float scalar = 0.5f, per_row[2] = {0.25f, 2.0f};
  const auto conf = bytes(R"({"format": "int8_tensorwise"})");
  const auto rot4 = bytes(R"({"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 4})");
  const auto rot256 = bytes(R"({"format": "int8_tensorwise", "convrot": true})");
  const auto rot8 = bytes(R"({"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 8})");
  auto u8 = [](const std::vector<uint8_t>& b) { return Shape{static_cast<int64_t>(b.size())}; };
  const fs::path p = klein::testing::make_temp_dir("int8_tw") / "f.safetensors";
  ASSERT_TRUE(write_safetensors(p, {{"a.weight", DType::kI8, {2, 3}, q},
                                    {"a.weight_scale", DType::kF32, {}, &scalar},
                                    {"a.comfy_quant", DType::kU8, u8(conf), conf.data()},
                                    {"b.weight", DType::kI8, {2, 3}, q},
                                    {"b.weight_scale", DType::kF32, {2, 1}, per_row},
                                    {"c.weight", DType::kI8, {2, 4}, q},
                                    {"c.weight_scale", DType::kF32, {2, 1}, per_row},
                                    {"c.comfy_quant", DType::kU8, u8(rot4), rot4.data()},
                                    {"d.weight", DType::kI8, {2, 4}, q},
                                    {"d.weight_scale", DType::kF32, {2, 1}, per_row},
                                    {"d.comfy_quant", DType::kU8, u8(rot256), rot256.data()},
                                    {"e.weight", DType::kI8, {2, 4}, q},
                                    {"e.weight_scale", DType::kF32, {2, 1}, per_row},
                                    {"e.comfy_quant", DType::kU8, u8(rot8), rot8.data()}})
                  .ok());
  auto src = open_source(p);
  auto a = src->get("a.weight");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->dtype, DType::kQ8Row);
  EXPECT_EQ(a->act_rotation_group, 0);
  EXPECT_EQ(weight_to_vector(*a), (std::vector<float>{0.5f, -1, 1.5f, 2, 2.5f, -63.5f}));
  auto b = src->get("b.weight");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(weight_to_vector(*b), (std::vector<float>{0.25f, -0.5f, 0.75f, 8, 10, -254}));
  // convrot in groups of 4: y = (x·H)·Wᵀ for the stored (rotated) W, on every ISA's linear (the
  // exact and the fast W8A8 ones), against the product written out with H's entries.
  auto c = src->get("c.weight");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->act_rotation_group, 4);
  const std::vector<float> wc = weight_to_vector(*c), x = {0.5f, -1.0f, 0.25f, 2.0f};
  std::vector<double> want(2, 0.0);
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k) {
      double xr = 0;
      for (int j = 0; j < 4; ++j) xr += hadamard_entry(k, j, 4) * x[j];
      want[n] += xr * wc[n * 4 + k];
    }
  ThreadPool pool(1);
  for (Isa isa : CpuFeatures::host().isas())
    for (auto prec : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
      const auto set = kernels::KernelSet::select(CpuFeatures::host(), isa, prec);
      std::vector<float> y(2);
      kernels::run_linear(set, x.data(), 1, 4, *c, nullptr, y.data(), pool);
      const double tol = prec == kernels::Precision::kFast ? 2e-2 * std::fabs(want[1]) : 1e-4;
      for (int n = 0; n < 2; ++n)
        EXPECT_NEAR(y[n], want[n], tol) << set.get(kernels::Op::kLinear, DType::kQ8Row).name << " row " << n;
    }
  expect_error(get_error(p, "d.weight"), {p.string(), "'d.weight'", "convrot groups of 256 do not divide its 4 columns"});
  expect_error(get_error(p, "e.weight"), {p.string(), "layer 'e'", "convrot in groups of 8", "power of 4"});
}

TEST(Fp8Source, F8TensorWithTheWrongByteCountIsRefused) {
  // Hand-written header: F8_E4M3 [2, 3] needs 6 bytes, the offsets give 5 (and F8_E5M2 is read).
  const fs::path p = klein::testing::make_temp_dir("fp8_bytes") / "f.safetensors";
  for (const char* dt : {"F8_E4M3", "F8_E5M2"}) {
    std::string h = std::string(R"({"a.weight":{"dtype":")") + dt + R"(","shape":[2,3],"data_offsets":[0,5]}})";
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << std::string(5, '\0');
    f.close();
    auto s = SafetensorsSource::open(p);
    ASSERT_FALSE(s.ok());
    expect_error(s.status().message(), {p.string(), "a.weight", "5 bytes", dt});
  }
}

TEST(Fp8Meta, ParsesComfyQuantAndTheHeaderTable) {
  auto q = parse_comfy_quant(R"({"format":"int8_tensorwise","convrot":true,"convrot_groupsize":256})", "x");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format, "int8_tensorwise");
  EXPECT_TRUE(q->convrot);
  EXPECT_EQ(q->convrot_group, 256);
  auto m = parse_quantization_metadata(
      R"({"format_version":"1.0","layers":{"l.0":{"format":"float8_e4m3fn"},"l.1":{"format":"int8_tensorwise"}}})", "x");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 2u);
  EXPECT_EQ(m->at("l.0").format, "float8_e4m3fn");
  EXPECT_FALSE(parse_comfy_quant(R"({"convrot":true})", "x").ok());
  EXPECT_FALSE(parse_comfy_quant(R"({"format":"float8_e4m3fn","convrot_groupsize":-1})", "x").ok());
  EXPECT_FALSE(parse_quantization_metadata(R"({"format_version":"1.0"})", "x").ok());
  EXPECT_FALSE(parse_comfy_quant("[1,2", "x").ok());
}

// --- the tiny transformer from the independent writer's files ----------------------------------

struct Compare {
  double rel = 0, cosine = 0, psnr = 0;
};

// max|a - b| / max|b|, cosine similarity and PSNR (peak = max|b|) of a against b.
Compare compare(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0, dot = 0, na = 0, nb = 0, se = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
    dot += static_cast<double>(a[i]) * b[i], na += static_cast<double>(a[i]) * a[i], nb += static_cast<double>(b[i]) * b[i];
    se += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  }
  const double mse = se / static_cast<double>(b.size());
  return {num / den, dot / std::sqrt(na * nb), mse > 0 ? 10 * std::log10(den * den / mse) : INFINITY};
}

TEST(Fp8Format, EveryE4M3CodeMatchesTorch) {
  // torch's float8_e4m3fn decoding of every byte (make_fp8_files.py), against klein's decoder.
  const std::vector<float> torch_values = testing::must_read_npy(fp8_dir() / "e4m3_codes.npy").to_f32();
  ASSERT_EQ(torch_values.size(), 256u);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(same_value(f8e4m3_to_f32(static_cast<uint8_t>(c)), torch_values[c])) << "code " << c;
}

TEST(Fp8Model, TransformerMatchesDiffusersWithDequantizedWeights) {
  auto cfg = read_json_file(klein::testing::tiny_model_dir() / "transformer/config.json");
  ASSERT_TRUE(cfg.ok());
  const fs::path d = fp8_dir();
  Tensor img = testing::must_read_npy(d / "hidden_states.npy").to_tensor(), txt = testing::must_read_npy(d / "encoder_hidden_states.npy").to_tensor();
  const float t = testing::must_read_npy(d / "timestep.npy").to_f32()[0];
  const Flux2Ids iid = testing::flux2_ids_of(testing::must_read_npy(d / "img_ids.npy")), tid = testing::flux2_ids_of(testing::must_read_npy(d / "txt_ids.npy"));
  const std::vector<float> full = testing::must_read_npy(d / "out_full.npy").to_f32();
  CpuBackend backend(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &backend;
  // file, BFL names (through the map), the format its block linears load as.
  const std::vector<std::tuple<std::string, bool, DType>> files = {
      {"tiny-flux2-bfl-fp8", true, DType::kF8E4M3Scaled},
      {"tiny-flux2-comfy-mixed", true, DType::kF8E4M3Scaled},
      {"tiny-flux2-int8", true, DType::kQ8Row},
      {"tiny-flux2-int8-convrot", true, DType::kQ8Row},
      {"tiny-flux2-diffusers-fp8", false, DType::kF8E4M3Scaled},
  };
  for (const auto& [stem, bfl, format] : files) {
    SCOPED_TRACE(stem);
    std::shared_ptr<const TensorSource> src = open_source(d / (stem + ".safetensors"));
    ASSERT_TRUE(src);
    // Both through a MappedSource, as the checkpoint layer opens single files: BFL names through
    // their map, diffusers names through an identity one.
    const NameMap identity{"identity", {{"{*}", {"{*}"}}}};
    auto m = MappedSource::create(src, bfl ? bfl_flux2_dit_map() : identity);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    src = *m;
    auto q = src->get("transformer_blocks.0.attn.to_q.weight");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->dtype, format);
    auto model = Flux2Transformer::load(src, *cfg, "tiny transformer/config.json");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto out = model->forward(img, txt, t, iid, tid, ctx);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const std::vector<float> ref = testing::must_read_npy(d / ("out_" + stem + ".npy")).to_f32();
    ASSERT_EQ(out->numel(), static_cast<int64_t>(ref.size()));
    const Compare vs_ref = compare(out->data(), ref), vs_full = compare(out->data(), full);
    std::printf("[fp8 %s] vs dequantized diffusers: rel %.3g; vs full precision: cosine %.6f, PSNR %.1f dB\n",
                stem.c_str(), vs_ref.rel, vs_full.cosine, vs_full.psnr);
    EXPECT_LE(vs_ref.rel, 1e-4);
  }
}

}  // namespace
}  // namespace klein
