#include "io/file_counter.h"

#include <map>
#include <mutex>

namespace klein {

namespace {
// Opens are rare (a few per component load), so one mutex and a map by path are cheap enough.
std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, uint64_t>& counts() {
  static std::map<std::string, uint64_t> c;
  return c;
}
}  // namespace

void note_file_opened(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu());
  ++counts()[path];
}

uint64_t files_opened() { return files_opened(""); }

uint64_t files_opened(const std::string& part) {
  std::lock_guard<std::mutex> lock(mu());
  uint64_t n = 0;
  for (const auto& [p, c] : counts())
    if (part.empty() || p.find(part) != std::string::npos) n += c;
  return n;
}

}  // namespace klein
