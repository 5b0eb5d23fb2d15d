#include "io/png_writer.h"

#include <csetjmp>
#include <png.h>

#include "io/atomic_file.h"

namespace klein {

namespace {

struct PngErr {
  std::string msg;
};

void on_error(png_structp png, png_const_charp msg) {
  auto* e = static_cast<PngErr*>(png_get_error_ptr(png));
  if (e) e->msg = msg ? msg : "libpng error";
  png_longjmp(png, 1);
}
void on_warning(png_structp, png_const_charp) {}

}  // namespace

std::string repair_utf8(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) len = 1, cp = c;
    else if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
    if (ok && (cp < min || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)) ok = false;
    if (ok) {
      out.append(in, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the one bad byte; decoding resumes at the next
      ++i;
    }
  }
  return out;
}

namespace {

void append_bytes(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
void flush_nothing(png_structp) {}

// The libpng calls, under setjmp: libpng reports errors by longjmp back here. Nothing with a
// destructor lives in this frame (the caller owns the text), so the jump skips no cleanup and no
// local changes between setjmp and a longjmp (-Wclobbered).
bool write_rows(png_structp png, png_infop info, std::FILE* f, std::vector<uint8_t>* mem, int width,
                int height, const uint8_t* rgb, png_text* chunks, int n_chunks) {
  if (setjmp(png_jmpbuf(png))) return false;
  if (f) png_init_io(png, f);
  else png_set_write_fn(png, mem, append_bytes, flush_nothing);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (n_chunks > 0) png_set_text(png, info, chunks, n_chunks);
  png_write_info(png, info);
  for (int y = 0; y < height; ++y)
    png_write_row(png, const_cast<png_bytep>(rgb + static_cast<size_t>(y) * width * 3));
  png_write_end(png, info);
  return true;
}

// Encodes into an open FILE*, or into `mem` when f is null; false on any libpng error (message in err).
bool encode(std::FILE* f, std::vector<uint8_t>* mem, int width, int height, const uint8_t* rgb,
            const std::vector<std::pair<std::string, std::string>>& text, PngErr* err) {
  // iTXt text must be UTF-8 (PNG spec 11.3.4.5): invalid bytes of a prompt become U+FFFD.
  std::vector<std::string> values;
  values.reserve(text.size());
  for (const auto& kv : text) values.push_back(repair_utf8(kv.second));
  std::vector<png_text> chunks(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    chunks[i] = png_text{};
    chunks[i].compression = PNG_ITXT_COMPRESSION_NONE;
    chunks[i].key = const_cast<char*>(text[i].first.c_str());
    chunks[i].text = const_cast<char*>(values[i].c_str());
    chunks[i].itxt_length = values[i].size();
    chunks[i].lang = nullptr;
    chunks[i].lang_key = nullptr;
  }
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, err, on_error, on_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    return false;
  }
  const bool ok = write_rows(png, info, f, mem, width, height, rgb, chunks.data(), static_cast<int>(chunks.size()));
  png_destroy_write_struct(&png, &info);
  return ok;
}

}  // namespace

Status write_png(const std::filesystem::path& path, int width, int height, const uint8_t* rgb,
                 const std::vector<std::pair<std::string, std::string>>& text) {
  if (width <= 0 || height <= 0) return invalid_argument(path.string() + ": empty image");
  PngErr err;
  Status s = write_file_atomic(path, [&](std::FILE* f) { return encode(f, nullptr, width, height, rgb, text, &err); });
  if (!s.ok() && !err.msg.empty()) return io_error(path.string() + ": PNG encoding failed (" + err.msg + ")");
  return s;
}

Result<std::vector<uint8_t>> encode_png(int width, int height, const uint8_t* rgb,
                                        const std::vector<std::pair<std::string, std::string>>& text) {
  if (width <= 0 || height <= 0) return invalid_argument("PNG encoding: empty image");
  PngErr err;
  std::vector<uint8_t> out;
  if (!encode(nullptr, &out, width, height, rgb, text, &err))
    return io_error("PNG encoding failed (" + (err.msg.empty() ? std::string("libpng") : err.msg) + ")");
  return out;
}

}  // namespace klein
