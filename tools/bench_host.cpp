// klein-bench_host: the host-side (single-thread, non-GEMM) steps of a request that run once per
// request or per step, timed at the sizes that matter, each beside what it is small against:
//   - the latent preview at 1024² (64×64 tokens of 128 channels), once per denoising step: a
//     1024² step of the 4B transformer takes tens of seconds on a CPU;
//   - the initial noise at 1024² (torch's CPU normal generator, bit-exact), once per request;
//   - a reference image's Lanczos downscale + crop + normalise (1500×1000 → 1254×836), once per
//     reference and request.
// These were timing bounds inside unit tests (LatentPreview.CostAt1024, Noise.KleinShapeAndSpeed,
// ImagePreprocess.LanczosDownscaleIsFast); ctest now checks only their results.
//
//   klein-bench_host [--reps N] [--image FILE]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "io/image_reader.h"
#include "pipeline/image_preprocess.h"
#include "pipeline/noise.h"
#include "pipeline/preview.h"

using namespace klein;

namespace {

void report(const char* what, const bench::Time& t) {
  std::printf("%-52s best %9.2f ms wall, %9.2f ms CPU\n", what, t.wall * 1e3, t.cpu * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"klein-bench_host: host-side steps of a request (preview, noise, reference preprocessing)"};
  int reps = 5;
  std::string image = "tests/data/images/size_1500x1000.jpg";
  app.add_option("--reps", reps, "timed repetitions (best of)")->check(CLI::Range(1, 1000));
  app.add_option("--image", image, "a reference image to preprocess (PNG/JPEG/WebP)");
  CLI11_PARSE(app, argc, argv);

  auto map = flux2_latent_rgb_map();
  if (!map.ok()) {
    std::fprintf(stderr, "klein-bench_host: %s\n", map.status().to_string().c_str());
    return 1;
  }
  Tensor x({64 * 64, 128}), v({64 * 64, 128});
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(i % 7) * 0.1f, v.data()[i] = 0.3f;
  const LatentStats st{std::vector<float>(128, 0.1f), std::vector<float>(128, 1.5f)};
  bool ok = true;
  report("latent preview 1024x1024 (per step)", bench::time_best(reps, [&] {
           ok &= latent_preview(x, v, 0.7f, 64, 64, *map, st, 1024, 1024).ok();
         }));
  report("noise 1x128x64x64, torch CPU generator (per request)", bench::time_best(reps, [&] {
           Tensor t = torch_randn(klein_noise_shape(1024, 1024), 42, true);
           ok &= t.numel() == 128 * 64 * 64;
         }));
  auto img = read_image(image);
  if (!img.ok()) {
    std::fprintf(stderr, "klein-bench_host: %s\n", img.status().to_string().c_str());
    return 1;
  }
  const std::string what = "reference " + std::to_string(img->width) + "x" + std::to_string(img->height) +
                           ": Lanczos + crop + normalise";
  report(what.c_str(), bench::time_best(reps, [&] { ok &= preprocess_reference(*img, image).ok(); }));
  if (!ok) {
    std::fprintf(stderr, "klein-bench_host: a measured call failed\n");
    return 1;
  }
  return 0;
}
