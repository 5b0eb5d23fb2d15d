#include "io/model_folder.h"

#include "io/json_file.h"

namespace fs = std::filesystem;

namespace klein {

Result<ModelFolder> ModelFolder::open(const fs::path& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return not_found(root.string() + ": no such model folder");
  if (!fs::is_directory(root, ec))
    return invalid_argument(root.string() + ": expected a diffusers model folder (with model_index.json), got a file");
  const fs::path index = root / "model_index.json";
  if (!fs::exists(index, ec))
    return not_found(root.string() + ": no model_index.json; expected the diffusers folder of FLUX.2-klein (e.g. black-forest-labs/FLUX.2-klein-4B)");
  KLEIN_ASSIGN_OR_RETURN(auto j, read_json_file(index));
  if (!j.is_object()) return format_error(index.string() + ": not a JSON object");
  ModelFolder m;
  m.root_ = root;
  KLEIN_ASSIGN_OR_RETURN(m.pipeline_class_, json_string(j, "_class_name", index.string(), std::string()));
  KLEIN_ASSIGN_OR_RETURN(m.is_distilled_, json_bool(j, "is_distilled", index.string(), false));
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().starts_with("_") || !it->is_array()) continue;
    if (it->size() != 2 || !(*it)[0].is_string() || !(*it)[1].is_string()) {
      if (it->size() == 2 && (*it)[0].is_null()) continue;  // component set to None
      return format_error(index.string() + ": entry \"" + it.key() + "\" must be [library, class]");
    }
    // A component is a subfolder of the model: its name is used as a path, so it must be one
    // plain path component (no "..", no separators) — a model_index.json cannot point outside.
    const std::string& key = it.key();
    if (key.empty() || key == "." || key == ".." || key.find_first_of("/\\") != std::string::npos ||
        key.find('\0') != std::string::npos)
      return format_error(index.string() + ": component name \"" + key + "\" is not a plain folder name");
    ComponentInfo c{(*it)[0].get<std::string>(), (*it)[1].get<std::string>(), root / key};
    m.components_[it.key()] = std::move(c);
  }
  return m;
}

Result<ComponentInfo> ModelFolder::component(const std::string& name) const {
  auto it = components_.find(name);
  if (it == components_.end())
    return not_found((root_ / "model_index.json").string() + ": no \"" + name + "\" component");
  std::error_code ec;
  if (!fs::is_directory(it->second.dir, ec))
    return not_found(it->second.dir.string() + ": component folder \"" + name + "\" is missing");
  return it->second;
}

Result<nlohmann::json> ModelFolder::config(const std::string& name) const {
  KLEIN_ASSIGN_OR_RETURN(auto c, component(name));
  // diffusers names a scheduler's file scheduler_config.json, a model's config.json; a missing
  // file is reported under the name that component should have.
  const bool sched = name == "scheduler";
  fs::path p = c.dir / (sched ? "scheduler_config.json" : "config.json");
  const fs::path other = c.dir / (sched ? "config.json" : "scheduler_config.json");
  std::error_code ec;
  if (!fs::exists(p, ec) && fs::exists(other, ec)) p = other;
  KLEIN_ASSIGN_OR_RETURN(auto j, read_json_file(p));
  if (!j.is_object()) return format_error(p.string() + ": not a JSON object");
  return j;
}

}  // namespace klein
