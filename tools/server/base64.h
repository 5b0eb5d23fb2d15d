// Standard base64 (RFC 4648, with padding) for b64_json results and previews.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace klein::server {

std::string base64_encode(const uint8_t* data, size_t size);
inline std::string base64_encode(const std::vector<uint8_t>& v) { return base64_encode(v.data(), v.size()); }

}  // namespace klein::server
