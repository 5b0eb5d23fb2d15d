// Writing GGUF: ggml's reference quantizers byte for byte (fixtures from ggml's own
// ggml-quants.c, cross-checked with gguf-py, scripts/reference/make_gguf_quant_fixtures.py), the
// container read back by klein's reader, `klein quantize --type gguf:<T>` on the tiny model in
// both producers' conventions (tensor bytes against scripts/reference/check_gguf_written.py's
// expectations, the model run from its own GGUF), and its bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "core/format.h"
#include "core/quantize_gguf.h"
#include "core/weight.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/json_file.h"
#include "io/mapped_source.h"
#include "io/name_map.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/sha256.h"
#include "io/tensor_source.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "dit_testing.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein::gguf_write_test {

fs::path gguf_dir() { return klein::testing::data_dir() / "gguf"; }

NpyArray must_npy(const fs::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << p << ": " << r.status().to_string();
  return r.ok() ? std::move(*r) : NpyArray{};
}

struct NamedType {
  const char* name;
  DType t;
};
constexpr NamedType kAll[] = {
    {"F32", DType::kF32},   {"F16", DType::kF16},   {"BF16", DType::kBF16}, {"Q8_0", DType::kQ8_0},
    {"Q4_0", DType::kQ4_0}, {"Q4_1", DType::kQ4_1}, {"Q5_0", DType::kQ5_0}, {"Q5_1", DType::kQ5_1},
    {"Q2_K", DType::kQ2_K}, {"Q3_K", DType::kQ3_K}, {"Q4_K", DType::kQ4_K}, {"Q5_K", DType::kQ5_K},
    {"Q6_K", DType::kQ6_K},
};

// Every row of quant_input.npy (random rows, zeros, constants, one-signed rows, spikes, 1e5 /
// 1e-7 / 1e-20 magnitudes, ties) quantized as ggml's quantize_row_<t>_ref does, byte for byte.
TEST(GgufQuantize, EveryTypeEqualsGgmlsReferenceQuantizerByteForByte) {
  const NpyArray in = must_npy(gguf_dir() / "quant_input.npy");
  ASSERT_EQ(in.shape.size(), 2u);
  const int64_t rows = in.shape[0], cols = in.shape[1];
  const std::vector<float> x = in.to_f32();
  for (const auto& [name, t] : kAll) {
    SCOPED_TRACE(name);
    const NpyArray want = must_npy(gguf_dir() / (std::string("quant_") + name + ".npy"));
    const int64_t rb = ggml_quant::row_bytes(t, cols);
    ASSERT_EQ(rb, format_row_bytes(t, cols));  // the writer's sizes are the reader's
    ASSERT_EQ(want.shape, (Shape{rows, rb}));
    std::vector<uint8_t> got(static_cast<size_t>(rb));
    for (int64_t r = 0; r < rows; ++r) {
      ggml_quant::quantize_row(t, x.data() + r * cols, cols, got.data());
      const uint8_t* w = want.bytes.data() + r * rb;
      int64_t first = -1;
      for (int64_t i = 0; i < rb && first < 0; ++i)
        if (got[i] != w[i]) first = i;
      EXPECT_EQ(first, -1) << "row " << r << ": first differing byte " << first << " (block "
                           << first / ggml_quant::block_bytes(t) << ")";
    }
  }
}

// The quantizers and the reader's dequantizers agree on what a block means: a row quantized and
// dequantized is within the type's error of the input (and exact for F32).
TEST(GgufQuantize, RoundTripThroughTheReadersDequantizerIsClose) {
  const NpyArray in = must_npy(gguf_dir() / "quant_input.npy");
  const int64_t cols = in.shape[1];
  const std::vector<float> x = in.to_f32();
  const std::map<std::string, double> tol = {{"F32", 0},       {"F16", 1e-3},    {"BF16", 4e-3},  {"Q8_0", 0.01},
                                             {"Q4_0", 0.15},   {"Q4_1", 0.1},    {"Q5_0", 0.07},  {"Q5_1", 0.05},
                                             {"Q2_K", 0.6},    {"Q3_K", 0.3},    {"Q4_K", 0.12},  {"Q5_K", 0.06},
                                             {"Q6_K", 0.03}};
  for (const auto& [name, t] : kAll) {
    SCOPED_TRACE(name);
    const int64_t rb = ggml_quant::row_bytes(t, cols);
    std::vector<uint8_t> q(static_cast<size_t>(rb));
    ggml_quant::quantize_row(t, x.data(), cols, q.data());  // row 0: standard normal
    Weight w;
    w.dtype = t;
    w.shape = {1, cols};
    w.data = q.data();
    w.nbytes = q.size();
    std::vector<float> y(static_cast<size_t>(cols));
    weight_row_to_f32(w, 0, y.data());
    double err = 0, ref = 0;
    for (int64_t i = 0; i < cols; ++i) {
      err += (y[i] - x[i]) * (y[i] - x[i]);
      ref += x[i] * x[i];
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_LE(rel, tol.at(name)) << rel;
    if (t != DType::kF32) EXPECT_GT(rel, 0.0);  // lossy types are lossy: the test can fail
  }
}

// The container: klein's reader takes back what the writer wrote (metadata, names, ggml dims,
// every type, padding to 32), and the blocks are the quantizer's.
TEST(GgufWriter, ContainerReadsBackWithEveryType) {
  const NpyArray in = must_npy(gguf_dir() / "quant_input.npy");
  const int64_t rows = in.shape[0], cols = in.shape[1];
  const std::vector<float> x = in.to_f32();
  std::vector<GgufKvOut> kvs = {{"general.architecture", GgufType::kString, "flux", 0},
                                {"general.file_type", GgufType::kU32, "", 15}};
  std::vector<GgufTensorOut> ts;
  for (const auto& [name, t] : kAll) ts.push_back({std::string("w.") + name, t, {cols, rows}, 0});
  ts.push_back({"a.vector.scale", DType::kF32, {7}, 0});  // 28 bytes: the next tensor needs padding
  for (GgufTensorOut& t : ts) t.nbytes = gguf_tensor_bytes(t.dtype, t.ne);
  const fs::path dir = klein::testing::make_temp_dir("gguf_writer");
  const fs::path path = dir / "all.gguf";
  Status st = write_gguf(path, kvs, ts, [&](size_t i, std::vector<uint8_t>& b) -> Status {
    if (ts[i].ne.size() == 1) {
      for (int k = 0; k < 7; ++k) std::memcpy(b.data() + 4 * k, &x[k], 4);
      return Status::Ok();
    }
    const int64_t rb = ggml_quant::row_bytes(ts[i].dtype, cols);
    for (int64_t r = 0; r < rows; ++r) ggml_quant::quantize_row(ts[i].dtype, x.data() + r * cols, cols, b.data() + r * rb);
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->string_value("general.architecture"), "flux");
  ASSERT_NE((*f)->value("general.file_type"), nullptr);
  EXPECT_EQ((*f)->value("general.file_type")->u, 15u);
  EXPECT_EQ(gguf_producer(**f), "ComfyUI-GGUF");
  ASSERT_EQ((*f)->tensors().size(), ts.size());
  for (const auto& [name, t] : kAll) {
    SCOPED_TRACE(name);
    const GgufTensor* g = (*f)->tensor(std::string("w.") + name);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->dtype, t);
    EXPECT_EQ(g->ne, (std::vector<int64_t>{cols, rows}));
    EXPECT_EQ(g->shape, (Shape{rows, cols}));
    EXPECT_EQ(g->offset % 32, 0u);
    const NpyArray want = must_npy(gguf_dir() / (std::string("quant_") + name + ".npy"));
    ASSERT_EQ(g->nbytes, want.bytes.size());
    EXPECT_EQ(std::memcmp(g->data, want.bytes.data(), g->nbytes), 0);
  }
  const GgufTensor* v = (*f)->tensor("a.vector.scale");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->shape, (Shape{7}));
  EXPECT_EQ(std::memcmp(v->data, x.data(), 28), 0);
  // A produce error leaves nothing behind (nor a temporary file).
  const fs::path bad = dir / "bad.gguf";
  st = write_gguf(bad, kvs, ts, [](size_t i, std::vector<uint8_t>&) -> Status {
    return i == 3 ? io_error("source read failed") : Status::Ok();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("source read failed"), std::string::npos) << st.to_string();
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir)) left += e.path().filename() != "all.gguf";
  EXPECT_EQ(left, 0u);
}

// --- klein quantize --type gguf:<T> ----------------------------------------------------------

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

Status write_tiny(const std::string& type, const std::string& flavor, const fs::path& out) {
  QuantizeOptions o;
  o.model = klein::testing::tiny_model_dir().string();
  o.type = "gguf:" + type;
  o.flavor = flavor;
  o.output = out.string();
  o.threads = 2;
  return quantize_model(o);
}

// Each of the 26 files (13 types × 2 flavors) equals, byte for byte, the file
// scripts/reference/check_gguf_written.py builds independently (torch + BFL renames of the
// Python single-file writer, the producers' type rules restated from their code, ggml's own
// quantizers, gguf-py's GGUFWriter), by SHA-256.
TEST(GgufQuantizeCli, TinyTransformerFilesEqualTheIndependentBuild) {
  auto want = read_json_file(gguf_dir() / "written_tiny.json");
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_EQ(want->size(), 26u);
  const fs::path dir = klein::testing::make_temp_dir("gguf_written");
  for (auto it = want->begin(); it != want->end(); ++it) {
    const std::string key = it.key();
    SCOPED_TRACE(key);
    const size_t sp = key.find(' ');
    const std::string flavor = key.substr(0, sp), type = key.substr(sp + 1);
    const fs::path out = dir / (flavor + "-" + type + ".gguf");
    Status st = write_tiny(type, flavor, out);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto d = sha256_file(out);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->sha256, it.value().get<std::string>());
  }
}

// The producers' naming, metadata and type rules, spelled out on the tiny model (cols 32 / 96 /
// 128: no row is whole K-quant blocks, so K-quant files keep F16 there as ComfyUI-GGUF does).
TEST(GgufQuantizeCli, FlavorsNameAndTypeAsTheirProducers) {
  const fs::path dir = klein::testing::make_temp_dir("gguf_flavors");
  ASSERT_TRUE(write_tiny("Q8_0", "comfy", dir / "c.gguf").ok());
  ASSERT_TRUE(write_tiny("Q8_0", "sdcpp", dir / "s.gguf").ok());
  ASSERT_TRUE(write_tiny("Q4_K", "comfy", dir / "k.gguf").ok());
  auto c = GgufFile::open(dir / "c.gguf");
  auto s = GgufFile::open(dir / "s.gguf");
  auto k = GgufFile::open(dir / "k.gguf");
  ASSERT_TRUE(c.ok() && s.ok() && k.ok());
  EXPECT_EQ(gguf_producer(**c), "ComfyUI-GGUF");
  EXPECT_EQ((*c)->string_value("general.architecture"), "flux");
  EXPECT_EQ((*c)->value("general.file_type")->u, 7u);
  EXPECT_EQ((*c)->value("general.quantization_version")->u, 2u);
  EXPECT_EQ(gguf_producer(**s), "stable-diffusion.cpp");
  EXPECT_TRUE((*s)->metadata().empty());
  auto type_of = [](const GgufFile& f, const std::string& n) {
    const GgufTensor* t = f.tensor(n);
    return t ? std::string(dtype_name(t->dtype)) : "absent";
  };
  EXPECT_EQ(type_of(**c, "double_blocks.0.img_attn.qkv.weight"), "Q8_0");
  EXPECT_EQ(type_of(**c, "double_stream_modulation_img.lin.weight"), "Q8_0");
  EXPECT_EQ(type_of(**c, "img_in.weight"), "BF16");  // kept as convert.py staged it (bf16 source)
  EXPECT_EQ(type_of(**c, "final_layer.adaLN_modulation.1.weight"), "BF16");
  EXPECT_EQ(type_of(**c, "double_blocks.0.img_attn.norm.query_norm.scale"), "F32");
  EXPECT_EQ(type_of(**s, "model.diffusion_model.double_blocks.0.img_attn.qkv.weight"), "Q8_0");
  EXPECT_EQ(type_of(**s, "model.diffusion_model.img_in.weight"), "BF16");
  EXPECT_EQ(type_of(**s, "model.diffusion_model.double_blocks.0.img_attn.norm.query_norm.scale"), "BF16");
  EXPECT_EQ(type_of(**k, "double_blocks.0.img_attn.qkv.weight"), "F16");  // 32 columns: not 256-blocks
  EXPECT_EQ((*k)->value("general.file_type")->u, 14u);
  const GgufTensor* qkv = (*c)->tensor("double_blocks.0.img_attn.qkv.weight");
  EXPECT_EQ(qkv->ne, (std::vector<int64_t>{32, 96}));  // ggml order: inputs first
}

// klein reads its own GGUF back: the same image as from the source folder under --precision
// fp32, exactly for F32 (the bf16 source values, unrounded), within Q8_0's error for Q8_0.
TEST(GgufQuantizeCli, OwnGgufGivesTheSourceModelsImage) {
  const fs::path dir = klein::testing::make_temp_dir("gguf_own");
  ASSERT_TRUE(write_tiny("F32", "comfy", dir / "f32.gguf").ok());
  ASSERT_TRUE(write_tiny("Q8_0", "sdcpp", dir / "q8.gguf").ok());
  const std::string common = " -q -W 32 -H 32 --seed 5 --prompt 'a red cube on a table' --threads 2 --precision fp32";
  auto r = klein::testing::run_cli("generate --model " + quoted(klein::testing::tiny_model_dir()) + common + " -o " +
                                   quoted(dir / "folder.png"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"f32", "q8"}) {
    r = klein::testing::run_cli("generate --model " + quoted(klein::testing::tiny_model_dir()) + " --diffusion-model " +
                                quoted(dir / (std::string(f) + ".gguf")) + common + " -o " + quoted(dir / (std::string(f) + ".png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  };
  auto a = decode_image(read(dir / "folder.png")), b = decode_image(read(dir / "f32.png")),
       q = decode_image(read(dir / "q8.png"));
  ASSERT_TRUE(a.ok() && b.ok() && q.ok());
  EXPECT_EQ(a->rgb, b->rgb);
  double se = 0;
  for (size_t i = 0; i < a->rgb.size(); ++i) se += (double(a->rgb[i]) - q->rgb[i]) * (double(a->rgb[i]) - q->rgb[i]);
  const double psnr = 10 * std::log10(255.0 * 255.0 / std::max(se / a->rgb.size(), 1e-12));
  std::printf("[gguf write] klein's Q8_0 GGUF vs the source folder: PSNR %.1f dB\n", psnr);
  EXPECT_GT(psnr, 30.0);
  EXPECT_NE(a->rgb, q->rgb);  // Q8_0 is lossy: the comparison can fail
  // klein info names the producer and the types.
  r = klein::testing::run_cli("info --model " + quoted(klein::testing::tiny_model_dir()) + " --diffusion-model " +
                              quoted(dir / "q8.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"GGUF v3 by stable-diffusion.cpp", "Q8_0 "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

// Bad input: one line, a non-zero exit, nothing left behind.
TEST(GgufQuantizeCli, BadInputsAreOneLineAndLeaveNothing) {
  const fs::path dir = klein::testing::make_temp_dir("gguf_bad");
  const std::string model = " --model " + quoted(klein::testing::tiny_model_dir());
  struct Case {
    std::string args, want;
  };
  std::ofstream(dir / "exists.gguf") << "x";
  const std::vector<Case> cases = {
      {"--type gguf:Q7_0 -o " + quoted(dir / "a.gguf"), "--type 'gguf:Q7_0': expected q8, q4, bf16 or gguf:Q8_0|"},
      {"--type gguf:Q4_K --flavor llama -o " + quoted(dir / "a.gguf"), "--flavor 'llama': expected comfy"},
      {"--type q8 --flavor sdcpp -o " + quoted(dir / "a"), "--flavor 'sdcpp': applies to --type gguf"},
      {"--type gguf:Q8_0 -o " + quoted(dir / "no" / "a.gguf"), "its folder does not exist"},
      {"--type gguf:Q8_0 -o " + quoted(dir / "exists.gguf"), "already exists"},
      {"--type gguf:Q8_0 -o /proc/klein-gguf-test.gguf", "/proc/klein-gguf-test.gguf: cannot create"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = klein::testing::run_cli("quantize -q" + model + " " + c.args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename() != "exists.gguf";
  EXPECT_EQ(n, 0u);
}

// A NaN in the source would make ggml's recipes convert out-of-range floats to integers: refused
// naming the tensor, nothing written.
TEST(GgufQuantizeCli, NonFiniteSourceWeightIsRefused) {
  const fs::path dir = klein::testing::make_temp_dir("gguf_nan");
  auto store = WeightStore::open(klein::testing::data_dir() / "single_file" / "tiny-flux2-bfl.safetensors");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  std::vector<std::vector<uint8_t>> copies;
  std::vector<TensorToWrite> ts;
  for (const std::string& n : store->names()) {
    const TensorEntry* e = store->entry(n);
    copies.emplace_back(e->data, e->data + e->nbytes);
    if (n == "double_blocks.1.img_mlp.0.weight") {
      ASSERT_EQ(e->dtype, DType::kBF16);
      const uint16_t nan = 0x7fc0;
      std::memcpy(copies.back().data() + 2 * 100, &nan, 2);  // row 3 of 32 columns
    }
    ts.push_back({n, e->dtype, e->shape, copies.back().data()});
  }
  ASSERT_TRUE(write_safetensors(dir / "nan.safetensors", ts).ok());
  auto r = klein::testing::run_cli("quantize -q --diffusion-model " + quoted(dir / "nan.safetensors") +
                                   " --type gguf:Q8_0 -o " + quoted(dir / "nan.gguf"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tensor 'double_blocks.1.img_mlp.0.weight' row 3 has a NaN or infinite value"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "nan.gguf"));
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename() != "nan.safetensors";
  EXPECT_EQ(n, 0u);
}

}  // namespace klein::gguf_write_test
