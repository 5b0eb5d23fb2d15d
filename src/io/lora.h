// LoRA files of every FLUX.2 [klein] trainer, read into deltas on the weights the models bind.
//
// Key schemes (docs/lora.md; diffusers' Flux2LoraLoaderMixin.lora_state_dict and
// lora_conversion_utils.py are the reference for each):
//   diffusers / PEFT   transformer.<diffusers module>.lora_A.weight / .lora_B.weight [/ .alpha]
//                      text_encoder.<transformers module>.lora_A.weight / ...
//   BFL-named PEFT     diffusion_model.<BFL module>.lora_A.weight (ai-toolkit, fal, ComfyUI),
//                      base_model.model.<BFL module>... (PEFT save of the BFL model), or no prefix
//   kohya / musubi     lora_unet_<module with '_' for '.'>.lora_down.weight / .lora_up.weight / .alpha,
//                      lora_te_<text-encoder module>...
//   LyCORIS            <any prefix above><module>.lokr_w1 (or _a/_b), .lokr_w2 (or _a/_b), .alpha;
//                      .hada_w1_a / _b, .hada_w2_a / _b, .alpha
// A module name is resolved against the model's own tensor names (diffusers / transformers), then
// through the BFL → diffusers name map (io/name_map.h): a fused BFL qkv gets its delta cut into
// row blocks (q, k, v), the final layer's modulation its two row halves swapped (BFL's
// (shift, scale) is diffusers' (scale, shift)). Every key must be understood: unknown keys, keys
// whose module the model lacks, or a half of a pair alone are an error naming them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace klein {

// Which model a delta changes.
enum class LoraComponent : uint8_t { kTransformer, kTextEncoder };
const char* lora_component_name(LoraComponent c);

enum class LoraKind : uint8_t { kLora, kLoKr, kLoHa };

// A weight a LoRA may change: its name in the model (tensor_table) and shape [rows, cols].
struct LoraTarget {
  LoraComponent component = LoraComponent::kTransformer;
  std::string name;  // e.g. "transformer_blocks.0.attn.to_q.weight"
  Shape shape;
  // A weight of the checkpoint that klein never runs (the text encoder's layers past the deepest
  // tap): a LoRA module on it is checked and then dropped, as it cannot change the output.
  bool unused = false;
};

// One module's change of rows [row0, row0 + rows) of a target weight, in float32:
//   rank > 0: ΔW = scale · up[rows, rank] · down[rank, cols]
//   rank == 0: ΔW = scale · down[rows, cols] (LoKr / LoHa, formed here)
// `scale` is the file's alpha / rank (1 without alpha); the user's strength is applied later.
struct LoraDelta {
  LoraComponent component = LoraComponent::kTransformer;
  std::string target;
  std::string module;  // the module as the file names it (messages)
  LoraKind kind = LoraKind::kLora;
  int64_t row0 = 0, rows = 0, cols = 0, rank = 0;
  double scale = 1.0;  // Python's float, as PEFT keeps lora_alpha / r
  std::vector<float> down, up;
};

struct LoraFile {
  std::string origin;  // the path, for messages
  std::string scheme;  // "diffusers/PEFT", "BFL-named PEFT", "kohya", "LyCORIS LoKr", ... (first seen)
  std::vector<LoraDelta> deltas;
  size_t bytes() const;  // float32 bytes of the deltas' factors
};

// Reads the LoRA in `store` (one safetensors file) against `targets`, the weights of
// `component`: modules whose prefix names the other component are skipped (they are read when
// that model loads). Errors are one line naming the file and the key(s).
Result<LoraFile> parse_lora(const WeightStore& store, const std::vector<LoraTarget>& targets, LoraComponent component);
Result<LoraFile> load_lora(const std::filesystem::path& path, const std::vector<LoraTarget>& targets,
                           LoraComponent component);

}  // namespace klein
