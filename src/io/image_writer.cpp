#include "io/image_writer.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <jpeglib.h>
#include <string>
#include <webp/encode.h>

namespace klein {

namespace {

struct JpegWriteErr {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char msg[JMSG_LENGTH_MAX] = {};
};

// libjpeg's default handler exit()s: jump back to the caller with the message instead.
void on_jpeg_write_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegWriteErr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->msg);
  std::longjmp(e->jump, 1);
}

Status check_args(const char* what, int width, int height, int quality) {
  if (width <= 0 || height <= 0) return invalid_argument(std::string(what) + " encoding: empty image");
  if (quality < 1 || quality > 100)
    return invalid_argument(std::string(what) + " encoding: quality " + std::to_string(quality) + " is not in 1..100");
  return Status::Ok();
}

}  // namespace

Result<std::vector<uint8_t>> encode_jpeg(int width, int height, const uint8_t* rgb, int quality) {
  KLEIN_RETURN_IF_ERROR(check_args("JPEG", width, height, quality));
  jpeg_compress_struct cinfo{};
  JpegWriteErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_write_error;
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buf);
    return io_error(std::string("JPEG encoding failed (") + err.msg + ")");
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(rgb + static_cast<size_t>(cinfo.next_scanline) * width * 3);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buf, buf + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buf);
  return out;
}

Result<std::vector<uint8_t>> encode_webp(int width, int height, const uint8_t* rgb, int quality) {
  KLEIN_RETURN_IF_ERROR(check_args("WebP", width, height, quality));
  if (width > WEBP_MAX_DIMENSION || height > WEBP_MAX_DIMENSION)
    return invalid_argument("WebP encoding: " + std::to_string(width) + "x" + std::to_string(height) +
                            " exceeds WebP's 16383-pixel limit");
  uint8_t* buf = nullptr;
  const size_t size = WebPEncodeRGB(rgb, width, height, width * 3, static_cast<float>(quality), &buf);
  if (size == 0 || !buf) return io_error("WebP encoding failed");
  std::vector<uint8_t> out(buf, buf + size);
  WebPFree(buf);
  return out;
}

}  // namespace klein
