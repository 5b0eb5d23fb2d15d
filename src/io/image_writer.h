// Lossy image output in memory (the server's output_format jpeg|webp); PNG is png_writer.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace klein {

// rgb: height * width * 3 bytes, row-major; quality 1..100.
Result<std::vector<uint8_t>> encode_jpeg(int width, int height, const uint8_t* rgb, int quality);
Result<std::vector<uint8_t>> encode_webp(int width, int height, const uint8_t* rgb, int quality);

}  // namespace klein
