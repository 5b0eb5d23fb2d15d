// Tensor-name maps between a checkpoint's naming scheme and the diffusers / transformers names the
// models bind. A NameMap is data — an ordered table of rules — so that one engine (MappedSource,
// detection, later LoRA and GGUF) applies every scheme, and a scheme is reviewed against its
// source (diffusers' single_file_utils.py converters) line by line.
//
// Patterns are literal text with placeholders: {i} and {j} match a block index (decimal, no
// leading zero, at most 6 digits) and {*} the non-empty rest of the name (last in a pattern
// only). A target pattern may use the placeholders its source pattern captured.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace klein {

// What a rule does to the tensor besides renaming it.
enum class NameOp : uint8_t {
  kRename,      // the same tensor under the target name
  kSplitRows,   // rows cut into to.size() equal parts, in order (BFL fused qkv): views, no copy
  kSwapHalves,  // the two row halves exchanged, (shift, scale) ↔ (scale, shift): an owned copy
  kReshape,     // trailing size-1 dimensions dropped or appended to reach `rank` (1×1 conv ↔ linear)
  kOhwiToOihw,  // a 4-D conv weight [O, H, W, I] (MLX's layout) permuted to torch's [O, I, H, W]: an owned copy
};

struct NameRule {
  std::string from;             // source pattern
  std::vector<std::string> to;  // one target (kSplitRows: one per part)
  NameOp op = NameOp::kRename;
  int rank = 0;                 // kReshape only
};

struct NameMap {
  std::string name;             // "bfl_flux2_dit", for messages
  std::vector<NameRule> rules;  // the first rule whose `from` matches a name applies
};

// A tensor as a name and its shape (detection and dry runs of a map work on these).
struct TensorInfo {
  std::string name;
  Shape shape;
};

// One target of a source tensor: its name, the rule (index into map.rules) and, for kSplitRows,
// which part.
struct MappedName {
  std::string target;
  size_t rule = 0;
  int part = 0;
};

// The targets `source` maps to; empty when no rule matches.
std::vector<MappedName> map_name(const NameMap& map, std::string_view source);
// The source name that gives `target`, and which rule and part do (the inverse of map_name:
// LoRA keys and writers of a scheme need it); nullopt when no rule produces it.
struct SourceName {
  std::string source;
  size_t rule = 0;
  int part = 0;
};
std::optional<SourceName> unmap_name(const NameMap& map, std::string_view target);

// The shape a rule gives a tensor of `shape` (part `part`), or an error naming the tensor.
Result<Shape> mapped_shape(const NameMap& map, const MappedName& m, const std::string& source, const Shape& shape);

// Maps every name: (source, target) pairs sorted by target. Every name must match a rule and no
// two may give one target; the error names the unmatched (or clashing) tensors and `where`.
Result<std::vector<std::pair<std::string, MappedName>>> map_names(const NameMap& map,
                                                                  const std::vector<std::string>& names,
                                                                  const std::string& where);
// Applies the map to names and shapes (a dry run of MappedSource, no data): every tensor must
// match a rule and no two may give one target; the error names the unmatched or clashing
// tensors and `where`. The result is sorted by target name.
Result<std::vector<TensorInfo>> map_tensor_infos(const NameMap& map, const std::vector<TensorInfo>& tensors,
                                                 const std::string& where);

// The schemes (diffusers' converters in src/diffusers/loaders/single_file_utils.py):
// BFL / ComfyUI FLUX.2 transformer → diffusers Flux2Transformer2DModel
// (convert_flux2_transformer_checkpoint_to_diffusers).
const NameMap& bfl_flux2_dit_map();
// BFL ae.safetensors / ComfyUI flux2-vae.safetensors (LDM names) → diffusers AutoencoderKLFlux2
// (convert_ldm_vae_checkpoint with FLUX.2's four levels and its quant convs under encoder./decoder.).
const NameMap& ldm_flux2_vae_map();
// A transformers Qwen3 saved as one file (ComfyUI qwen_3_4b.safetensors): the names already are
// the transformers names; a ComfyUI all-in-one prefix is removed by ScopedSource, not here.
const NameMap& hf_qwen3_single_file_map();
// llama.cpp's GGUF names of a Qwen3 (token_embd, blk.N.attn_q, ..., output_norm) → transformers'
// Qwen3ForCausalLM names. Renames only: llama.cpp does not permute Qwen3's q / k rows.
const NameMap& llama_cpp_qwen3_map();
// Quantization companions of a layer's `X.weight`, by the suffix after "X." that producers give
// them: BFL's fp8 files `weight_scale` / `input_scale`, ComfyUI's legacy scaled fp8
// `scale_weight` / `scale_input`, ComfyUI's per-layer JSON `comfy_quant`. Sources pair them with
// the weight before any map applies (a split or rename then carries them along), so one table
// serves BFL and diffusers names alike and the maps never see a companion. Where a file has both
// spellings of a role, the first listed wins.
enum class CompanionRole : uint8_t { kWeightScale, kInputScale, kQuantConfig };
struct CompanionRule {
  std::string_view suffix;
  CompanionRole role;
};
std::span<const CompanionRule> quant_companion_rules();

// mflux packs (ModelSaver: per component folder, shards N.safetensors) → diffusers /
// transformers names, the inverse of mflux's Flux2WeightMapping
// (src/mflux/models/flux2/weights/flux2_weight_mapping.py): the transformer's
// time_guidance_embed.linear_{1,2} and attn.to_out, the VAE's attention to_out and its convs in
// MLX's OHWI layout (WeightTransforms.transpose_conv2d_weight), the text encoder without
// transformers' "model." prefix.
const NameMap& mflux_flux2_dit_map();
const NameMap& mflux_flux2_vae_map();
const NameMap& mflux_qwen3_map();

// The map called `name` (one of the above), or null.
const NameMap* name_map_by_name(std::string_view name);

}  // namespace klein
