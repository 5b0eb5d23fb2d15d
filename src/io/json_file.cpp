#include "io/json_file.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/checked.h"
#include "io/file_counter.h"

namespace klein {

Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  note_file_opened(path.string());
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path.string() + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    return format_error(path.string() + ": invalid JSON (" + e.what() + ")");
  }
}

Result<int64_t> json_int(const nlohmann::json& j, const std::string& key, const std::string& where,
                         std::optional<int64_t> def) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    return format_error(where + ": missing \"" + key + "\"");
  }
  if (!j[key].is_number_integer()) return format_error(where + ": \"" + key + "\" is not an integer");
  // Config integers are dimensions and counts: bounding them keeps every product of two in int64
  // (a uint64 above INT64_MAX would also wrap negative in get<int64_t>()).
  if (j[key].is_number_unsigned() ? j[key].get<uint64_t>() > static_cast<uint64_t>(kMaxConfigDim)
                                  : std::llabs(j[key].get<int64_t>()) > kMaxConfigDim)
    return format_error(where + ": \"" + key + "\" " + j[key].dump() + " is out of range (at most " +
                        std::to_string(kMaxConfigDim) + ")");
  return j[key].get<int64_t>();
}

Result<double> json_number(const nlohmann::json& j, const std::string& key,
                           const std::string& where, std::optional<double> def) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    return format_error(where + ": missing \"" + key + "\"");
  }
  if (!j[key].is_number()) return format_error(where + ": \"" + key + "\" is not a number");
  return j[key].get<double>();
}

Result<bool> json_bool(const nlohmann::json& j, const std::string& key, const std::string& where,
                       std::optional<bool> def) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    return format_error(where + ": missing \"" + key + "\"");
  }
  if (!j[key].is_boolean()) return format_error(where + ": \"" + key + "\" is not a boolean");
  return j[key].get<bool>();
}

Result<std::string> json_string(const nlohmann::json& j, const std::string& key,
                                const std::string& where, std::optional<std::string> def) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    return format_error(where + ": missing \"" + key + "\"");
  }
  if (!j[key].is_string()) return format_error(where + ": \"" + key + "\" is not a string");
  return j[key].get<std::string>();
}

}  // namespace klein
