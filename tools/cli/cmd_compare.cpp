// `klein compare A B`: PSNR, SSIM and correlation of two images (klein::compare_image_files).
#include <cmath>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"

namespace klein::cli {

Command make_compare_command() {
  struct Opts {
    std::string a, b;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand(
        "compare", "PSNR (RGB), SSIM (luma, Gaussian 11x11 window) and Pearson correlation of two images of one size");
    s->add_option("a", o->a, "First image (PNG/JPEG/WebP), e.g. the full-precision one")->required();
    s->add_option("b", o->b, "Second image")->required();
    return s;
  };
  c.run = [o]() -> int {
    auto r = compare_image_files(o->a, o->b);
    if (!r.ok()) return fail(r.status());
    if (std::isinf(r->psnr)) std::printf("psnr         inf (identical)\n");
    else std::printf("psnr         %.3f dB\n", r->psnr);
    std::printf("ssim         %.6f\n", r->ssim);
    std::printf("correlation  %.6f\n", r->correlation);
    return 0;
  };
  return c;
}

}  // namespace klein::cli
