// klein-bench_vae: the VAE alone on a full-size folder (e.g. the random 4B model's vae/, made by
// klein-make_random_model): decode a random latent whole and/or in tiles, or the encoder's mean
// path (reference images) on a random image. Was the environment-driven test
// Flux2VaeTiled.FullSizeMeasurement; a measurement belongs here, not in ctest.
//
//   klein-bench_vae --vae DIR [--px 256] [--tile 96] [--mode compare|whole|tiled|encode|encode-tiled]
//                   [--precision fp32|fast] [--warmup N] [--threads 2]
//
// compare (default): both decodes, then max|tiled - whole| / max|whole| (must stay ≤ 1e-5; exit 1
// otherwise). whole / tiled: one decode, for /usr/bin/time -v peak RSS. encode / encode-tiled:
// --warmup timed encodes first (the first call also faults in the weights' pages and grows the
// kernels' scratch; a resident model's later calls do neither), then one.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "bench_timing.h"
#include "models/flux2_vae.h"

using namespace klein;

namespace {

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a.data()[i] - b.data()[i])));
    den = std::max(den, static_cast<double>(std::fabs(b.data()[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"klein-bench_vae: the FLUX.2 VAE alone on a full-size folder"};
  std::string dir, mode = "compare", precision = "fp32";
  int64_t px = 256, tile = 96;
  int warmup = 0, threads = 2;
  app.add_option("--vae", dir, "a full-size vae/ folder (config.json + safetensors)")->required();
  app.add_option("--px", px, "image side in pixels (a multiple of 16)")->check(CLI::Range(16, 8192));
  app.add_option("--tile", tile, "tile side in pixels for the tiled runs (a multiple of 8)")->check(CLI::Range(8, 8192));
  app.add_option("--mode", mode, "compare | whole | tiled | encode | encode-tiled")
      ->check(CLI::IsMember({"compare", "whole", "tiled", "encode", "encode-tiled"}));
  app.add_option("--precision", precision, "fp32 | fast")->check(CLI::IsMember({"fp32", "fast"}));
  app.add_option("--warmup", warmup, "timed encodes before the measured one (encode modes)")->check(CLI::Range(0, 100));
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  if (px % 16 != 0 || tile % 8 != 0) {
    std::fprintf(stderr, "klein-bench_vae: --px must be a multiple of 16 and --tile of 8\n");
    return 2;
  }

  auto vae = Flux2Vae::load(std::filesystem::path(dir));
  if (!vae.ok()) {
    std::fprintf(stderr, "klein-bench_vae: %s\n", vae.status().to_string().c_str());
    return 1;
  }
  CpuBackend be(CpuBackendOptions{
      .threads = threads, .precision = precision == "fast" ? kernels::Precision::kFast : kernels::Precision::kFp32});
  RunContext ctx;
  ctx.backend = &be;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "klein-bench_vae: %s\n", s.to_string().c_str());
    return 1;
  };

  if (mode == "encode" || mode == "encode-tiled") {
    const VaeTiling et{.tile = mode == "encode" ? -1 : tile};
    Tensor img({1, 3, px, px});
    for (int64_t i = 0; i < img.numel(); ++i) img.data()[i] = std::clamp(nd(rng) * 0.5f, -1.0f, 1.0f);
    for (int i = 0; i <= warmup; ++i) {
      const double t0 = bench::now_s();
      auto r = vae->encode_mean(img, ctx, et);
      if (!r.ok()) return fail(r.status());
      std::printf("[ vae ] %s%s encode %lldx%lld: %.3f s\n", i < warmup ? "warm-up " : "", et.tile > 0 ? "tiled" : "whole",
                  static_cast<long long>(px), static_cast<long long>(px), bench::now_s() - t0);
    }
    return 0;
  }

  Tensor z({1, 32, px / 8, px / 8});
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = nd(rng);
  auto timed = [&](const VaeTiling& t) {
    const double t0 = bench::now_s();
    auto r = vae->decode(z, ctx, t);
    std::printf("[ vae ] %s decode %lldx%lld: %.2f s\n", t.tile > 0 ? "tiled" : "whole", static_cast<long long>(px),
                static_cast<long long>(px), bench::now_s() - t0);
    return r;
  };
  Result<Tensor> whole = Tensor(), tiled = Tensor();
  if (mode != "tiled") whole = timed(VaeTiling{.tile = -1});
  if (!whole.ok()) return fail(whole.status());
  if (mode != "whole") tiled = timed(VaeTiling{.tile = tile});
  if (!tiled.ok()) return fail(tiled.status());
  if (mode == "compare") {
    const double e = max_rel_diff(*tiled, *whole);
    std::printf("[ vae ] tile %lld: max|tiled - whole| / max|whole| = %.3g\n", static_cast<long long>(tile), e);
    if (!(e <= 1e-5)) {
      std::fprintf(stderr, "klein-bench_vae: tiled and whole decodes differ by %.3g (> 1e-5)\n", e);
      return 1;
    }
  }
  return 0;
}
