// The files a resolved layout reads, and manifests of them (io/manifest.h): what `klein manifest`
// writes, `--verify` checks and `klein quantize` writes for its output.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "api/layout.h"
#include "io/manifest.h"

namespace klein::api {

// One file a load of `l` reads: its manifest entry (role, relative path; no size or hash yet)
// and where it is. Every component's weights, index and config.json, the tokenizer's files, the
// scheduler config and model_index.json, each once (an all-in-one file once, its roles joined).
// Built-in parts (tokenizer, scheduler) have no file. Missing parts are an error (l.complete()).
struct LayoutFile {
  ManifestFile entry;
  std::filesystem::path path;
};
Result<std::vector<LayoutFile>> layout_files(const Layout& l);

// The manifest of `l`: files hashed on `threads` threads (0: one per core), components described
// as `klein info` does (`model`, `options`: what resolved `l`).
Result<Manifest> build_manifest(const Layout& l, const std::string& model, const LoadOptions& options, int threads,
                                const std::function<bool()>& cancel = nullptr);

// Checks the files `l` reads against the manifest at `manifest_path`: the same files (by role and
// path), each of the size and SHA-256 recorded. Sizes are compared before anything is hashed.
Status verify_layout(const Layout& l, const std::string& manifest_path, int threads,
                     const std::function<bool()>& cancel = nullptr);

}  // namespace klein::api
