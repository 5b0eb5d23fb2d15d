#include "api_error.h"

#include <nlohmann/json.hpp>

namespace klein::server {

std::string ApiError::json() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  // Invalid UTF-8 (an echoed field name) is replaced rather than thrown about.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError invalid(std::string param, std::string message, std::string code) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError from_status(const Status& s, const std::string& param) {
  switch (s.code()) {
    case Code::kInvalidArgument:
    case Code::kFormatError:
    case Code::kUnsupported:
    case Code::kNotFound: return {400, s.message(), "invalid_request_error", param, "invalid_image"};
    case Code::kCancelled: return {499, "the request was cancelled", "cancelled", "", "cancelled"};
    case Code::kOutOfMemory: return {507, s.message(), "server_error", "", "out_of_memory"};
    default: return {500, s.to_string(), "server_error", "", "engine_error"};
  }
}

}  // namespace klein::server
