// A JSON request body as `klein serve` parses it (/v1/images/generations and /v1/jobs): every
// field check, the size / integer parsing and the error messages that echo field names.
#include <cstdint>
#include <string>

#include "request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  klein::server::JobSpec spec;
  if (auto e = klein::server::parse_json_request(body, klein::server::Limits{}, 1, &spec)) (void)e->json();
  return 0;
}
