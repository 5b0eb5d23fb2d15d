// PNG output (libpng), written atomically, with tEXt chunks carrying the generation parameters.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace klein {

// rgb: height * width * 3 bytes, row-major. `text`: (keyword, value) pairs (keywords 1-79 Latin-1
// chars; values are written as iTXt so UTF-8 prompts survive).
// `in` with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD (what
// write_png does to text values: iTXt must be UTF-8).
std::string repair_utf8(const std::string& in);

Status write_png(const std::filesystem::path& path, int width, int height, const uint8_t* rgb,
                 const std::vector<std::pair<std::string, std::string>>& text = {});
// The same PNG in memory.
Result<std::vector<uint8_t>> encode_png(int width, int height, const uint8_t* rgb,
                                        const std::vector<std::pair<std::string, std::string>>& text = {});

}  // namespace klein
