// Public in-memory image encoding and decoding (a server answers with image bytes and reads
// uploads without touching the filesystem).
#include "api/guard.h"
#include "io/image_reader.h"
#include "io/image_writer.h"
#include "io/png_writer.h"
#include "klein/klein.h"

namespace klein {

Result<std::vector<uint8_t>> encode_image(const Image& image, ImageFileFormat format,
                                          const std::vector<std::pair<std::string, std::string>>& metadata,
                                          int quality) {
  return api::guarded("encode_image", [&]() -> Result<std::vector<uint8_t>> {
    if (image.width <= 0 || image.height <= 0 ||
        image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
      return invalid_argument("encode_image: image buffer does not match its size");
    switch (format) {
      case ImageFileFormat::kPng: return encode_png(image.width, image.height, image.rgb.data(), metadata);
      case ImageFileFormat::kJpeg: return encode_jpeg(image.width, image.height, image.rgb.data(), quality);
      case ImageFileFormat::kWebp: return encode_webp(image.width, image.height, image.rgb.data(), quality);
    }
    return invalid_argument("encode_image: unknown format");
  });
}

Result<Image> decode_image(const std::vector<uint8_t>& data, const std::string& name) {
  return api::guarded("decode_image", [&]() -> Result<Image> { return decode_image(data.data(), data.size(), name); });
}

}  // namespace klein
