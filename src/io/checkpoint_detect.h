// What a checkpoint file holds, from its tensor names and shapes alone: which components (a DiT,
// a VAE, a text encoder; several in a ComfyUI all-in-one checkpoint), under which prefix, in
// which naming scheme, and which model family — plus presets that synthesise the diffusers
// config.json a component folder would carry. The next layer (a layout resolver) turns each
// part into {ScopedSource + MappedSource, config, where}.
//
// Sources of the rules: diffusers single_file_utils.py (CHECKPOINT_KEY_NAMES, infer_diffusers_model_type),
// ComfyUI model_detection.py / supported_models.py (prefixes "model.diffusion_model.", "vae.",
// "text_encoders."), and docs/design formats-and-variants.md §1.7.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/name_map.h"

namespace klein {

class TensorSource;

enum class Component : uint8_t { kTransformer, kVae, kTextEncoder, kUnknown };
enum class NamingScheme : uint8_t {
  kDiffusers,       // diffusers model names (a diffusers folder's component)
  kBfl,             // BFL / ComfyUI transformer names (double_blocks.N…)
  kLdm,             // LDM autoencoder names (encoder.down.N.block.M…)
  kHfTransformers,  // transformers names (model.layers.N…)
  kLlamaCpp,        // llama.cpp GGUF names (blk.N…): Qwen3 mapped by llama_cpp_qwen3_map
  kMflux,           // an mflux pack's component (mflux's module names, OHWI VAE convs)
  kUnknown,
};
enum class Family : uint8_t {
  kFlux2Klein4B,
  kFlux2Klein9B,
  kFlux2Dev,
  kFlux2Other,  // the FLUX.2 architecture at other sizes (the tiny test model)
  kFlux2Vae,
  kQwen3,
  kFlux1,       // recognised so that the error can say so; klein does not run it
  kFlux1Vae,
  kUnknown,
};

struct CheckpointPart {
  Component component = Component::kUnknown;
  NamingScheme scheme = NamingScheme::kUnknown;
  Family family = Family::kUnknown;
  std::string prefix;          // removed by ScopedSource ("" when none)
  const NameMap* map = nullptr;  // to the diffusers / transformers names; null: names already are
  std::vector<TensorInfo> tensors;  // diffusers / transformers names (mapped), sorted; empty if unknown
  std::string description;     // one line: "FLUX.2 [klein] 4B transformer, BFL names (D 3072, 5 + 20 blocks)"
  bool supported() const;      // a klein component klein can load
};

struct CheckpointInfo {
  std::vector<CheckpointPart> parts;  // by prefix; a file without prefixes has one part
  std::string description;            // the parts' descriptions joined with "; "
};

// `where` names the file for messages. Never fails for unknown names (they form a part of
// Family::kUnknown); fails when a recognised scheme's map does not fit (unmatched or clashing
// names, a fused tensor that does not split) or a shape is not the one its role needs.
Result<CheckpointInfo> detect_checkpoint(const std::vector<TensorInfo>& tensors, const std::string& where);
Result<CheckpointInfo> detect_checkpoint(const TensorSource& src);

// The diffusers / transformers config.json of a supported part, from its shapes (block counts
// from the highest index, widths from the projections) and FLUX.2's fixed choices (rope theta
// 2000, eps 1e-6, 4 rope axes; VAE norm groups 32; Qwen3 rope theta 1e6). Fails naming the
// tensor when one the preset reads is missing or inconsistent.
Result<nlohmann::json> preset_config(const CheckpointPart& part, const std::string& where);

const char* family_name(Family f);

}  // namespace klein
