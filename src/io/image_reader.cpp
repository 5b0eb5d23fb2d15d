#include "io/image_reader.h"

#include <png.h>
#include <webp/decode.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

namespace klein {

namespace {

// ------------------------------------------------------------------------------------------
// Decoded pixels (already RGB) plus the metadata Pillow's getexif() looks at.
// ------------------------------------------------------------------------------------------

struct Meta {
  bool has_exif = false;
  std::vector<uint8_t> exif;  // Pillow's info["exif"]
  bool has_xmp = false;
  std::string xmp;            // Pillow's info["XML:com.adobe.xmp"] (PNG) or info["xmp"]
};

struct Decoded {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
  std::string mode;
  Meta meta;
};

std::string dims_str(uint64_t w, uint64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

// The header check done before any pixel buffer exists.
Status check_dims(const std::string& name, const char* fmt, uint64_t w, uint64_t h,
                  const ImageReadOptions& opts) {
  if (w == 0 || h == 0)
    return format_error(name + ": " + fmt + " header gives an empty image (" + dims_str(w, h) + ")");
  const uint64_t px = w * h;  // w, h < 2^32 each: no overflow
  if (opts.max_pixels > 0 && px > static_cast<uint64_t>(opts.max_pixels))
    return invalid_argument(name + ": " + fmt + " header says " + dims_str(w, h) + " = " +
                            std::to_string(px) + " pixels, more than the limit of " +
                            std::to_string(opts.max_pixels) + " pixels");
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------
// EXIF / XMP orientation, as Pillow's Image.getexif() + ImageOps.exif_transpose() see it.
// ------------------------------------------------------------------------------------------

struct ExifOrientation {
  bool present = false;  // tag 0x0112 is in IFD0 (then XMP is not consulted)
  int value = 0;         // its value when it is a single integral number, else 0
};

uint32_t rd(const uint8_t* p, int n, bool le) {
  uint32_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint32_t>(p[le ? i : n - 1 - i]) << (8 * i);
  return v;
}

int tiff_type_size(uint32_t typ) {
  switch (typ) {
    case 1: case 2: case 6: case 7: return 1;      // BYTE ASCII SBYTE UNDEFINED
    case 3: case 8: return 2;                      // SHORT SSHORT
    case 4: case 9: case 11: case 13: return 4;    // LONG SLONG FLOAT IFD
    case 5: case 10: case 12: case 16: return 8;   // RATIONAL SRATIONAL DOUBLE LONG8
    default: return 0;                             // Pillow skips unknown types
  }
}

// Value of a count-1 entry when Pillow would hand exif_transpose something equal to an int.
int tiff_int_value(uint32_t typ, const uint8_t* d, bool le) {
  auto integral = [](double v) -> int {
    if (!(v >= -1e9 && v <= 1e9) || v != std::floor(v)) return 0;
    return static_cast<int>(v);
  };
  switch (typ) {
    case 3: return static_cast<int>(rd(d, 2, le));
    case 4: case 13: return static_cast<int>(std::min<uint32_t>(rd(d, 4, le), 1u << 30));
    case 6: return static_cast<int8_t>(d[0]);
    case 8: return static_cast<int16_t>(rd(d, 2, le));
    case 9: return static_cast<int>(static_cast<int32_t>(rd(d, 4, le)));
    case 16: {
      const uint64_t lo = rd(d + (le ? 0 : 4), 4, le), hi = rd(d + (le ? 4 : 0), 4, le);
      return hi ? 0 : static_cast<int>(std::min<uint64_t>(lo, 1u << 30));
    }
    case 5: case 10: {  // IFDRational: equal to an int when num/den is integral
      const uint32_t n = rd(d, 4, le), dd = rd(d + 4, 4, le);
      if (dd == 0) return 0;
      if (typ == 5) return n % dd == 0 ? static_cast<int>(std::min<uint32_t>(n / dd, 1u << 30)) : 0;
      const int64_t sn = static_cast<int32_t>(n), sd = static_cast<int32_t>(dd);
      return sn % sd == 0 ? static_cast<int>(sn / sd) : 0;
    }
    case 11: { float f; uint32_t u = rd(d, 4, le); std::memcpy(&f, &u, 4); return integral(f); }
    case 12: {
      const uint64_t lo = rd(d + (le ? 0 : 4), 4, le), hi = rd(d + (le ? 4 : 0), 4, le);
      const uint64_t u = (hi << 32) | lo;
      double v; std::memcpy(&v, &u, 8); return integral(v);
    }
    default: return 0;  // BYTE / UNDEFINED load as bytes, ASCII as str: never equal to an int
  }
}

// Pillow's Exif.load(): strip ^(Exif\0\0){1,2}, read the TIFF header and IFD0. A malformed
// header makes Pillow raise; we treat it as "no EXIF" (lenient). A truncated IFD stops parsing
// like Pillow's (which warns and keeps the tags read so far).
ExifOrientation exif_orientation(const std::vector<uint8_t>& exif) {
  ExifOrientation res;
  const uint8_t* p = exif.data();
  size_t n = exif.size();
  for (int i = 0; i < 2 && n >= 6 && std::memcmp(p, "Exif\0\0", 6) == 0; ++i) {
    p += 6;
    n -= 6;
  }
  if (n < 8) return res;
  bool le;
  if (p[0] == 'I' && p[1] == 'I') le = true;
  else if (p[0] == 'M' && p[1] == 'M') le = false;
  else return res;
  if (!((p[2] == 0 && p[3] == 0x2a) || (p[2] == 0x2a && p[3] == 0))) return res;  // not TIFF/BigTIFF
  const uint32_t ifd = rd(p + 4, 4, le);
  if (ifd > n || n - ifd < 2) return res;
  const uint32_t count = rd(p + ifd, 2, le);
  size_t pos = ifd + 2;
  for (uint32_t i = 0; i < count; ++i, pos += 12) {
    if (pos + 12 > n) break;
    const uint8_t* e = p + pos;
    const uint32_t tag = rd(e, 2, le), typ = rd(e + 2, 2, le), cnt = rd(e + 4, 4, le);
    const int unit = tiff_type_size(typ);
    if (unit == 0) continue;
    const uint64_t size = static_cast<uint64_t>(cnt) * unit;
    const uint8_t* d = e + 8;
    if (size > 4) {
      const uint32_t off = rd(e + 8, 4, le);
      if (off > n || size > n - off) break;  // Pillow: OSError "Truncated File Read" -> stop
      d = p + off;
    }
    if (size == 0) continue;  // Pillow drops empty values
    if (tag == 0x0112) {
      res.present = true;
      res.value = cnt == 1 ? tiff_int_value(typ, d, le) : 0;  // last duplicate wins, as in Pillow
    }
  }
  return res;
}

// re.search(r'tiff:Orientation(="|>)([0-9])', xmp)
int xmp_orientation(std::string_view s) {
  constexpr std::string_view key = "tiff:Orientation";
  for (size_t pos = s.find(key); pos != std::string_view::npos; pos = s.find(key, pos + 1)) {
    size_t q = pos + key.size();
    if (q < s.size() && s[q] == '=' && q + 1 < s.size() && s[q + 1] == '"') q += 2;
    else if (q < s.size() && s[q] == '>') q += 1;
    else continue;
    if (q < s.size() && s[q] >= '0' && s[q] <= '9') return s[q] - '0';
  }
  return 0;
}

int orientation_of(const Meta& m) {
  if (m.has_exif) {
    const ExifOrientation e = exif_orientation(m.exif);
    if (e.present) return e.value;
  }
  if (m.has_xmp) return xmp_orientation(m.xmp);
  return 1;
}

// Image.transpose for exif_transpose's methods: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180,
// 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90.
void apply_orientation(Decoded& d, int o) {
  if (o < 2 || o > 8) return;
  const int W = d.width, H = d.height;
  const bool swap = o >= 5;
  const int ow = swap ? H : W, oh = swap ? W : H;
  std::vector<uint8_t> out(d.rgb.size());
  for (int y = 0; y < oh; ++y) {
    for (int x = 0; x < ow; ++x) {
      int sx = x, sy = y;
      switch (o) {
        case 2: sx = W - 1 - x; sy = y; break;
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;
        case 4: sx = x; sy = H - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = H - 1 - x; break;
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;
        case 8: sx = W - 1 - y; sy = x; break;
      }
      const uint8_t* s = d.rgb.data() + (static_cast<size_t>(sy) * W + sx) * 3;
      uint8_t* t = out.data() + (static_cast<size_t>(y) * ow + x) * 3;
      t[0] = s[0];
      t[1] = s[1];
      t[2] = s[2];
    }
  }
  d.rgb.swap(out);
  d.width = ow;
  d.height = oh;
}

// ------------------------------------------------------------------------------------------
// PNG (libpng). Samples are read raw (only sub-byte depths unpacked, interlacing resolved) and
// mapped to RGB the way Pillow's PNG plugin modes + convert("RGB") do.
// ------------------------------------------------------------------------------------------

struct PngJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  std::string err;
  bool truncated = false;
  bool not_enough_data = false;
  const ImageReadOptions* opts = nullptr;
  // header
  png_uint_32 w = 0, h = 0;
  int depth = 0, ctype = 0, interlace = 0;
  bool dims_rejected = false;
  // pixels
  size_t rowbytes = 0;
  std::vector<uint8_t> raw;
  std::vector<png_bytep> rows;
  uint8_t palette[256][3] = {};
  bool pixels_done = false;
};

void png_read_cb(png_structp png, png_bytep out, size_t n) {
  auto* j = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > j->size - j->pos) {
    j->truncated = true;
    png_error(png, "unexpected end of file");
  }
  std::memcpy(out, j->data + j->pos, n);
  j->pos += n;
}

void png_error_cb(png_structp png, png_const_charp msg) {
  auto* j = static_cast<PngJob*>(png_get_error_ptr(png));
  if (j && j->err.empty()) j->err = msg ? msg : "libpng error";
  png_longjmp(png, 1);
}

void png_warning_cb(png_structp png, png_const_charp msg) {
  auto* j = static_cast<PngJob*>(png_get_error_ptr(png));
  // The one benign libpng condition Pillow treats as fatal: the zlib stream ends before the
  // image does (Pillow: "image file is truncated").
  if (j && msg && std::strstr(msg, "Not enough image data")) j->not_enough_data = true;
}

// Everything between setjmp and the last libpng call. Returns false on a libpng error.
// No C++ object with a destructor lives in this frame across a longjmp.
bool png_run_pixels(png_structp png, png_infop info, PngJob* j) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, j, png_read_cb);
  png_set_user_limits(png, 0x7fffffffu, 0x7fffffffu);  // our own limit is checked below
  png_set_check_for_invalid_index(png, 0);              // Pillow maps bad indices to black
  png_read_info(png, info);
  png_get_IHDR(png, info, &j->w, &j->h, &j->depth, &j->ctype, &j->interlace, nullptr, nullptr);
  const uint64_t px = static_cast<uint64_t>(j->w) * j->h;
  if (j->w == 0 || j->h == 0 || (j->opts->max_pixels > 0 && px > static_cast<uint64_t>(j->opts->max_pixels))) {
    j->dims_rejected = true;
    return false;
  }
  if (j->depth < 8) png_set_packing(png);
  if (j->interlace != PNG_INTERLACE_NONE) png_set_interlace_handling(png);
  png_read_update_info(png, info);
  j->rowbytes = png_get_rowbytes(png, info);
  if (j->ctype == PNG_COLOR_TYPE_PALETTE) {
    png_colorp pal = nullptr;
    int n = 0;
    if (png_get_PLTE(png, info, &pal, &n) && pal) {
      for (int i = 0; i < n && i < 256; ++i) {
        j->palette[i][0] = pal[i].red;
        j->palette[i][1] = pal[i].green;
        j->palette[i][2] = pal[i].blue;
      }
    }
  }
  j->raw.resize(j->rowbytes * j->h);
  j->rows.resize(j->h);
  for (png_uint_32 y = 0; y < j->h; ++y) j->rows[y] = j->raw.data() + y * j->rowbytes;
  png_read_image(png, j->rows.data());
  j->pixels_done = true;
  return true;
}

// Reads the chunks after IDAT (eXIf / text may live there). Failure here is not fatal: Pillow
// also stops quietly at a broken or missing tail once the pixels are complete.
bool png_run_end(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_end(png, info);
  return true;
}

Result<Decoded> decode_png(const uint8_t* data, size_t size, const std::string& name,
                           const ImageReadOptions& opts) {
  PngJob job;
  job.data = data;
  job.size = size;
  job.opts = &opts;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_error_cb, png_warning_cb);
  if (!png) return internal_error(name + ": cannot create a libpng reader");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return internal_error(name + ": cannot create a libpng info struct");
  }
  const bool ok = png_run_pixels(png, info, &job);
  Decoded d;
  Status st;
  if (job.dims_rejected) {
    st = check_dims(name, "PNG", job.w, job.h, opts);
  } else if (!ok || !job.pixels_done) {
    if (job.truncated)
      st = format_error(name + ": truncated PNG file (data ends before the image is complete)");
    else
      st = format_error(name + ": corrupt PNG file (libpng: " + job.err + ")");
  } else if (job.not_enough_data) {
    st = format_error(name + ": truncated PNG image data (libpng: Not enough image data)");
  }
  if (st.ok()) {
    png_run_end(png, info);
    // metadata
    png_bytep exif = nullptr;
    png_uint_32 exif_len = 0;
    if (png_get_eXIf_1(png, info, &exif_len, &exif) && exif && exif_len) {
      d.meta.has_exif = true;
      d.meta.exif.assign(exif, exif + exif_len);
    }
    png_textp text = nullptr;
    int ntext = 0;
    png_get_text(png, info, &text, &ntext);
    std::optional<std::vector<uint8_t>> text_exif, raw_profile;
    for (int i = 0; i < ntext; ++i) {
      const std::string_view key = text[i].key ? text[i].key : "";
      const size_t len = text[i].compression == PNG_ITXT_COMPRESSION_NONE ||
                                 text[i].compression == PNG_ITXT_COMPRESSION_zTXt
                             ? text[i].itxt_length
                             : text[i].text_length;
      const std::string_view val(text[i].text ? text[i].text : "", text[i].text ? len : 0);
      if (key == "XML:com.adobe.xmp") {
        d.meta.has_xmp = true;
        d.meta.xmp.assign(val);
      } else if (key == "exif" && text[i].compression == PNG_TEXT_COMPRESSION_NONE) {
        text_exif.emplace(val.begin(), val.end());  // Pillow keeps tEXt "exif" as raw bytes
      } else if (key == "Raw profile type exif") {
        // "\nexif\n   <len>\n<hex...>": hex digits after the third newline, whitespace ignored
        std::vector<uint8_t> bytes;
        size_t nl = 0, k = 0;
        for (; k < val.size() && nl < 3; ++k)
          if (val[k] == '\n') ++nl;
        bool bad = false;
        int hi = -1;
        for (; k < val.size(); ++k) {
          const char c = val[k];
          if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f') continue;
          int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
          if (v < 0) { bad = true; break; }
          if (hi < 0) hi = v;
          else { bytes.push_back(static_cast<uint8_t>(hi * 16 + v)); hi = -1; }
        }
        if (!bad && hi < 0) raw_profile = std::move(bytes);
      }
    }
    if (!d.meta.has_exif && text_exif) {
      d.meta.has_exif = true;
      d.meta.exif = std::move(*text_exif);
    }
    if (!d.meta.has_exif && raw_profile) {
      d.meta.has_exif = true;
      d.meta.exif = std::move(*raw_profile);
    }
  }
  png_destroy_read_struct(&png, &info, nullptr);
  if (!st.ok()) return st;

  // Samples -> RGB, per Pillow mode.
  const int W = static_cast<int>(job.w), H = static_cast<int>(job.h);
  d.width = W;
  d.height = H;
  d.rgb.resize(static_cast<size_t>(W) * H * 3);
  const int depth = job.depth;
  for (int y = 0; y < H; ++y) {
    const uint8_t* s = job.raw.data() + static_cast<size_t>(y) * job.rowbytes;
    uint8_t* t = d.rgb.data() + static_cast<size_t>(y) * W * 3;
    for (int x = 0; x < W; ++x, t += 3) {
      switch (job.ctype) {
        case PNG_COLOR_TYPE_GRAY: {
          uint8_t v;
          if (depth == 16) v = s[2 * x] ? 255 : s[2 * x + 1];  // I;16 -> RGB clips at 255
          else if (depth == 8) v = s[x];
          else if (depth == 4) v = static_cast<uint8_t>(s[x] * 17);
          else if (depth == 2) v = static_cast<uint8_t>(s[x] * 85);
          else v = s[x] ? 255 : 0;
          t[0] = t[1] = t[2] = v;
          break;
        }
        case PNG_COLOR_TYPE_GRAY_ALPHA: {
          const uint8_t v = depth == 16 ? s[4 * x] : s[2 * x];
          t[0] = t[1] = t[2] = v;
          break;
        }
        case PNG_COLOR_TYPE_RGB:
          for (int c = 0; c < 3; ++c) t[c] = depth == 16 ? s[6 * x + 2 * c] : s[3 * x + c];
          break;
        case PNG_COLOR_TYPE_RGB_ALPHA:
          for (int c = 0; c < 3; ++c) t[c] = depth == 16 ? s[8 * x + 2 * c] : s[4 * x + c];
          break;
        case PNG_COLOR_TYPE_PALETTE: {
          const uint8_t* p = job.palette[s[x]];
          t[0] = p[0];
          t[1] = p[1];
          t[2] = p[2];
          break;
        }
        default:
          return unsupported(name + ": PNG colour type " + std::to_string(job.ctype) + " not handled");
      }
    }
  }
  switch (job.ctype) {
    case PNG_COLOR_TYPE_GRAY: d.mode = depth == 16 ? "I;16" : depth == 1 ? "1" : "L"; break;
    case PNG_COLOR_TYPE_GRAY_ALPHA: d.mode = depth == 16 ? "RGBA" : "LA"; break;
    case PNG_COLOR_TYPE_RGB: d.mode = "RGB"; break;
    case PNG_COLOR_TYPE_RGB_ALPHA: d.mode = "RGBA"; break;
    default: d.mode = "P"; break;
  }
  return d;
}

// ------------------------------------------------------------------------------------------
// JPEG (libjpeg-turbo), with Pillow's decoder settings: libjpeg defaults (ISLOW IDCT, fancy
// upsampling, block smoothing), out_color_space GRAYSCALE / RGB / CMYK by component count.
// ------------------------------------------------------------------------------------------

struct JpegErr {
  jpeg_error_mgr pub;
  std::jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
};

const JOCTET kFakeEoi[2] = {0xFF, JPEG_EOI};

struct JpegSrc {
  jpeg_source_mgr pub;
  bool eof = false;  // the decoder wanted bytes past the end of the file
};

struct JpegJob {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  JpegSrc src;
  const ImageReadOptions* opts = nullptr;
  bool created = false;
  bool header_done = false;
  bool dims_rejected = false;
  bool bad_components = false;
  bool truncated = false;
  uint32_t w = 0, h = 0;
  int comps = 0;
  std::vector<uint8_t> raw;
  Meta meta;
};

void jpeg_error_exit_cb(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->msg);
  std::longjmp(e->jb, 1);
}
void jpeg_output_message_cb(j_common_ptr) {}  // warnings are ignored, as in Pillow

void jsrc_init(j_decompress_ptr) {}
boolean jsrc_fill(j_decompress_ptr c) {
  auto* s = reinterpret_cast<JpegSrc*>(c->src);
  s->eof = true;
  s->pub.next_input_byte = kFakeEoi;
  s->pub.bytes_in_buffer = 2;
  return TRUE;
}
void jsrc_skip(j_decompress_ptr c, long n) {
  auto* s = reinterpret_cast<JpegSrc*>(c->src);
  if (n <= 0) return;
  if (static_cast<size_t>(n) > s->pub.bytes_in_buffer) {
    jsrc_fill(c);
    return;
  }
  s->pub.next_input_byte += n;
  s->pub.bytes_in_buffer -= static_cast<size_t>(n);
}
void jsrc_term(j_decompress_ptr) {}

bool jpeg_run(JpegJob* j, const uint8_t* data, size_t size) {
  jpeg_decompress_struct* ci = &j->cinfo;
  ci->err = jpeg_std_error(&j->err.pub);
  j->err.pub.error_exit = jpeg_error_exit_cb;
  j->err.pub.output_message = jpeg_output_message_cb;
  j->err.msg[0] = 0;
  if (setjmp(j->err.jb)) return false;
  jpeg_create_decompress(ci);
  j->created = true;
  j->src.pub.init_source = jsrc_init;
  j->src.pub.fill_input_buffer = jsrc_fill;
  j->src.pub.skip_input_data = jsrc_skip;
  j->src.pub.resync_to_restart = jpeg_resync_to_restart;
  j->src.pub.term_source = jsrc_term;
  j->src.pub.next_input_byte = data;
  j->src.pub.bytes_in_buffer = size;
  ci->src = &j->src.pub;
  jpeg_save_markers(ci, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(ci, TRUE);
  if (j->src.eof) {
    j->truncated = true;
    return false;
  }
  j->header_done = true;
  j->w = ci->image_width;
  j->h = ci->image_height;
  j->comps = ci->num_components;
  // Pillow: every APP1 "Exif\0\0" before SOS is concatenated (later ones without their 6-byte
  // prefix); the last APP1 XMP packet wins.
  for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next) {
    if (m->marker != JPEG_APP0 + 1) continue;
    const uint8_t* p = m->data;
    const size_t n = m->data_length;
    static const char kXmp[] = "http://ns.adobe.com/xap/1.0/";  // + NUL
    if (n >= 6 && std::memcmp(p, "Exif\0\0", 6) == 0) {
      if (!j->meta.has_exif) j->meta.exif.assign(p, p + n);
      else j->meta.exif.insert(j->meta.exif.end(), p + 6, p + n);
      j->meta.has_exif = true;
    } else if (n >= sizeof(kXmp) && std::memcmp(p, kXmp, sizeof(kXmp)) == 0) {
      j->meta.has_xmp = true;
      j->meta.xmp.assign(reinterpret_cast<const char*>(p) + sizeof(kXmp), n - sizeof(kXmp));
    }
  }
  const uint64_t px = static_cast<uint64_t>(j->w) * j->h;
  if (j->w == 0 || j->h == 0 || (j->opts->max_pixels > 0 && px > static_cast<uint64_t>(j->opts->max_pixels))) {
    j->dims_rejected = true;
    return false;
  }
  if (j->comps != 1 && j->comps != 3 && j->comps != 4) {
    j->bad_components = true;
    return false;
  }
  ci->out_color_space = j->comps == 1 ? JCS_GRAYSCALE : j->comps == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_start_decompress(ci);
  const size_t stride = static_cast<size_t>(ci->output_width) * ci->output_components;
  j->raw.resize(stride * ci->output_height);
  while (ci->output_scanline < ci->output_height) {
    JSAMPROW row = j->raw.data() + stride * ci->output_scanline;
    if (jpeg_read_scanlines(ci, &row, 1) != 1) break;
  }
  // Pillow's suspending source reports "image file is truncated" when libjpeg asks for more
  // data before the last scanline is out; past that point (missing EOI) it does not care.
  if (j->src.eof || ci->output_scanline < ci->output_height) {
    j->truncated = true;
    return false;
  }
  jpeg_finish_decompress(ci);
  return true;
}

Result<Decoded> decode_jpeg(const uint8_t* data, size_t size, const std::string& name,
                            const ImageReadOptions& opts) {
  auto job = std::make_unique<JpegJob>();
  job->opts = &opts;
  const bool ok = jpeg_run(job.get(), data, size);
  if (job->created) jpeg_destroy_decompress(&job->cinfo);
  if (job->dims_rejected) return check_dims(name, "JPEG", job->w, job->h, opts);
  if (job->bad_components)
    return unsupported(name + ": JPEG with " + std::to_string(job->comps) +
                       " components (only 1, 3 or 4 are handled)");
  if (job->truncated || (!ok && job->src.eof))
    return format_error(name + ": truncated JPEG file (data ends before the image is complete)");
  if (!ok) return format_error(name + ": corrupt JPEG file (libjpeg: " + std::string(job->err.msg) + ")");

  Decoded d;
  d.width = static_cast<int>(job->w);
  d.height = static_cast<int>(job->h);
  d.meta = std::move(job->meta);
  const size_t npx = static_cast<size_t>(d.width) * d.height;
  d.rgb.resize(npx * 3);
  const uint8_t* s = job->raw.data();
  uint8_t* t = d.rgb.data();
  if (job->comps == 1) {
    d.mode = "L";
    for (size_t i = 0; i < npx; ++i) t[3 * i] = t[3 * i + 1] = t[3 * i + 2] = s[i];
  } else if (job->comps == 3) {
    d.mode = "RGB";
    std::memcpy(t, s, npx * 3);
  } else {
    // Pillow reads 4-component JPEGs as "CMYK;I" (inverted) and converts with Convert.c cmyk2rgb:
    // nk = 255 - k; out = clip8(nk - MULDIV255(c, nk)), MULDIV255(a,b) = (t=a*b+128, ((t>>8)+t)>>8).
    d.mode = "CMYK";
    for (size_t i = 0; i < npx; ++i) {
      const int nk = s[4 * i + 3];  // 255 - (255 - k)
      for (int c = 0; c < 3; ++c) {
        const int cc = 255 - s[4 * i + c];
        const int tmp = cc * nk + 128;
        const int v = nk - (((tmp >> 8) + tmp) >> 8);
        t[3 * i + c] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  }
  return d;
}

// ------------------------------------------------------------------------------------------
// WebP (libwebp). Pillow decodes through WebPAnimDecoder (RGBA, non-premultiplied); for a still
// image that is the frame decoded straight into the zero-filled canvas, i.e. WebPDecode(RGBA).
// ------------------------------------------------------------------------------------------

const char* vp8_status_str(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "not enough data";
    default: return "ok";
  }
}

// EXIF / XMP chunks as libwebp's demuxer (and so Pillow) exposes them: only in the extended
// format, only when the VP8X flags announce them, the first chunk of each kind.
void webp_metadata(const uint8_t* data, size_t size, Meta* m) {
  if (size < 30 || std::memcmp(data + 12, "VP8X", 4) != 0) return;
  const uint8_t flags = data[20];
  const uint64_t riff_end = std::min<uint64_t>(size, uint64_t{rd(data + 4, 4, true)} + 8);
  uint64_t pos = 12;
  while (pos + 8 <= riff_end) {
    const uint8_t* c = data + pos;
    const uint64_t len = rd(c + 4, 4, true);
    if (len > riff_end - pos - 8) break;
    if (std::memcmp(c, "EXIF", 4) == 0 && (flags & 0x08) && !m->has_exif) {
      m->has_exif = true;
      m->exif.assign(c + 8, c + 8 + len);
    } else if (std::memcmp(c, "XMP ", 4) == 0 && (flags & 0x04) && !m->has_xmp) {
      m->has_xmp = true;
      m->xmp.assign(reinterpret_cast<const char*>(c + 8), len);
    }
    pos += 8 + len + (len & 1);
  }
}

Result<Decoded> decode_webp(const uint8_t* data, size_t size, const std::string& name,
                            const ImageReadOptions& opts) {
  WebPBitstreamFeatures f;
  const VP8StatusCode fs = WebPGetFeatures(data, size, &f);
  if (fs == VP8_STATUS_NOT_ENOUGH_DATA)
    return format_error(name + ": truncated WebP file (header incomplete)");
  if (fs != VP8_STATUS_OK)
    return format_error(name + ": corrupt WebP file (libwebp: " + vp8_status_str(fs) + ")");
  if (f.has_animation) return unsupported(name + ": animated WebP is not supported");
  KLEIN_RETURN_IF_ERROR(check_dims(name, "WebP", static_cast<uint64_t>(std::max(f.width, 0)),
                                   static_cast<uint64_t>(std::max(f.height, 0)), opts));
  Decoded d;
  d.width = f.width;
  d.height = f.height;
  d.mode = f.has_alpha ? "RGBA" : "RGB";
  std::vector<uint8_t> rgba(static_cast<size_t>(f.width) * f.height * 4);
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return internal_error(name + ": libwebp version mismatch");
  config.output.colorspace = MODE_RGBA;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = rgba.data();
  config.output.u.RGBA.stride = f.width * 4;
  config.output.u.RGBA.size = rgba.size();
  const VP8StatusCode ds = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);
  if (ds == VP8_STATUS_NOT_ENOUGH_DATA)
    return format_error(name + ": truncated WebP file (data ends before the image is complete)");
  if (ds != VP8_STATUS_OK)
    return format_error(name + ": corrupt WebP file (libwebp: " + vp8_status_str(ds) + ")");
  const size_t npx = static_cast<size_t>(f.width) * f.height;
  d.rgb.resize(npx * 3);
  for (size_t i = 0; i < npx; ++i) {
    d.rgb[3 * i + 0] = rgba[4 * i + 0];
    d.rgb[3 * i + 1] = rgba[4 * i + 1];
    d.rgb[3 * i + 2] = rgba[4 * i + 2];
  }
  webp_metadata(data, size, &d.meta);
  return d;
}

const char* other_format(const uint8_t* p, size_t n) {
  auto starts = [&](const char* s, size_t len) { return n >= len && std::memcmp(p, s, len) == 0; };
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return "GIF";
  if (starts("BM", 2)) return "BMP";
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return "TIFF";
  if (n >= 12 && std::memcmp(p + 4, "ftyp", 4) == 0) return "HEIF/AVIF";
  return nullptr;
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* p, size_t n) {
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return ImageFormat::kJpeg;
  if (n >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0)
    return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& name,
                           const ImageReadOptions& opts, ImageSource* source) {
  if (size == 0) return format_error(name + ": empty file, not an image");
  Result<Decoded> r = Status();
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kPng: r = decode_png(data, size, name, opts); break;
    case ImageFormat::kJpeg: r = decode_jpeg(data, size, name, opts); break;
    case ImageFormat::kWebp: r = decode_webp(data, size, name, opts); break;
    default:
      if (const char* other = other_format(data, size))
        return unsupported(name + ": " + other + " images are not supported (PNG, JPEG or WebP only)");
      return format_error(name + ": not a PNG, JPEG or WebP file (unrecognised content)");
  }
  if (!r.ok()) return r.status();
  Decoded d = std::move(r).value();
  const int o = orientation_of(d.meta);
  apply_orientation(d, o);
  Image img;
  img.width = d.width;
  img.height = d.height;
  img.rgb = std::move(d.rgb);
  if (source) {
    source->mode = std::move(d.mode);
    source->orientation = (o >= 2 && o <= 8) ? o : 1;
  }
  return img;
}

Result<Image> read_image(const std::filesystem::path& path, const ImageReadOptions& opts, ImageSource* source) {
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found(name + ": no such file");
  if (std::filesystem::is_directory(path, ec)) return invalid_argument(name + ": is a directory, not an image");
  const auto fsize = std::filesystem::file_size(path, ec);
  if (ec) return io_error(name + ": cannot stat (" + ec.message() + ")");
  if (opts.max_file_bytes > 0 && fsize > static_cast<uint64_t>(opts.max_file_bytes))
    return invalid_argument(name + ": file is " + std::to_string(fsize) + " bytes, more than the limit of " +
                            std::to_string(opts.max_file_bytes));
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error(name + ": cannot open for reading");
  std::vector<uint8_t> bytes(static_cast<size_t>(fsize));
  if (fsize > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(fsize)))
    return io_error(name + ": read failed");
  return decode_image(bytes.data(), bytes.size(), name, opts, source);
}

}  // namespace klein
