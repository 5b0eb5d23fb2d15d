// Reading reference images (PNG, JPEG, WebP) into 8-bit RGB exactly as diffusers'
// `load_image(path)` does with Pillow 13: `PIL.Image.open` -> `ImageOps.exif_transpose` ->
// `convert("RGB")`. The format is detected from the content (magic bytes), never the extension.
//
// What Pillow does per source, reproduced here (see image_reader.cpp for the details):
//   PNG  grey 1/2/4/8-bit -> replicated, scaled like Pillow's "1"/"L;2"/"L;4" unpackers (x255, x85,
//        x17); grey 16-bit opens as "I;16" and convert("RGB") CLIPS: min(v, 255) (no rescale);
//        RGB/RGBA/grey+alpha 16-bit -> high byte; palette -> PLTE lookup (indices past the palette
//        are black); alpha and tRNS are dropped (never composited); interlacing handled.
//   JPEG 1 component -> grey replicated; 3 -> libjpeg's RGB (ISLOW IDCT, fancy upsampling, the
//        libjpeg defaults Pillow keeps); 4 -> Pillow always reads "CMYK;I" (inverted, Adobe
//        convention) then converts CMYK -> RGB with r = 255 - k' - round(c'*(255-k')/255) style
//        integer arithmetic (Convert.c cmyk2rgb).
//   WebP lossy/lossless, with or without alpha (libwebp RGBA output, alpha dropped).
//   EXIF orientation 2..8 from the JPEG APP1 "Exif", PNG eXIf (or the "Raw profile type exif"
//   text), WebP EXIF chunk; when EXIF has no Orientation tag, XMP `tiff:Orientation` is used like
//   Pillow's getexif() does.
//
// Before any pixel buffer is allocated, the header's width/height are checked (>= 1, and
// width*height <= max_pixels), so a header claiming 100000x100000 fails at once. Truncated or
// corrupt files give a Status naming the file; the codecs' error handlers never exit().
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"
#include "klein/klein.h"

namespace klein {

// Decoded pixels are a klein::Image (include/klein/klein.h): width, height, rgb.

// Diagnostics about the file an Image came from, filled on request beside the pixels.
struct ImageSource {
  // Pillow's mode for the file as opened ("RGB", "RGBA", "L", "LA", "1", "P", "I;16", "CMYK").
  std::string mode;
  int orientation = 1;  // the EXIF orientation that was applied (1 = none)
};

struct ImageReadOptions {
  // Largest accepted width*height, checked against the header before decoding. 64 Mpx (2^26).
  // (Pillow warns above 89.5 Mpx and refuses above 179 Mpx.)
  int64_t max_pixels = int64_t{1} << 26;
  // Largest accepted file, checked before reading it.
  int64_t max_file_bytes = int64_t{1} << 30;
};

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp };
// From the first bytes (PNG signature, JPEG FF D8 FF, RIFF....WEBP).
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

// Reads and decodes `path`. Errors are one line starting with the path.
// `source`, if given, receives the file's diagnostics.
Result<Image> read_image(const std::filesystem::path& path, const ImageReadOptions& opts = {},
                         ImageSource* source = nullptr);
// The same from memory; `name` is used in error messages.
Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& name,
                           const ImageReadOptions& opts = {}, ImageSource* source = nullptr);

}  // namespace klein
