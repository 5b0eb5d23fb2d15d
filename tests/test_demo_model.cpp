// The demo model draws what it is asked (issue 48's proof): every prompt of
// tests/data/demo_check/prompts.json, seeds 0 and 1, 128x128, 4 steps, read back by the picture
// analysis of shape_analysis.h (itself checked against the renderer's drawings in
// test_shape_analysis.cpp). The expectations are the prompts' own words; nothing of klein's
// output is stored. Each run prints a table (prompt, seed, what was read, the measures) and its
// pass rate per attribute, which must be >= 90 % for colour, shape and count each: at fp32 and
// fast precision, and for the model quantized to q8 and q4 (whose PSNR against the fp32 pictures
// is printed too).
//
// The model is models/demo; KLEIN_TEST_DEMO_MODEL=/path/to/folder checks another (a training
// run's output before it is copied there). KLEIN_TEST_DEMO_OUT=/folder also writes every
// picture there as <variant>_<prompt index>_s<seed>.png.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "klein/klein.h"
#include "shape_analysis.h"
#include "testing.h"

namespace fs = std::filesystem;
namespace kt = klein::testing;

namespace {

const std::vector<uint64_t> kDemoSeeds = {0, 1};

fs::path demo_model_dir() {
  const char* env = std::getenv("KLEIN_TEST_DEMO_MODEL");
  return env && *env ? fs::path(env) : fs::path(KLEIN_DEMO_MODEL);
}

struct DemoRun {
  std::string variant;
  std::vector<klein::Image> images;  // prompt-major, then seed
  int colour = 0, shape = 0, count = 0, total = 0;  // images read right, per attribute
  int held_out = 0, held_out_right = 0;  // held-out combinations: pictures, and those right in all three
  double seconds = 0;
};

double share(int n, int total) { return total ? static_cast<double>(n) / total : 0; }

// Generates every prompt at every seed with `model_dir` at `precision`, reads each picture and
// prints the table. `reference` (same order), if given, is what PSNR is measured against.
DemoRun run_demo(const std::string& variant, const fs::path& model_dir, klein::Precision precision,
                 const kt::DemoCheckData& data, const std::vector<klein::Image>* reference = nullptr) {
  DemoRun run{variant, {}, 0, 0, 0, 0, 0};
  klein::LoadOptions lo;
  lo.threads = 1;
  lo.memory = klein::MemoryPolicy::kResident;
  lo.precision = precision;
  lo.backend = klein::BackendKind::kCpu;
  auto model = klein::Model::open(model_dir.string(), lo);
  EXPECT_TRUE(model.ok()) << variant << ": " << model.status().to_string();
  if (!model.ok()) return run;
  const char* out = std::getenv("KLEIN_TEST_DEMO_OUT");
  double psnr_sum = 0, psnr_min = std::numeric_limits<double>::infinity();
  std::printf("[demo %s] %-3s %-4s %-46s %-22s %s\n", variant.c_str(), "#", "seed", "prompt",
              "read as (! wrong)", "measures (* held-out combination)");
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < data.prompts.size(); ++i) {
    const auto& p = data.prompts[i];
    klein::GenerateRequest req;
    req.prompt = p.prompt;
    req.width = req.height = data.size;
    req.steps = 4;
    auto r = (*model)->generate_batch(req, kDemoSeeds);
    EXPECT_TRUE(r.ok()) << variant << " \"" << p.prompt << "\": " << r.status().to_string();
    if (!r.ok()) continue;
    for (size_t k = 0; k < kDemoSeeds.size(); ++k) {
      const klein::Image& img = (*r)[k].image;
      const auto a = kt::analyze_scene(img.rgb, img.width, img.height, data.palette);
      const bool c = a.colour == p.colour, s = a.shape == p.shape, n = a.count == p.count;
      run.colour += c, run.shape += s, run.count += n, run.total++;
      if (p.held_out) run.held_out++, run.held_out_right += c && s && n;
      char got[64];
      std::snprintf(got, sizeof got, "%s%s %s%s %d%s", a.colour.empty() ? "-" : a.colour.c_str(), c ? "" : "!",
                    a.shape.empty() ? "-" : a.shape.c_str(), s ? "" : "!", a.count, n ? "" : "!");
      std::string psnr;
      if (reference && reference->size() > run.images.size()) {
        auto cmp = klein::compare_images((*reference)[run.images.size()], img);
        if (cmp.ok()) {
          const double v = std::min(cmp->psnr, 99.0);
          psnr_sum += v, psnr_min = std::min(psnr_min, v);
          char b[32];
          std::snprintf(b, sizeof b, " psnr %.2f", v);
          psnr = b;
        }
      }
      std::printf("[demo %s] %-2zu%s %-4llu %-46s %-22s %s%s\n", variant.c_str(), i, p.held_out ? "*" : " ",
                  static_cast<unsigned long long>(kDemoSeeds[k]), p.prompt.c_str(), got, a.summary().c_str(),
                  psnr.c_str());
      if (out && *out) {
        char name[96];
        std::snprintf(name, sizeof name, "%s_%02zu_s%llu.png", variant.c_str(), i,
                      static_cast<unsigned long long>(kDemoSeeds[k]));
        EXPECT_TRUE(klein::save_png((fs::path(out) / name).string(), img).ok()) << name;
      }
      run.images.push_back(img);
    }
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[demo %s] pass rate: colour %d/%d (%.1f %%), shape %d/%d (%.1f %%), count %d/%d (%.1f %%); "
              "%.2f s per picture",
              variant.c_str(), run.colour, run.total, 100 * share(run.colour, run.total), run.shape, run.total,
              100 * share(run.shape, run.total), run.count, run.total, 100 * share(run.count, run.total),
              run.total ? run.seconds / run.total : 0.0);
  std::printf("; held-out combinations right in all three: %d/%d", run.held_out_right, run.held_out);
  if (reference && run.total)
    std::printf("; PSNR against fp32: mean %.2f dB, min %.2f dB", psnr_sum / run.total, psnr_min);
  std::printf("\n");
  std::fflush(stdout);
  return run;
}

void expect_pass_rate(const DemoRun& run, size_t prompts) {
  EXPECT_EQ(run.total, static_cast<int>(prompts * kDemoSeeds.size())) << run.variant << ": pictures made";
  EXPECT_GE(share(run.colour, run.total), 0.9) << run.variant << ": colour read right in " << run.colour << " of "
                                               << run.total << " pictures (table above)";
  EXPECT_GE(share(run.shape, run.total), 0.9) << run.variant << ": shape read right in " << run.shape << " of "
                                              << run.total << " pictures (table above)";
  EXPECT_GE(share(run.count, run.total), 0.9) << run.variant << ": count read right in " << run.count << " of "
                                              << run.total << " pictures (table above)";
}

}  // namespace

// One test, so that the fp32 pictures the others are compared with are made once: fp32 (the
// exact path), fast (the default), and q8 and q4 as quantize_model writes them, run as users run
// them (fast: W8A8 / W4A8). 192 pictures on one engine thread: about 13 s on a loaded 2-core CI-sized
// machine, most of it fp32.
TEST(DemoModel, DrawsWhatThePromptsSay) {
  const fs::path dir = demo_model_dir();
  if (!fs::exists(dir / "model_index.json"))  // TODO(lead): a failure once models/demo is committed
    GTEST_SKIP() << "no demo model at " << dir.string()
                 << " (scripts/train_demo/train.py makes it; KLEIN_TEST_DEMO_MODEL names another folder)";
  const kt::DemoCheckData d = kt::load_demo_check();
  ASSERT_TRUE(d.error.empty()) << d.error;
  const DemoRun fp32 = run_demo("fp32", dir, klein::Precision::kFp32, d);
  expect_pass_rate(fp32, d.prompts.size());
  expect_pass_rate(run_demo("fast", dir, klein::Precision::kFast, d, &fp32.images), d.prompts.size());
  for (const char* type : {"q8", "q4"}) {
    const fs::path tmp = kt::make_temp_dir(std::string("demo_") + type);
    klein::QuantizeOptions q;
    q.model = dir.string();
    q.output = (tmp / "model").string();
    q.type = type;
    q.threads = 2;
    const klein::Status st = klein::quantize_model(q);
    ASSERT_TRUE(st.ok()) << type << ": " << st.to_string();
    expect_pass_rate(run_demo(type, q.output, klein::Precision::kFast, d, &fp32.images), d.prompts.size());
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
}
