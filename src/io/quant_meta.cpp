#include "io/quant_meta.h"

#include <array>
#include <nlohmann/json.hpp>

namespace klein {
namespace {

// ComfyUI's QUANT_ALGOS and the community formats seen in klein files (formats-and-variants.md
// §1.6), so that a file klein cannot compute is named as such rather than as garbage.
constexpr std::array<std::string_view, 9> kKnown = {"float8_e4m3fn", "float8_e5m2",  "int8_tensorwise",
                                                    "int8_blockwise", "float8_e4m3fn_blockwise", "nvfp4",
                                                    "mxfp8",          "mxfp4",        "convrot_w4a4"};

Result<LayerQuant> layer_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return format_error(where + ": quantization config must be a JSON object, got " + j.dump());
  if (!j.contains("format") || !j["format"].is_string())
    return format_error(where + ": quantization config has no \"format\" string");
  LayerQuant q;
  q.format = j["format"].get<std::string>();
  if (j.contains("convrot")) {
    if (!j["convrot"].is_boolean()) return format_error(where + ": \"convrot\" must be true or false");
    q.convrot = j["convrot"].get<bool>();
  }
  if (j.contains("convrot_groupsize")) {
    const auto& g = j["convrot_groupsize"];
    if (!g.is_number_integer() || g.get<int64_t>() <= 0)
      return format_error(where + ": \"convrot_groupsize\" must be a positive integer, got " + g.dump());
    q.convrot_group = g.get<int64_t>();
  }
  if (!comfy_format_computed(q.format)) {
    bool known = false;
    for (std::string_view k : kKnown) known |= k == q.format;
    // dump() escapes the name: a format string is file data and may hold control bytes.
    const std::string name = nlohmann::json(q.format).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return unsupported(where + ": quantization format " + name +
                       (known ? " is not computed by klein" : " is unknown") +
                       " (klein reads float8_e4m3fn and int8_tensorwise)");
  }
  return q;
}

Result<nlohmann::json> parse(std::string_view text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return format_error(where + ": quantization config is not valid JSON");
  return j;
}

}  // namespace

bool comfy_format_computed(std::string_view format) {
  return format == "float8_e4m3fn" || format == "int8_tensorwise";
}

Result<LayerQuant> parse_comfy_quant(std::string_view json, const std::string& where) {
  KLEIN_ASSIGN_OR_RETURN(nlohmann::json j, parse(json, where));
  return layer_from_json(j, where);
}

Result<std::map<std::string, LayerQuant>> parse_quantization_metadata(std::string_view json, const std::string& where) {
  KLEIN_ASSIGN_OR_RETURN(nlohmann::json j, parse(json, where));
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_object())
    return format_error(where + ": _quantization_metadata has no \"layers\" object");
  std::map<std::string, LayerQuant> out;
  for (auto it = j["layers"].begin(); it != j["layers"].end(); ++it) {
    KLEIN_ASSIGN_OR_RETURN(LayerQuant q, layer_from_json(*it, where + " (layer '" + it.key() + "')"));
    out.emplace(it.key(), std::move(q));
  }
  return out;
}

}  // namespace klein
