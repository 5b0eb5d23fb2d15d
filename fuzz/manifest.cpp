// The input as an integrity manifest (`--verify FILE`, io/manifest.h): it comes from the user, so
// every field is checked; a manifest that parses is written back and must parse to the same.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "io/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = klein::parse_manifest(text, "manifest.json");
  if (!m.ok()) return 0;
  const std::string again = klein::manifest_json(*m);
  auto back = klein::parse_manifest(again, "manifest.json");
  if (!back.ok() || back->files.size() != m->files.size()) std::abort();  // our own output must read back
  for (size_t i = 0; i < m->files.size(); ++i)
    if (back->files[i].path != m->files[i].path || back->files[i].sha256 != m->files[i].sha256 ||
        back->files[i].size != m->files[i].size || back->files[i].role != m->files[i].role)
      std::abort();
  return 0;
}
