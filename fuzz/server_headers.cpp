// The request headers `klein serve` checks itself, before httplib reads a body: Content-Length
// values (one per input line; the first byte scales the body limit, its low bit says whether a
// Transfer-Encoding came too) and the API key comparison (the first line as the Authorization
// header, the second as the key).
#include <cstdint>
#include <string>
#include <vector>

#include "request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t max_body = size_t{data[0]} << 16;
  const bool transfer_encoding = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::string> lines;
  for (size_t pos = 0; pos <= text.size() && lines.size() < 16;) {
    const size_t nl = text.find('\n', pos);
    lines.push_back(text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  if (auto e = klein::server::check_content_length(lines, transfer_encoding, max_body)) (void)e->json();
  if (lines.size() >= 2) (void)klein::server::bearer_matches(lines[0], lines[1]);
  return 0;
}
