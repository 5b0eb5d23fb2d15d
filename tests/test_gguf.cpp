// GGUF: the reader (v2/v3, alignment, long names, ggml dims), ggml's block formats against gguf-py's
// dequantization bit for bit, the linear kernels computing with them, the tiny transformer from
// ComfyUI-GGUF / stable-diffusion.cpp files (written by scripts/reference/make_gguf_files.py with
// gguf-py) against diffusers run with gguf-py's dequantized weights, and malformed files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "core/cpu_features.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "io/checkpoint_detect.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "io/mapped_source.h"
#include "io/name_map.h"
#include "io/npy.h"
#include "kernels/registry.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein::gguf_test {

fs::path gguf_dir() { return klein::testing::data_dir() / "gguf"; }

NpyArray read_npy_or_fail(const fs::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << p << ": " << r.status().to_string();
  return r.ok() ? std::move(*r) : NpyArray{};
}

std::shared_ptr<GgufSource> open_gguf(const fs::path& p) {
  auto s = GgufSource::open(p);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : nullptr;
}

const char* const kTypes[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                              "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

TEST(GgufFormat, EveryTypeDequantizesAsGgufPyBitForBit) {
  auto src = open_gguf(gguf_dir() / "types.gguf");
  ASSERT_TRUE(src);
  for (const char* type : kTypes) {
    SCOPED_TRACE(type);
    auto w = src->get(std::string("w.") + type);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(dtype_name(w->dtype), type);
    EXPECT_EQ(w->shape, (Shape{4, 512}));
    ASSERT_TRUE(validate_weight(*w).ok()) << validate_weight(*w).to_string();
    const std::vector<float> want = read_npy_or_fail(gguf_dir() / (std::string("deq_") + type + ".npy")).to_f32();
    ASSERT_EQ(want.size(), 4u * 512u);
    const std::vector<float> got = weight_to_vector(*w);
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (!same_bits(got[i], want[i]) && bad++ < 3) ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
    EXPECT_EQ(bad, 0);
    // A part of a row (the second block on) and a row view (rows 1-2) read the same blocks.
    const int64_t be = w->format().block_elems;
    std::vector<float> part(512 - be);
    w->format().row_to_f32(*w, 3, be, 512 - be, part.data());
    for (int64_t i = 0; i < 512 - be; ++i) ASSERT_TRUE(same_bits(part[i], want[3 * 512 + be + i])) << i;
    auto v = w->row_range(1, 3);
    ASSERT_TRUE(v.ok());
    const std::vector<float> rows = weight_to_vector(*v);
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_TRUE(same_bits(rows[i], want[512 + i])) << i;
  }
}

TEST(GgufFile, AlignmentLongNamesDimsAndProducers) {
  auto f = GgufFile::open(gguf_dir() / "types.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->string_value("general.architecture"), "klein-test");
  const std::string long_name = "a.tensor.name.longer.than.ggml.sixty.four.byte.limit.for.klein.reader.test.w";
  ASSERT_GT(long_name.size(), 64u);
  const GgufTensor* t = (*f)->tensor(long_name);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{4, 2}));  // ggml order: columns first
  EXPECT_EQ(t->shape, (Shape{2, 4}));
  for (const auto& x : (*f)->tensors()) EXPECT_EQ(x.offset % 64, 0u) << x.name;
  GgufSource src(*f);
  auto w = src.get(long_name);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(weight_to_vector(*w), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(gguf_producer(**f), "unknown");
  auto comfy = GgufFile::open(gguf_dir() / "tiny-flux2-comfy-Q8_0.gguf");
  ASSERT_TRUE(comfy.ok());
  EXPECT_EQ(gguf_producer(**comfy), "ComfyUI-GGUF");
  auto sdcpp = GgufFile::open(gguf_dir() / "tiny-flux2-sdcpp-Q4_1.gguf");
  ASSERT_TRUE(sdcpp.ok());
  EXPECT_TRUE((*sdcpp)->metadata().empty());
  EXPECT_EQ(gguf_producer(**sdcpp), "stable-diffusion.cpp");
}

// Each block format through the linear kernel of every ISA of this CPU (the generic path expands
// a slab of rows to f32 inside the GEMM): y = x · deqᵀ with gguf-py's dequantized rows, to float32
// accumulation error. M = 9 runs the packed GEMM, M = 2 the small-M path.
class GgufKernels : public ::testing::TestWithParam<Isa> {};
INSTANTIATE_TEST_SUITE_P(Isa, GgufKernels, ::testing::ValuesIn(CpuFeatures::host().isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_name(i.param)); });

TEST_P(GgufKernels, LinearEqualsTheDequantizedProduct) {
  auto src = open_gguf(gguf_dir() / "types.gguf");
  ASSERT_TRUE(src);
  ThreadPool pool(2);
  const auto set = kernels::KernelSet::select(CpuFeatures::host(), GetParam(), kernels::Precision::kFp32);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (const char* type : kTypes) {
    SCOPED_TRACE(type);
    auto w = src->get(std::string("w.") + type);
    ASSERT_TRUE(w.ok());
    const std::vector<float> deq = read_npy_or_fail(gguf_dir() / (std::string("deq_") + type + ".npy")).to_f32();
    constexpr int64_t N = 4, K = 512;
    for (int64_t M : {9, 2}) {
      std::vector<float> x(M * K), y(M * N, -1.0f);
      for (auto& v : x) v = nd(rng);
      kernels::run_linear(set, x.data(), M, K, *w, nullptr, y.data(), pool);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            ref += static_cast<double>(x[m * K + k]) * deq[n * K + k];
            mag += std::fabs(static_cast<double>(x[m * K + k]) * deq[n * K + k]);
          }
          ASSERT_NEAR(y[m * N + n], ref, 1e-5 * mag + 1e-6) << "M=" << M << " m=" << m << " n=" << n;
        }
    }
  }
}

TEST(GgufModel, TransformerMatchesDiffusersWithGgufPyDequantizedWeights) {
  auto cfg = read_json_file(klein::testing::tiny_model_dir() / "transformer/config.json");
  ASSERT_TRUE(cfg.ok());
  const fs::path in = klein::testing::data_dir() / "fp8";  // the fixed inputs make_gguf_files.py used
  Tensor img = read_npy_or_fail(in / "hidden_states.npy").to_tensor();
  Tensor txt = read_npy_or_fail(in / "encoder_hidden_states.npy").to_tensor();
  const float t = read_npy_or_fail(in / "timestep.npy").to_f32()[0];
  const Flux2Ids iid = testing::flux2_ids_of(read_npy_or_fail(in / "img_ids.npy")), tid = testing::flux2_ids_of(read_npy_or_fail(in / "txt_ids.npy"));
  CpuBackend backend(CpuBackendOptions{2});
  RunContext ctx;
  ctx.backend = &backend;
  // file, stable-diffusion.cpp's prefix or not, the format of the block linears.
  const std::vector<std::tuple<std::string, bool, DType>> files = {
      {"tiny-flux2-comfy-Q8_0", false, DType::kQ8_0}, {"tiny-flux2-comfy-Q4_0", false, DType::kQ4_0},
      {"tiny-flux2-comfy-Q5_1", false, DType::kQ5_1}, {"tiny-flux2-comfy-BF16", false, DType::kBF16},
      {"tiny-flux2-sdcpp-Q4_1", true, DType::kQ4_1},  {"tiny-flux2-sdcpp-Q5_0", true, DType::kQ5_0},
  };
  for (const auto& [stem, sdcpp, format] : files) {
    SCOPED_TRACE(stem);
    auto file = open_gguf(gguf_dir() / (stem + ".gguf"));
    ASSERT_TRUE(file);
    std::shared_ptr<const TensorSource> src = file;
    if (sdcpp) {
      auto scoped = ScopedSource::create(src, "model.diffusion_model.");
      ASSERT_TRUE(scoped.ok()) << scoped.status().to_string();
      src = *scoped;
    }
    auto m = MappedSource::create(src, bfl_flux2_dit_map());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    // The fused qkv splits into row views of the stored blocks, not requantized copies.
    auto k = (*m)->get("transformer_blocks.0.attn.to_k.weight");
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    EXPECT_EQ(k->dtype, format);
    const GgufTensor* qkv = file->file().tensor((sdcpp ? "model.diffusion_model." : "") +
                                                std::string("double_blocks.0.img_attn.qkv.weight"));
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(k->data, qkv->data + 32 * format_row_bytes(format, 32));
    auto model = Flux2Transformer::load(*m, *cfg, "tiny transformer/config.json");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto out = model->forward(img, txt, t, iid, tid, ctx);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const std::vector<float> ref = read_npy_or_fail(gguf_dir() / ("out_" + stem + ".npy")).to_f32();
    ASSERT_EQ(out->numel(), static_cast<int64_t>(ref.size()));
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num = std::max(num, std::fabs(static_cast<double>(out->data()[i]) - ref[i]));
      den = std::max(den, std::fabs(static_cast<double>(ref[i])));
    }
    std::printf("[gguf %s] vs diffusers with gguf-py's dequantized weights: rel %.3g\n", stem.c_str(), num / den);
    EXPECT_LE(num / den, 1e-4);
  }
}

// Under Precision::kFast the block linears take llama.cpp's int8 arithmetic (kernels/ggml_dot.h):
// the tiny transformer from each GGUF stays near the fp32 reference output (max-abs relative,
// int8 activations per block), and differs from it by far more than the fp32 path does (the
// integer kernels did run).
TEST(GgufModel, TransformerUnderFastStaysNearTheReference) {
  auto cfg = read_json_file(klein::testing::tiny_model_dir() / "transformer/config.json");
  ASSERT_TRUE(cfg.ok());
  const fs::path in = klein::testing::data_dir() / "fp8";
  Tensor img = read_npy_or_fail(in / "hidden_states.npy").to_tensor();
  Tensor txt = read_npy_or_fail(in / "encoder_hidden_states.npy").to_tensor();
  const float t = read_npy_or_fail(in / "timestep.npy").to_f32()[0];
  const Flux2Ids iid = testing::flux2_ids_of(read_npy_or_fail(in / "img_ids.npy")), tid = testing::flux2_ids_of(read_npy_or_fail(in / "txt_ids.npy"));
  // At most AVX512_VNNI: the bf16 attention and GEMMs (AVX512_BF16, AMX) stay out, so only the
  // GGUF linears compute differently from fp32.
  CpuBackend backend(CpuBackendOptions{2, Isa::kAvx512Vnni, kernels::Precision::kFast});
  RunContext ctx;
  ctx.backend = &backend;
  for (const std::string stem : {"tiny-flux2-comfy-Q8_0", "tiny-flux2-comfy-Q4_0", "tiny-flux2-comfy-Q5_1"}) {
    SCOPED_TRACE(stem);
    auto file = open_gguf(gguf_dir() / (stem + ".gguf"));
    ASSERT_TRUE(file);
    auto m = MappedSource::create(file, bfl_flux2_dit_map());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto model = Flux2Transformer::load(*m, *cfg, "tiny transformer/config.json");
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto out = model->forward(img, txt, t, iid, tid, ctx);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const std::vector<float> ref = read_npy_or_fail(gguf_dir() / ("out_" + stem + ".npy")).to_f32();
    ASSERT_EQ(out->numel(), static_cast<int64_t>(ref.size()));
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num = std::max(num, std::fabs(static_cast<double>(out->data()[i]) - ref[i]));
      den = std::max(den, std::fabs(static_cast<double>(ref[i])));
    }
    std::printf("[gguf %s] fast vs the fp32 reference: rel %.3g\n", stem.c_str(), num / den);
    EXPECT_LE(num / den, 2e-2);  // measured 0.66-0.85 %
    EXPECT_GT(num / den, 1e-3);  // the fp32 path: ~3e-6 (the test above)
  }
}

// llama.cpp's Qwen3 names, as gguf-py's tensor_mapping gives them for each tensor of the tiny text
// encoder: the map renames each back, and detection takes such a file for a Qwen3 text encoder
// with the tiny encoder's shapes.
TEST(GgufNames, LlamaCppQwen3NamesMapToTransformers) {
  std::ifstream tsv(gguf_dir() / "qwen3_llama_names.tsv");
  ASSERT_TRUE(tsv) << "missing fixture";
  std::map<std::string, std::string> hf_to_llama;
  std::string line;
  while (std::getline(tsv, line)) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const std::string llama = line.substr(0, tab), hf = line.substr(tab + 1);
    const auto m = map_name(llama_cpp_qwen3_map(), llama);
    ASSERT_EQ(m.size(), 1u) << llama;
    EXPECT_EQ(m[0].target, hf) << llama;
    hf_to_llama[hf] = llama;
  }
  EXPECT_GT(hf_to_llama.size(), 300u);
  auto te = SafetensorsSource::open(klein::testing::tiny_model_dir() / "text_encoder" / "model.safetensors");
  ASSERT_TRUE(te.ok());
  auto infos = tensor_infos(**te);
  ASSERT_TRUE(infos.ok());
  std::vector<TensorInfo> llama;
  for (const TensorInfo& t : *infos) {
    ASSERT_TRUE(hf_to_llama.count(t.name)) << t.name;
    llama.push_back({hf_to_llama[t.name], t.shape});
  }
  auto d = detect_checkpoint(llama, "te.gguf");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_EQ(d->parts.size(), 1u);
  const CheckpointPart& p = d->parts[0];
  EXPECT_EQ(p.component, Component::kTextEncoder);
  EXPECT_EQ(p.scheme, NamingScheme::kLlamaCpp);
  EXPECT_EQ(p.family, Family::kQwen3);
  EXPECT_TRUE(p.supported());
  ASSERT_EQ(p.tensors.size(), infos->size());
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    EXPECT_EQ(p.tensors[i].name, (*infos)[i].name);
    EXPECT_EQ(p.tensors[i].shape, (*infos)[i].shape);
  }
}

// The fuzz harness's seeds (gguf-py files of every type and value kind) open, and each tensor
// dequantizes to finite values, as fuzz/gguf.cpp reads them.
TEST(GgufFile, FuzzSeedsOpenAndDequantize) {
  const fs::path seeds = fs::path(KLEIN_SOURCE_DIR) / "fuzz" / "corpus" / "gguf";
  int files = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    SCOPED_TRACE(e.path().string());
    auto src = open_gguf(e.path());
    ASSERT_TRUE(src);
    ++files;
    for (const std::string& n : src->names()) {
      auto w = src->get(n);
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE(validate_weight(*w).ok()) << n;
      for (float v : weight_to_vector(*w)) ASSERT_TRUE(std::isfinite(v)) << n;
    }
  }
  EXPECT_GE(files, 4);
}

// --- through the layout resolver and the CLI ---------------------------------------------------

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

TEST(GgufCli, InfoNamesProducerArchitectureAndTypes) {
  const std::string others = " --text-encoder " + quoted(klein::testing::tiny_model_dir() / "text_encoder" / "model.safetensors") +
                             " --vae " + quoted(klein::testing::data_dir() / "single_file" / "tiny-flux2-vae-ldm.safetensors");
  auto r = klein::testing::run_cli("info --diffusion-model " + quoted(gguf_dir() / "tiny-flux2-comfy-Q8_0.gguf") + others);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"container  GGUF v3 by ComfyUI-GGUF, architecture flux", "names      BFL", "Q8_0 ", "F16 ",
                           "F32 "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  r = klein::testing::run_cli("info --diffusion-model " + quoted(gguf_dir() / "tiny-flux2-sdcpp-Q4_1.gguf") + others);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"container  GGUF v3 by stable-diffusion.cpp, architecture not given", "Q4_1 "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

TEST(GgufCli, GenerateWithAGgufTransformerGivesTheImage) {
  const fs::path dir = klein::testing::make_temp_dir("gguf_cli");
  const std::string common = " -q -W 64 -H 48 --seed 11 --prompt 'a red cube on a table' --threads 2 --precision fp32";
  auto r = klein::testing::run_cli("generate --model " + quoted(klein::testing::tiny_model_dir()) + common + " -o " +
                                   quoted(dir / "folder.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = klein::testing::run_cli("generate --model " + quoted(klein::testing::tiny_model_dir()) + " --diffusion-model " +
                              quoted(gguf_dir() / "tiny-flux2-comfy-BF16.gguf") + common + " -o " + quoted(dir / "gguf.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  };
  auto a = decode_image(read(dir / "folder.png")), b = decode_image(read(dir / "gguf.png"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(b->width, 64);
  ASSERT_EQ(b->height, 48);
  // The BF16 GGUF holds the folder's bf16 weights (its F16 img_in / txt_in / time_in / final_layer
  // round a few): the same picture to within a little.
  double se = 0;
  for (size_t i = 0; i < a->rgb.size(); ++i) se += (double(a->rgb[i]) - b->rgb[i]) * (double(a->rgb[i]) - b->rgb[i]);
  const double psnr = 10 * std::log10(255.0 * 255.0 / std::max(se / a->rgb.size(), 1e-12));
  std::printf("[gguf cli] BF16 GGUF transformer vs the folder's: PSNR %.1f dB\n", psnr);
  EXPECT_GT(psnr, 30.0);
}

// --- malformed files ------------------------------------------------------------------------

// A GGUF written byte by byte: key-value pairs and tensor infos as given, then the data section.
struct GgufBytes {
  std::vector<uint8_t> b;
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) { b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); }
  void pad(size_t a) {
    while (b.size() % a) b.push_back(0);
  }
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};

// Two F32 [2, 4] tensors "a" and "b" (32 bytes each) by default; `edit` changes the specs first.
std::vector<uint8_t> build_gguf(std::vector<TensorSpec> t, uint32_t version = 3, uint32_t alignment = 32,
                                uint64_t data_bytes = 64) {
  GgufBytes g;
  g.raw("GGUF", 4);
  g.u32(version);
  g.u64(t.size());
  g.u64(2);
  g.str("general.architecture");
  g.u32(8);
  g.str("flux");
  g.str("general.alignment");
  g.u32(4);
  g.u32(alignment);
  for (const auto& s : t) {
    g.str(s.name);
    g.u32(static_cast<uint32_t>(s.ne.size()));
    for (uint64_t d : s.ne) g.u64(d);
    g.u32(s.type);
    g.u64(s.offset);
  }
  g.pad(alignment ? alignment : 1);
  for (uint64_t i = 0; i < data_bytes; ++i) g.b.push_back(0);
  return g.b;
}

std::vector<TensorSpec> two_f32() { return {{"a.weight", {4, 2}, 0, 0}, {"b.weight", {4, 2}, 0, 32}}; }

std::string open_error(const std::vector<uint8_t>& bytes, const std::string& tag) {
  const fs::path p = klein::testing::make_temp_dir("gguf_" + tag) / "f.gguf";
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto f = GgufSource::open(p);
  if (f.ok()) return "";
  const std::string m = f.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find(p.string()), std::string::npos) << "no file name in: " << m;
  return m;
}

void expect_has(const std::string& msg, std::initializer_list<std::string> parts) {
  EXPECT_FALSE(msg.empty()) << "the file was accepted";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(GgufBadInputs, EachIsOneLineNamingFileAndWhat) {
  // The good file opens (v2 too), so each case below fails for its one defect.
  EXPECT_EQ(open_error(build_gguf(two_f32()), "good"), "");
  EXPECT_EQ(open_error(build_gguf(two_f32(), 2), "good_v2"), "");
  const auto good = build_gguf(two_f32());
  expect_has(open_error(std::vector<uint8_t>(good.begin(), good.begin() + 60), "truncated"), {"truncated"});
  expect_has(open_error(std::vector<uint8_t>(good.begin(), good.end() - 8), "truncated_data"),
             {"'b.weight'", "out of range", "truncated"});
  auto magic = good;
  magic[0] = 'X';
  expect_has(open_error(magic, "magic"), {"bad magic"});
  expect_has(open_error(build_gguf(two_f32(), 1), "version"), {"version 1"});
  auto t = two_f32();
  t[1].type = 16;
  expect_has(open_error(build_gguf(t), "type"), {"'b.weight'", "IQ2_XXS"});
  t = two_f32();
  t[1].type = 99;
  expect_has(open_error(build_gguf(t), "type99"), {"'b.weight'", "type 99"});
  t = two_f32();
  t[1].offset = 64;
  expect_has(open_error(build_gguf(t), "offset"), {"'b.weight'", "out of range"});
  t = two_f32();
  t[1].offset = 16;
  t[1].ne = {4, 1};
  expect_has(open_error(build_gguf(t, 3, 16), "overlap"), {"'a.weight'", "'b.weight'", "overlap"});
  t = two_f32();
  t[1].offset = 8;
  expect_has(open_error(build_gguf(t), "misaligned"), {"'b.weight'", "alignment"});
  expect_has(open_error(build_gguf(two_f32(), 3, 24), "alignment"), {"general.alignment", "power of two"});
  t = two_f32();
  t[1].name = "a.weight";
  expect_has(open_error(build_gguf(t), "dup"), {"'a.weight'", "twice"});
  t = two_f32();
  t[0].ne = {4, 2, 1, 1, 1};
  expect_has(open_error(build_gguf(t), "rank"), {"'a.weight'", "dimensions"});
  t = two_f32();
  t[0].type = 8;  // Q8_0 with 4 columns: not a whole block
  expect_has(open_error(build_gguf(t), "block"), {"'a.weight'", "Q8_0", "block"});
  // A string length past the end of the file.
  auto longstr = good;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(longstr.data() + 24, &huge, 8);  // the first key's length
  expect_has(open_error(longstr, "strlen"), {"key 0"});
  // A key-value count the file cannot hold.
  auto kvs = good;
  const uint64_t many = uint64_t{1} << 50;
  std::memcpy(kvs.data() + 16, &many, 8);
  expect_has(open_error(kvs, "kvcount"), {"key-value count"});
}

}  // namespace klein::gguf_test
