#include "core/host_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace klein {

namespace {
bool huge_pages_wanted() {
  static const bool wanted = [] {
    const char* e = std::getenv("KLEIN_HUGEPAGES");
    return !(e && e[0] == '0' && e[1] == '\0');
  }();
  return wanted;
}
}  // namespace

void* host_alloc_bytes(size_t bytes) {
  if (bytes < kHugePageBytes || !huge_pages_wanted())
    return std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  if (bytes > SIZE_MAX - kHugePageBytes) return nullptr;
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where THP is off (or "never"), this fails and the buffer keeps 4 KiB pages.
  if (p) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace klein
