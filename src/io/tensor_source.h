// Where a model's tensors come from. A TensorSource maps logical tensor names (the diffusers /
// transformers keys the models ask for) to Weights in any format of core/format.h. Quantized
// weights stored as several tensors (an int8 matrix and its scales, MLX's packed words, scales
// and biases) are resolved by the source into one Weight, so the models never see companions.
//
// SafetensorsSource and GgufSource (io/gguf.h) read files; ScopedSource / MappedSource adapt names
// (io/mapped_source.h). The source keeps its storage (mappings) alive for as
// long as it lives; models hold it through a shared_ptr.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/weight.h"
#include "io/quant_meta.h"
#include "io/safetensors.h"

namespace klein {

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // Logical names: companion tensors (scales, biases of a quantized weight) are not listed.
  virtual bool has(const std::string& name) const = 0;
  // The named tensor with nbytes (and scales) set. Not validated for computing: a source hands
  // out I64 buffers too; the binder refuses them where a weight is needed.
  virtual Result<Weight> get(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;  // sorted
  // The file holding `name`, for messages (the origin when unknown).
  virtual std::string file_of(const std::string& name) const = 0;
  // What was opened (a folder or a file), for messages.
  virtual const std::string& origin() const = 0;
  // Bytes of all stored tensors, companions included.
  virtual size_t total_bytes() const = 0;
  // A hint about the stored bytes [p, p + n) (a Weight's data or scales): prefetch them or drop
  // them from this process's memory. Bytes the source does not map (owned copies) are left
  // alone, so callers may pass any weight. Streaming residency (api/residency.h) uses it.
  virtual void advise(const void* /*p*/, size_t /*n*/, Residency /*r*/) const {}
};

// The error for an MLX layout the engine does not compute, at `where` (a file and tensor):
// `layout` ("MLX 8-bit with groups of 32") and the layouts it does compute.
Status unsupported_mlx_layout(const std::string& where, const std::string& layout);
// "MLX 8-bit with groups of 32" for `bits` and `group` that MLX can write (bits 2-8, groups 32 /
// 64 / 128); empty for any other pair.
std::string mlx_layout_name(int64_t bits, int64_t group);

// One or several safetensors files (see WeightStore::open for the accepted paths). Resolves:
//   X.weight I8 [rows, ...] + X.weight_scale [rows] or [rows, 1] (f32/f16/bf16) → Q8_ROW
//   X.weight U32 [rows, cols/8] + X.scales + X.biases [rows, cols/64] (MLX 4-bit, group 64)
//     → Q4_G64 [rows, cols]; U32 [rows, cols/4] with those companions in a file whose header says
//     quantization_level "8" (mflux) → Q8_G64 [rows, cols]
//   X.weight F8_E4M3 + scalar X.weight_scale (or X.scale_weight; + X.input_scale / X.scale_input)
//     → F8_E4M3_SCALED (BFL and ComfyUI fp8); an I8 X.weight with a scalar scale (ComfyUI
//     int8_tensorwise) → Q8_ROW with the scale repeated per row
// and checks each layer against ComfyUI's `X.comfy_quant` JSON or the header's
// `_quantization_metadata` (io/quant_meta.h). The companions are named by quant_companion_rules
// (io/name_map.h). In a file with scaled fp8 weights an F8_E4M3 weight without a scale is an
// error; elsewhere F8_E4M3 is a plain type (unscaled fp8 files).
class SafetensorsSource final : public TensorSource {
 public:
  static Result<std::shared_ptr<SafetensorsSource>> open(const std::filesystem::path& path);
  explicit SafetensorsSource(WeightStore store);

  bool has(const std::string& name) const override;
  Result<Weight> get(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::string file_of(const std::string& name) const override;
  const std::string& origin() const override { return store_.origin(); }
  size_t total_bytes() const override { return store_.total_bytes(); }
  void advise(const void* p, size_t n, Residency r) const override { store_.advise(p, n, r); }

  const WeightStore& store() const { return store_; }

  // The "quantization" entry of the component's config.json, checked against the tensors. klein
  // quantize writes {"type": "q8" | "q4" | "bf16", ...} (q4 also "bits": 4, "group_size": 64),
  // MLX {"group_size": G, "bits": B}. An unknown scheme, or one the tensors contradict (other
  // bits or group size, a quantized type over unquantized weights, quantized weights under
  // "bf16"), is an error naming `config_where` and a tensor; an MLX layout the engine does not
  // compute is refused naming it. Without the entry there is nothing to check.
  Status check_quantization(const nlohmann::json& config, const std::string& config_where) const;

 private:
  // Companions of a quantized weight (empty strings for a plain tensor).
  struct Companions {
    std::string scale, offset, input_scale, config;
  };
  Result<Weight> resolve(const std::string& name, const Companions& c) const;
  Result<Weight> resolve_fp8(const std::string& name, const Companions& c, const std::string& where) const;
  // The layer's ComfyUI quantization config (its `config` tensor, else the header's entry for it),
  // if any, against how `name` is stored; formats klein does not compute are refused. convrot's
  // group size goes to *rotation (int8 layers); without `rotation` a convrot layer is refused.
  Status check_layer_quant(const std::string& name, const std::string& where, DType stored,
                           const std::string& config, int64_t* rotation = nullptr) const;

  WeightStore store_;
  std::unordered_map<std::string, Companions> quantized_;  // weight name → its companions
  std::unordered_map<std::string, std::string> companion_of_;  // companion name → weight name
  Status meta_status_;  // the header's _quantization_metadata, if it did not parse
  std::map<std::string, LayerQuant> layer_meta_;  // ... and its layers when it did
  // MLX bits from the header's "quantization_level" (mflux): 0 none (U32 words are 4-bit),
  // 4 or 8, -1 another value (refused).
  int mlx_bits_ = 0;
};

}  // namespace klein
