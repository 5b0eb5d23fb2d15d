// Reading JSON config files with errors that name the file.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace klein {

Result<nlohmann::json> read_json_file(const std::filesystem::path& path);

// Typed field access with messages naming the file and key. A missing optional key yields `def`.
Result<int64_t> json_int(const nlohmann::json& j, const std::string& key, const std::string& where,
                         std::optional<int64_t> def = std::nullopt);
Result<double> json_number(const nlohmann::json& j, const std::string& key, const std::string& where,
                           std::optional<double> def = std::nullopt);
Result<bool> json_bool(const nlohmann::json& j, const std::string& key, const std::string& where,
                       std::optional<bool> def = std::nullopt);
Result<std::string> json_string(const nlohmann::json& j, const std::string& key,
                                const std::string& where,
                                std::optional<std::string> def = std::nullopt);

}  // namespace klein
