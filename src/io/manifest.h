// The integrity manifest (`klein manifest`, `--verify`, written by `klein quantize`): one JSON
// file naming every file a model load reads, with its size and SHA-256, and what klein detected
// in them (layout, variant, per-component scheme, family and tensor formats) for people to read.
// Verification compares files only; the rest is description.
//
//   {"klein_manifest": 1, "created_by": "klein 0.1.0", "layout": "diffusers folder",
//    "variant": "distilled", "components": {"transformer": {...}, ...},
//    "files": [{"role": "transformer", "path": "transformer/diffusion_pytorch_model.safetensors",
//               "size": 7751069824, "sha256": "…64 hex…"}, …]}
//
// A file's path is relative to the model folder when it lies inside it, else its file name, so a
// manifest stays valid when the model is moved or copied elsewhere.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace klein {

inline constexpr int kManifestVersion = 1;

struct ManifestFile {
  std::string role;  // "transformer", "text_encoder", "vae", "tokenizer", "scheduler", "pipeline"; "+"-joined when shared
  std::string path;  // relative path or file name, '/'-separated
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct Manifest {
  std::string created_by, layout, variant;
  nlohmann::json components = nlohmann::json::object();
  std::vector<ManifestFile> files;  // sorted by (role, path); no two with one (role, path)
};

// Parses and checks a manifest's text: the version, every file entry (role and path non-empty
// strings, a relative path with no "." or ".." parts, size a non-negative integer, sha256 64
// hex digits) and no duplicate (role, path). Errors name `where` and the entry.
Result<Manifest> parse_manifest(std::string_view text, const std::string& where);
// Its JSON text (files sorted), as parse_manifest reads it back.
std::string manifest_json(const Manifest& m);

}  // namespace klein
