// The layout resolver: what the user pointed klein at — a diffusers folder, one safetensors file
// (a DiT, a VAE, a text encoder or a ComfyUI all-in-one checkpoint), and optional separate DiT /
// text-encoder / VAE files that may also replace parts of a folder — turned into one spec per
// component: how to open its tensors (decorated for its naming scheme), its config (the folder's
// config.json or io/checkpoint_detect.h's preset) and what it is, for messages and `klein info`.
// Model::open, measure_weights and Model::inspect read components through these specs only.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint_detect.h"
#include "io/model_folder.h"
#include "klein/klein.h"

namespace klein {
class TensorSource;
}

namespace klein::api {

struct ComponentSpec {
  std::string role;            // "transformer", "text_encoder" or "vae" (the diffusers folder's names)
  std::filesystem::path path;  // a diffusers component folder, or the safetensors file
  bool from_folder = false;    // a folder component (no prefix, no map; its config.json's "quantization" applies)
  std::string prefix;          // the all-in-one prefix ScopedSource removes ("" when none)
  const NameMap* map = nullptr;  // to the diffusers / transformers names; null: already those
  nlohmann::json config;
  std::string config_where;    // the config.json, or "<file> (config from its tensor shapes)"
  std::string where;           // the file or folder, for messages
  NamingScheme scheme = NamingScheme::kDiffusers;
  Family family = Family::kUnknown;  // kUnknown for a folder component (not detected at open)
  std::string description;     // "FLUX.2 [klein] 4B transformer, BFL names (…)" or "diffusers folder component"

  // The component's tensors, opened afresh (MemoryPolicy::kLow maps a component per phase).
  Result<std::shared_ptr<const TensorSource>> open() const;
};

// A component slot: its spec, or why there is none (missing from what was given, or broken).
struct ComponentSlot {
  std::optional<ComponentSpec> spec;
  Status error;  // non-ok when spec is empty
};

struct Layout {
  std::string kind;  // "diffusers folder", "diffusers folder with parts replaced", "single files",
                     // "all-in-one checkpoint"
  std::optional<ModelFolder> folder;
  ComponentSlot text_encoder, transformer, vae;
  nlohmann::json scheduler;
  std::string scheduler_where;         // the folder's scheduler_config.json, or "built-in"
  Status scheduler_error;              // a folder's broken or missing scheduler
  std::filesystem::path tokenizer;     // a tokenizer folder or tokenizer.json; empty: the built-in one
  Status tokenizer_error;              // a tokenizer model_index.json names but the folder lacks
  bool distilled = true;
  bool kv = false;                     // the KV-cached editing distill (Flux2KleinKVPipeline, --variant kv)
  std::string variant_source;          // where `distilled` comes from ("model_index.json is_distilled",
                                       // "--variant", "default for single files")
  std::vector<std::string> notes;      // one line each, for the caller's log (e.g. "base" in a file name)
  std::string given;                   // what was given, for messages: "--model X, --vae Y"

  // The first component, tokenizer or scheduler error, in pipeline order; Ok when all are there.
  Status complete() const;
};

// What the user passed. `model` is a diffusers folder or a safetensors file (either may be empty
// when the separate files give every part); the others each name one component's file.
struct LayoutRequest {
  std::string model, diffusion_model, text_encoder, vae;
  Variant variant = Variant::kAuto;
};
LayoutRequest layout_request(const std::string& model, const LoadOptions& options);

// Resolves the request. Fails (one line) on a file that is not a klein component (naming what it
// looks like), a file given for a component it does not hold, two files for one component, and
// a wrong pairing (the transformer's text width ≠ 3 × the encoder's hidden size; the VAE's latent
// channels ≠ the transformer's); a missing or broken component is recorded in its slot, so that
// `klein info` can still report the rest (Layout::complete says whether the pipeline can run).
Result<Layout> resolve_layout(const LayoutRequest& request);

}  // namespace klein::api
