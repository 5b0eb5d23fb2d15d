// Writes a file so that readers see either nothing or the whole file: the content goes to a
// temporary file in the same folder, which is renamed over the target only on success.
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>

#include "core/status.h"

namespace klein {

// `write` returns false on failure; then the temporary file is removed and the target untouched.
Status write_file_atomic(const std::filesystem::path& path,
                         const std::function<bool(std::FILE*)>& write);

}  // namespace klein
