#include "pipeline/quantize_gguf.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>

#include "core/quantize_gguf.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "io/gguf_writer.h"
#include "io/name_map.h"
#include "io/tensor_source.h"

namespace klein {
// Named, not anonymous: unity builds put this file beside quantize_model.cpp (is_float, decide).
namespace gguf_dit {

// ggml type names as GGUF tools spell them, for --type gguf:<NAME>.
constexpr std::pair<const char*, DType> kTypes[] = {
    {"Q8_0", DType::kQ8_0}, {"Q4_0", DType::kQ4_0}, {"Q4_1", DType::kQ4_1}, {"Q5_0", DType::kQ5_0},
    {"Q5_1", DType::kQ5_1}, {"Q2_K", DType::kQ2_K}, {"Q3_K", DType::kQ3_K}, {"Q4_K", DType::kQ4_K},
    {"Q5_K", DType::kQ5_K}, {"Q6_K", DType::kQ6_K}, {"F16", DType::kF16},   {"BF16", DType::kBF16},
    {"F32", DType::kF32},
};

const char* type_name(DType t) {
  for (const auto& [n, d] : kTypes)
    if (d == t) return n;
  return "?";
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
bool is_block(DType t) { return ggml_quant::block_elems(t) > 1; }

// The names both producers keep unquantized for FLUX (lcpp.patch; model_loader.cpp).
bool flux_kept(const std::string& name) {
  for (const char* k : {"txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer."})
    if (name.find(k) != std::string::npos) return true;
  return false;
}

// One BFL tensor of the output: the diffusers tensors it is made of (the parts of a split rule
// in order, or one), and how its rows come from theirs.
struct DitTensor {
  std::string bfl;                 // BFL name (no prefix)
  std::vector<std::string> parts;  // diffusers names
  NameOp op = NameOp::kRename;
  DType src_dtype = DType::kF32;
  Shape shape;                     // row-major BFL shape
  DType out = DType::kF32;
};

// The output type of `t` under the flavor's rules (see quantize_gguf.h).
DType decide(const DitTensor& t, DType target, GgufFlavor flavor) {
  const int64_t cols = t.shape.back();
  const int64_t numel = shape_numel(t.shape);
  const bool whole_blocks = cols % ggml_quant::block_elems(target) == 0;
  if (flavor == GgufFlavor::kSdcpp) {
    const bool keep = (is_block(target) && !whole_blocks) || t.bfl.ends_with(".bias") || t.bfl.ends_with(".scale") ||
                      t.bfl.ends_with(".weight_scale") || flux_kept(t.bfl) || t.bfl.find("embedding") != std::string::npos;
    return keep ? t.src_dtype : target;
  }
  // ComfyUI-GGUF: convert.py's staging, then llama-quantize.
  DType stage = t.src_dtype == DType::kBF16 ? DType::kBF16 : DType::kF16;
  if ((t.src_dtype == DType::kF32 || t.src_dtype == DType::kBF16) && (t.shape.size() == 1 || numel <= 1024))
    stage = DType::kF32;
  const bool quantize = t.bfl.ends_with("weight") && t.shape.size() >= 2 && !flux_kept(t.bfl);
  if (!quantize) return stage;
  return is_block(target) && !whole_blocks ? DType::kF16 : target;
}

// Rows of the BFL tensor from its diffusers parts: row r of a split tensor is row r mod n of
// part r / n (n rows a part); the final modulation's halves are exchanged back.
struct RowSource {
  const Weight* w;
  int64_t row;
};
RowSource row_of(const DitTensor& t, const std::vector<Weight>& ws, int64_t r) {
  if (t.op == NameOp::kSplitRows) {
    const int64_t n = ws[0].rows();
    return {&ws[static_cast<size_t>(r / n)], r % n};
  }
  if (t.op == NameOp::kSwapHalves) {
    const int64_t h = ws[0].rows() / 2;
    return {&ws[0], r < h ? r + h : r - h};
  }
  return {&ws[0], r};
}

Result<std::vector<DitTensor>> plan(const TensorSource& src, DType target, GgufFlavor flavor) {
  const NameMap& map = bfl_flux2_dit_map();
  std::map<std::string, DitTensor> by_bfl;
  for (const std::string& n : src.names()) {
    const std::optional<SourceName> s = unmap_name(map, n);
    if (!s) return unsupported(src.origin() + ": tensor '" + n + "' has no FLUX.2 BFL name (not a klein transformer?)");
    KLEIN_ASSIGN_OR_RETURN(Weight w, src.get(n));
    if (!is_float(w.dtype) || w.scales)
      return unsupported(src.file_of(n) + ": tensor '" + n + "' is already " + std::string(w.format().name) +
                         "; write a GGUF from the full-precision model");
    if (w.shape.empty() || w.shape.size() > 2)
      return unsupported(src.file_of(n) + ": tensor '" + n + "' " + shape_str(w.shape) + ": not 1-D or 2-D");
    DitTensor& t = by_bfl[s->source];
    t.bfl = s->source;
    t.op = map.rules[s->rule].op;
    t.src_dtype = w.dtype;
    if (t.parts.size() <= static_cast<size_t>(s->part)) t.parts.resize(static_cast<size_t>(s->part) + 1);
    t.parts[static_cast<size_t>(s->part)] = n;
    if (t.shape.empty()) t.shape = w.shape;
    else if (t.op == NameOp::kSplitRows) t.shape[0] += w.shape[0];
  }
  std::vector<DitTensor> out;
  for (auto& [name, t] : by_bfl) {
    for (const std::string& p : t.parts)
      if (p.empty()) return unsupported(src.origin() + ": '" + name + "' is missing one of its q / k / v parts");
    if (t.op == NameOp::kSwapHalves && t.shape[0] % 2 != 0)
      return unsupported(src.origin() + ": '" + t.parts[0] + "' has an odd number of rows");
    t.out = decide(t, target, flavor);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace gguf_dit

Result<DType> parse_gguf_type(const std::string& type) {
  using gguf_dit::kTypes;
  if (type.starts_with("gguf:"))
    for (const auto& [n, d] : kTypes)
      if (type.substr(5) == n) return d;
  std::string names;
  for (const auto& [n, d] : kTypes) names += std::string(names.empty() ? "" : "|") + n;
  return invalid_argument("--type '" + type + "': expected q8, q4, bf16 or gguf:" + names);
}

Result<GgufFlavor> parse_gguf_flavor(const std::string& flavor) {
  if (flavor == "comfy" || flavor.empty()) return GgufFlavor::kComfy;
  if (flavor == "sdcpp") return GgufFlavor::kSdcpp;
  return invalid_argument("--flavor '" + flavor + "': expected comfy (ComfyUI-GGUF) or sdcpp (stable-diffusion.cpp)");
}

uint32_t llama_file_type(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kQ5_0: return 8;
    case DType::kQ5_1: return 9;
    case DType::kQ2_K: return 10;
    case DType::kQ3_K: return 11;  // Q3_K_S
    case DType::kQ4_K: return 14;  // Q4_K_S
    case DType::kQ5_K: return 16;  // Q5_K_S
    case DType::kQ6_K: return 18;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

Status write_dit_gguf(const GgufDitSpec& spec) {
  using namespace gguf_dit;  // NOLINT: this function only (unity builds)
  const TensorSource& src = *spec.source;
  KLEIN_ASSIGN_OR_RETURN(std::vector<DitTensor> tensors, plan(src, spec.type, spec.flavor));
  if (tensors.empty()) return not_found(src.origin() + ": no transformer tensors");
  const std::string prefix = spec.flavor == GgufFlavor::kSdcpp ? "model.diffusion_model." : "";
  std::vector<GgufKvOut> kvs;
  if (spec.flavor == GgufFlavor::kComfy) {
    kvs.push_back({"general.architecture", GgufType::kString, "flux", 0});
    kvs.push_back({"general.quantization_version", GgufType::kU32, "", 2});
    kvs.push_back({"general.file_type", GgufType::kU32, "", llama_file_type(spec.type)});
  }
  std::vector<GgufTensorOut> infos;
  std::map<DType, int> counts;
  for (const DitTensor& t : tensors) {
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    infos.push_back({prefix + t.bfl, t.out, ne, gguf_tensor_bytes(t.out, ne)});
    ++counts[t.out];
  }
  ThreadPool pool(spec.threads);
  int done = 0;
  const int count = static_cast<int>(tensors.size());
  auto produce = [&](size_t i, std::vector<uint8_t>& bytes) -> Status {
    if (spec.cancel && spec.cancel()) return cancelled("quantize: cancelled");
    const DitTensor& t = tensors[i];
    std::vector<Weight> ws;
    for (const std::string& p : t.parts) {
      KLEIN_ASSIGN_OR_RETURN(Weight w, src.get(p));
      ws.push_back(std::move(w));
    }
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.shape.back();
    const int64_t rb = ggml_quant::row_bytes(t.out, cols);
    // A 1-D tensor is one row of `cols` elements. A NaN or infinity would make ggml's recipes
    // convert out-of-range floats to integers (undefined): refused, naming the tensor.
    std::atomic<int64_t> bad_row{-1};
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        if (t.shape.size() == 1) {
          weight_to_f32(ws[0], 0, cols, row.data());
        } else {
          const RowSource rs = row_of(t, ws, r);
          weight_row_to_f32(*rs.w, rs.row, row.data());
        }
        if (!std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); })) {
          bad_row = r;
          return;
        }
        ggml_quant::quantize_row(t.out, row.data(), cols, bytes.data() + r * rb);
      }
    }, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, cols / 64)));
    if (bad_row >= 0)
      return invalid_argument(src.file_of(t.parts[0]) + ": tensor '" + t.bfl + "' row " + std::to_string(bad_row.load()) +
                              " has a NaN or infinite value; not written");
    for (const Weight& w : ws) src.advise(w.data, w.nbytes, Residency::kDontNeed);
    if (spec.progress) spec.progress("quantize transformer", ++done, count);
    return Status::Ok();
  };
  KLEIN_RETURN_IF_ERROR(write_gguf(spec.output, kvs, infos, produce));
  if (spec.log) {
    std::string summary;
    for (const auto& [d, n] : counts) summary += std::string(summary.empty() ? "" : ", ") + std::to_string(n) + " " + type_name(d);
    spec.log("transformer: " + std::to_string(count) + " tensors (" + summary + ")");
  }
  return Status::Ok();
}

}  // namespace klein
