// The input as a reference image: format sniffing, the PNG/JPEG/WebP decoders with their EXIF
// orientation handling, then the pipeline's reference preprocessing (size checks, Lanczos
// downscale above 1 Mpx, centre crop, [-1, 1] tensor) and a Lanczos resize to a size taken
// from the input's last bytes (decoders ignore trailing bytes, so every image gets one).
#include <cstdint>

#include "fuzz_util.h"
#include "io/image_reader.h"
#include "pipeline/image_preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)klein::sniff_image_format(data, size);
  klein::ImageReadOptions opts;
  // Above 1 Mpx so the downscale is reached, small enough to keep executions fast.
  opts.max_pixels = int64_t{1} << 21;
  klein::ImageSource source;
  auto img = klein::decode_image(data, size, "fuzz.img", opts, &source);
  if (!img.ok()) return 0;
  fuzz::consume(img->rgb.data(), img->rgb.size());
  if (auto t = klein::preprocess_reference(*img, "fuzz.img"); t.ok())
    fuzz::consume(t->data(), static_cast<size_t>(t->numel()) * sizeof(float));
  if (size >= 2 && int64_t{img->width} * img->height <= (1 << 16)) {
    const auto r = klein::resize_lanczos(*img, 1 + data[size - 1] % 97, 1 + data[size - 2] % 97);
    fuzz::consume(r.rgb.data(), r.rgb.size());
  }
  return 0;
}
