// Shared pieces of the `klein` command-line tool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "klein/status.h"

namespace klein::cli {

// Prints "klein: <message>" on stderr and returns the exit code for `s` (never 0).
int fail(const Status& s);

// Writes a float32 C-order .npy (through a temporary file + rename, so never a partial file).
Status write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);
// "[1, 512, 7680]"
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace klein::cli
