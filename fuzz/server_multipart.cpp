// The parts of a multipart/form-data request (/v1/images/edits) as `klein serve` validates them:
// text fields turned into JSON values, `image` / `image[]` uploads, repeats and the `mask` part.
// httplib splits the body into parts; the input here is those parts, separated by "\n--\n",
// each "name\0filename\0content type\0content" (missing pieces empty). The first byte picks
// whether an image is required (edits) or not.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "request.h"

namespace {
std::string_view take(std::string_view* s) {
  const size_t z = s->find('\0');
  const std::string_view head = s->substr(0, z);
  *s = z == std::string_view::npos ? std::string_view{} : s->substr(z + 1);
  return head;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool need_image = data[0] & 1;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<klein::server::FormPart> parts;
  while (!rest.empty() && parts.size() < 64) {
    const size_t sep = rest.find("\n--\n");
    std::string_view part = rest.substr(0, sep);
    rest = sep == std::string_view::npos ? std::string_view{} : rest.substr(sep + 4);
    klein::server::FormPart p;
    p.name = take(&part);
    p.filename = take(&part);
    p.content_type = take(&part);
    p.content = part;
    parts.push_back(std::move(p));
  }
  klein::server::JobSpec spec;
  if (auto e = klein::server::parse_form_request(parts, klein::server::Limits{}, 7, need_image, &spec)) (void)e->json();
  return 0;
}
