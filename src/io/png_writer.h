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
Status write_png(const std::filesystem::path& path, int width, int height, const uint8_t* rgb,
                 const std::vector<std::pair<std::string, std::string>>& text = {});

}  // namespace klein
