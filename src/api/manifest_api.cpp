// Manifests of what a model load reads (api/manifest.h) and the public make/write/verify calls.
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "api/guard.h"
#include "api/manifest.h"
#include "io/atomic_file.h"
#include "io/sha256.h"
#include "klein/klein.h"

namespace fs = std::filesystem;

namespace klein::api {

namespace {

// The manifest's name for `p`: relative to the model folder when inside it, else the file name
// (single files are matched by name, wherever they are moved).
std::string manifest_path_of(const fs::path& p, const fs::path& root) {
  if (!root.empty()) {
    const fs::path rel = p.lexically_normal().lexically_relative(root.lexically_normal());
    if (!rel.empty() && *rel.begin() != ".." && rel != ".") return rel.generic_string();
  }
  return p.filename().generic_string();
}

// The weight files of a component folder as WeightStore::open reads them: an index json and the
// shards it names, or every *.safetensors; and the folder's config.json.
Status folder_files(const fs::path& dir, std::vector<fs::path>* out) {
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec)) continue;
    if (name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json") ||
        name.ends_with(".gguf"))
      found.push_back(e.path());
  }
  if (ec) return io_error(dir.string() + ": cannot list (" + ec.message() + ")");
  std::sort(found.begin(), found.end());
  out->insert(out->end(), found.begin(), found.end());
  return Status::Ok();
}

// The tokenizer's files as the tokenizer loader reads them (pipeline/tokenizer_load.cpp).
void tokenizer_files(const fs::path& t, std::vector<fs::path>* out) {
  std::error_code ec;
  if (!fs::is_directory(t, ec)) {
    out->push_back(t);
    return;
  }
  if (fs::exists(t / "tokenizer.json", ec)) {
    out->push_back(t / "tokenizer.json");
    return;
  }
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    if (fs::exists(t / f, ec)) out->push_back(t / f);
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot open the manifest");
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) return io_error(path + ": read failed");
  return s.str();
}

std::string short_hash(const std::string& h) { return h.substr(0, 16) + "…"; }

}  // namespace

Result<std::vector<LayoutFile>> layout_files(const Layout& l) {
  KLEIN_RETURN_IF_ERROR(l.complete());
  const fs::path root = l.folder ? l.folder->root() : fs::path();
  std::vector<std::pair<std::string, fs::path>> all;  // (role, path), in pipeline order
  if (l.folder) all.emplace_back("pipeline", root / "model_index.json");
  for (const ComponentSlot* s : {&l.text_encoder, &l.transformer, &l.vae}) {
    const ComponentSpec& spec = *s->spec;
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(spec.path, ec)) KLEIN_RETURN_IF_ERROR(folder_files(spec.path, &files));
    else files.push_back(spec.path);
    for (auto& f : files) all.emplace_back(spec.role, std::move(f));
  }
  if (!l.tokenizer.empty()) {
    std::vector<fs::path> files;
    tokenizer_files(l.tokenizer, &files);
    for (auto& f : files) all.emplace_back("tokenizer", std::move(f));
  }
  if (l.folder && l.folder->has("scheduler")) all.emplace_back("scheduler", l.scheduler_where);

  // One entry per file: an all-in-one checkpoint is one file for three roles.
  std::vector<LayoutFile> out;
  std::map<std::string, size_t> by_path;
  for (auto& [role, p] : all) {
    std::error_code ec;
    fs::path canon = fs::weakly_canonical(p, ec);
    if (ec) canon = p.lexically_normal();
    auto [it, fresh] = by_path.emplace(canon.string(), out.size());
    if (!fresh) {
      out[it->second].entry.role += "+" + role;
      continue;
    }
    LayoutFile f;
    f.entry.role = role;
    f.entry.path = manifest_path_of(p, root);
    f.path = p;
    out.push_back(std::move(f));
  }
  // Two single files of one name in different folders would share a manifest path.
  std::map<std::pair<std::string, std::string>, const LayoutFile*> keys;
  for (const LayoutFile& f : out)
    if (auto [it, fresh] = keys.emplace(std::pair(f.entry.role, f.entry.path), &f); !fresh)
      return invalid_argument("manifest: " + it->second->path.string() + " and " + f.path.string() +
                              " have one file name; a manifest names files outside a model folder by name only");
  return out;
}

Result<Manifest> build_manifest(const Layout& l, const std::string& model, const LoadOptions& options, int threads,
                                const std::function<bool()>& cancel) {
  KLEIN_ASSIGN_OR_RETURN(std::vector<LayoutFile> files, layout_files(l));
  std::vector<fs::path> paths;
  for (const LayoutFile& f : files) paths.push_back(f.path);
  KLEIN_ASSIGN_OR_RETURN(std::vector<FileDigest> digests, sha256_files(paths, threads, cancel));
  Manifest m;
  m.created_by = std::string("klein ") + version();
  m.layout = l.kind;
  m.variant = l.distilled ? "distilled" : "base";
  for (size_t i = 0; i < files.size(); ++i) {
    files[i].entry.size = digests[i].size;
    files[i].entry.sha256 = digests[i].sha256;
    m.files.push_back(files[i].entry);
  }
  // What klein saw in the files, for people: the same description as `klein info`.
  LoadOptions o = options;
  o.verify_manifest.clear();
  KLEIN_ASSIGN_OR_RETURN(ModelInfo info, Model::inspect(model, o));
  for (const ComponentSummary& c : info.components) {
    if (c.name != "transformer" && c.name != "text_encoder" && c.name != "vae") continue;
    nlohmann::json j;
    j["description"] = c.description;
    j["scheme"] = c.scheme;
    j["family"] = c.family;
    j["parameters"] = static_cast<int64_t>(c.parameters);
    nlohmann::json formats = nlohmann::json::object();
    for (const auto& d : c.by_dtype) formats[d.dtype] = {{"parameters", static_cast<int64_t>(d.parameters)}, {"bytes", d.bytes}};
    j["formats"] = std::move(formats);
    m.components[c.name] = std::move(j);
  }
  return m;
}

Status verify_layout(const Layout& l, const std::string& manifest_path, int threads,
                     const std::function<bool()>& cancel) {
  const std::string where = "--verify " + manifest_path;
  KLEIN_ASSIGN_OR_RETURN(std::string text, read_text(manifest_path));
  KLEIN_ASSIGN_OR_RETURN(Manifest m, parse_manifest(text, manifest_path));
  KLEIN_ASSIGN_OR_RETURN(std::vector<LayoutFile> files, layout_files(l));
  std::map<std::pair<std::string, std::string>, const ManifestFile*> listed;
  for (const ManifestFile& f : m.files) listed[{f.role, f.path}] = &f;
  std::vector<const ManifestFile*> expected;
  for (const LayoutFile& f : files) {
    auto it = listed.find({f.entry.role, f.entry.path});
    if (it == listed.end())
      return format_error(where + ": the model reads " + f.path.string() + " (" + f.entry.role + " file \"" +
                          f.entry.path + "\"), which the manifest does not list");
    expected.push_back(it->second);
    listed.erase(it);
  }
  if (!listed.empty()) {
    const ManifestFile& f = *listed.begin()->second;
    return format_error(where + ": the manifest lists " + f.role + " file \"" + f.path +
                        "\", which this model does not read (given: " + l.given + ")");
  }
  // Sizes first: a truncated or replaced file is found without reading gigabytes.
  std::vector<fs::path> paths;
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(files[i].path, ec);
    if (ec) return io_error(files[i].path.string() + ": cannot read its size (" + ec.message() + ")");
    if (size != expected[i]->size)
      return format_error(where + ": " + files[i].path.string() + " is " + std::to_string(size) +
                          " bytes; the manifest says " + std::to_string(expected[i]->size));
    paths.push_back(files[i].path);
  }
  KLEIN_ASSIGN_OR_RETURN(std::vector<FileDigest> digests, sha256_files(paths, threads, cancel));
  for (size_t i = 0; i < files.size(); ++i)
    if (digests[i].sha256 != expected[i]->sha256)
      return format_error(where + ": " + files[i].path.string() + ": SHA-256 " + short_hash(digests[i].sha256) +
                          " differs from the manifest's " + short_hash(expected[i]->sha256) +
                          " (the file changed or is corrupt)");
  return Status::Ok();
}

}  // namespace klein::api

namespace klein {

Result<std::string> make_manifest(const std::string& path, const LoadOptions& options, const Callbacks& cb) {
  return api::guarded("manifest", [&]() -> Result<std::string> {
    KLEIN_ASSIGN_OR_RETURN(api::Layout l, api::resolve_layout(api::layout_request(path, options)));
    KLEIN_ASSIGN_OR_RETURN(Manifest m, api::build_manifest(l, path, options, options.threads, cb.cancel));
    return manifest_json(m);
  });
}

Status write_manifest(const std::string& path, const LoadOptions& options, const std::string& output,
                      const Callbacks& cb) {
  return api::guarded("manifest", [&]() -> Status {
    if (output.empty()) return invalid_argument("manifest: give the output file (-o manifest.json)");
    KLEIN_ASSIGN_OR_RETURN(std::string text, make_manifest(path, options, cb));
    return write_file_atomic(output, [&](std::FILE* f) { return std::fwrite(text.data(), 1, text.size(), f) == text.size(); });
  });
}

Status verify_manifest(const std::string& manifest, const std::string& path, const LoadOptions& options,
                       const Callbacks& cb) {
  return api::guarded("verify", [&]() -> Status {
    KLEIN_ASSIGN_OR_RETURN(api::Layout l, api::resolve_layout(api::layout_request(path, options)));
    return api::verify_layout(l, manifest, options.threads, cb.cancel);
  });
}

}  // namespace klein
