// `klein compare A B`: PSNR, SSIM and correlation of two images (klein::compare_image_files), or
// cosine / relative L2 / max difference of two .npy arrays (klein::compare_npy_files), e.g. the
// prompt_embeds or velocity_stepN of two --dump folders.
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
        "compare",
        "PSNR (RGB), SSIM (luma, Gaussian 11x11 window) and Pearson correlation of two images of one size; "
        "for two .npy files (e.g. --dump outputs): cosine, relative L2 error and max difference");
    s->add_option("a", o->a, "First image (PNG/JPEG/WebP) or .npy, e.g. the full-precision one")->required();
    s->add_option("b", o->b, "Second image or .npy")->required();
    return s;
  };
  c.run = [o]() -> int {
    auto is_npy = [](const std::string& p) { return p.size() >= 4 && p.compare(p.size() - 4, 4, ".npy") == 0; };
    if (is_npy(o->a) != is_npy(o->b)) return fail(invalid_argument("compare: give two images or two .npy files"));
    if (is_npy(o->a)) {
      auto r = compare_npy_files(o->a, o->b);
      if (!r.ok()) return fail(r.status());
      std::printf("cosine       %.9f\n", r->cosine);
      std::printf("rel_l2       %.3e\n", r->rel_l2);
      std::printf("max_abs      %.3e\n", r->max_abs);
      std::printf("elements     %lld\n", static_cast<long long>(r->count));
      return 0;
    }
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
