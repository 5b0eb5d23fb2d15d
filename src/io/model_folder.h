// A diffusers pipeline folder (black-forest-labs/FLUX.2-klein-4B layout), found through its
// model_index.json: one subfolder per component with config.json and safetensors weights.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace klein {

struct ComponentInfo {
  std::string library;     // "transformers" / "diffusers"
  std::string class_name;  // "Qwen3ForCausalLM", ...
  std::filesystem::path dir;
};

class ModelFolder {
 public:
  static Result<ModelFolder> open(const std::filesystem::path& root);

  const std::filesystem::path& root() const { return root_; }
  const std::string& pipeline_class() const { return pipeline_class_; }
  bool is_distilled() const { return is_distilled_; }
  bool has(const std::string& component) const { return components_.count(component) != 0; }
  // The component's entry; an error naming model_index.json when absent or its folder is missing.
  Result<ComponentInfo> component(const std::string& name) const;
  // Parsed <component>/config.json (or scheduler_config.json for the scheduler).
  Result<nlohmann::json> config(const std::string& name) const;
  const std::map<std::string, ComponentInfo>& components() const { return components_; }

 private:
  std::filesystem::path root_;
  std::string pipeline_class_;
  bool is_distilled_ = false;
  std::map<std::string, ComponentInfo> components_;
};

}  // namespace klein
