#include "io/manifest.h"

#include <algorithm>
#include <set>
#include <utility>

namespace klein {

namespace {

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// A manifest names files under the model, never outside it: '/'-separated parts, none empty,
// "." or "..", no backslash (a Windows separator would be read as part of a name here).
bool is_relative_path(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.find('\\') != std::string::npos || p.find('\0') != std::string::npos)
    return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string_view part(p.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

Result<std::string> string_field(const nlohmann::json& j, const char* key, const std::string& where, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) return format_error(where + ": missing \"" + key + "\"");
    return std::string();
  }
  if (!it->is_string()) return format_error(where + ": \"" + key + "\" must be a string");
  return it->get<std::string>();
}

void sort_files(std::vector<ManifestFile>& files) {
  std::sort(files.begin(), files.end(), [](const ManifestFile& a, const ManifestFile& b) {
    return std::tie(a.role, a.path) < std::tie(b.role, b.path);
  });
}

}  // namespace

Result<Manifest> parse_manifest(std::string_view text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return format_error(where + ": not valid JSON");
  if (!j.is_object()) return format_error(where + ": expected a JSON object (a klein manifest)");
  auto v = j.find("klein_manifest");
  if (v == j.end())
    return format_error(where + ": not a klein manifest (no \"klein_manifest\" version; write one with `klein manifest`)");
  if (!v->is_number_integer() || v->get<int64_t>() != kManifestVersion)
    return unsupported(where + ": klein_manifest version " + v->dump() + " (this klein reads version " +
                       std::to_string(kManifestVersion) + ")");
  Manifest m;
  KLEIN_ASSIGN_OR_RETURN(m.created_by, string_field(j, "created_by", where, false));
  KLEIN_ASSIGN_OR_RETURN(m.layout, string_field(j, "layout", where, false));
  KLEIN_ASSIGN_OR_RETURN(m.variant, string_field(j, "variant", where, false));
  if (auto c = j.find("components"); c != j.end()) {
    if (!c->is_object()) return format_error(where + ": \"components\" must be an object");
    m.components = *c;
  }
  auto files = j.find("files");
  if (files == j.end() || !files->is_array()) return format_error(where + ": \"files\" must be an array of file entries");
  if (files->empty()) return format_error(where + ": \"files\" is empty (a manifest lists the files a model reads)");
  std::set<std::pair<std::string, std::string>> seen;
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json& e = (*files)[i];
    const std::string at = where + ": files[" + std::to_string(i) + "]";
    if (!e.is_object()) return format_error(at + ": expected an object");
    ManifestFile f;
    KLEIN_ASSIGN_OR_RETURN(f.role, string_field(e, "role", at, true));
    KLEIN_ASSIGN_OR_RETURN(f.path, string_field(e, "path", at, true));
    KLEIN_ASSIGN_OR_RETURN(f.sha256, string_field(e, "sha256", at, true));
    if (f.role.empty()) return format_error(at + ": \"role\" is empty");
    if (!is_relative_path(f.path))
      return format_error(at + ": path \"" + f.path + "\" is not a relative path inside the model");
    if (!is_sha256_hex(f.sha256))
      return format_error(at + " (" + f.path + "): sha256 must be 64 lowercase hex digits");
    auto s = e.find("size");
    if (s == e.end() || !(s->is_number_unsigned() || (s->is_number_integer() && s->get<int64_t>() >= 0)))
      return format_error(at + " (" + f.path + "): \"size\" must be a non-negative integer");
    f.size = s->get<uint64_t>();
    if (!seen.emplace(f.role, f.path).second)
      return format_error(at + ": " + f.role + " file \"" + f.path + "\" is listed twice");
    m.files.push_back(std::move(f));
  }
  sort_files(m.files);
  return m;
}

std::string manifest_json(const Manifest& m) {
  std::vector<ManifestFile> files = m.files;
  sort_files(files);
  nlohmann::ordered_json j;
  j["klein_manifest"] = kManifestVersion;
  j["created_by"] = m.created_by;
  j["layout"] = m.layout;
  j["variant"] = m.variant;
  j["components"] = m.components;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ManifestFile& f : files)
    list.push_back({{"role", f.role}, {"path", f.path}, {"size", f.size}, {"sha256", f.sha256}});
  j["files"] = std::move(list);
  return j.dump(2) + "\n";
}

}  // namespace klein
