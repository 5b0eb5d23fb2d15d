// SHA-256 of files, streamed through OpenSSL's libcrypto (the SHA extensions where the CPU has
// them): a fixed 4 MiB buffer per file, so hashing a 16 GB checkpoint costs no memory, and
// several files hash on several threads (a model's shards then go at disk speed, not one core's).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace klein {

// Lowercase hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

struct FileDigest {
  uint64_t size = 0;
  std::string sha256;  // lowercase hex
};

// Reads `path` to its end. `cancel` (optional) is polled between blocks: true stops with
// Code::kCancelled. Errors name the file.
Result<FileDigest> sha256_file(const std::filesystem::path& path, const std::function<bool()>& cancel = nullptr);

// Every file of `paths` on up to `threads` threads (0: one per core, never more than files), in
// the order given. The first error (by position) is returned.
Result<std::vector<FileDigest>> sha256_files(const std::vector<std::filesystem::path>& paths, int threads = 0,
                                             const std::function<bool()>& cancel = nullptr);

}  // namespace klein
