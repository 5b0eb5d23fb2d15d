// OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, with the HTTP status that
// goes with it. Messages are one line, like the engine's.
#pragma once

#include <string>

#include "klein/status.h"

namespace klein::server {

struct ApiError {
  int http = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" → null
  std::string code;   // "" → null

  std::string json() const;
};

ApiError invalid(std::string param, std::string message, std::string code = "invalid_value");
// The HTTP status and type for an engine Status (a bad reference image is the caller's 400; an
// engine failure is 500; out of memory 507).
ApiError from_status(const Status& s, const std::string& param = "");

}  // namespace klein::server
