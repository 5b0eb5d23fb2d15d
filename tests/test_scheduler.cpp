// The klein sigma schedule, compute_empirical_mu and the FlowMatchEuler step against fixtures
// written by scripts/reference/dump_schedule_noise.py with the real diffusers code: bitwise
// equality everywhere (the schedule is deterministic float32/float64 arithmetic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "pipeline/scheduler.h"
#include "testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path sched_dir() { return testing::data_dir() / "ref" / "sched_exact"; }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

std::vector<float> load_f32(const fs::path& p) {
  auto r = read_npy(p);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  EXPECT_EQ(r->dtype, DType::kF32) << p;
  return r->to_f32();
}

// Bitwise equality (NaN matches NaN: diffusers yields NaN for shift_terminal with one step).
void expect_bits_eq(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    EXPECT_EQ(bits(got[i]), bits(want[i]))
        << what << " [" << i << "]: got " << got[i] << " want " << want[i];
  }
}

nlohmann::json load_cases() {
  auto j = read_json_file(sched_dir() / "cases.json");
  EXPECT_TRUE(j.ok()) << j.status().to_string();
  return j.ok() ? j.value() : nlohmann::json::object();
}

TEST(Scheduler, KleinScheduleMatchesDiffusersBitwise) {
  auto cfg = FlowMatchConfig::from_file(sched_dir() / "scheduler_config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const auto cases = load_cases();
  ASSERT_GE(cases["cases"].size(), 40u);
  for (const auto& c : cases["cases"]) {
    const int64_t W = c["width"], H = c["height"], L = c["image_seq_len"];
    const int N = c["steps"];
    const std::string tag = std::to_string(W) + "x" + std::to_string(H) + "_" + std::to_string(N);
    EXPECT_EQ(klein_image_seq_len(W, H), L) << tag;
    const double mu_want = c["mu"].get<double>();
    EXPECT_EQ(bits(compute_empirical_mu(L, N)), bits(mu_want))
        << tag << ": mu " << compute_empirical_mu(L, N) << " vs " << mu_want;
    auto s = make_klein_schedule(cfg.value(), N, L);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(bits(s->mu), bits(mu_want)) << tag;
    expect_bits_eq(s->sigmas, load_f32(sched_dir() / ("sigmas_" + tag + ".npy")), "sigmas " + tag);
    expect_bits_eq(s->timesteps, load_f32(sched_dir() / ("timesteps_" + tag + ".npy")),
                   "timesteps " + tag);
  }
}

TEST(Scheduler, ConfigVariantsMatchDiffusersBitwise) {
  const auto cases = load_cases();
  ASSERT_GE(cases["variants"].size(), 5u);
  for (const auto& v : cases["variants"]) {
    const std::string name = v["name"];
    auto cfg = FlowMatchConfig::from_json(v["config"], "variant " + name);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    const int64_t L = klein_image_seq_len(v["width"], v["height"]);
    for (int N : v["steps"].get<std::vector<int>>()) {
      const std::string tag = name + "_" + std::to_string(N);
      auto s = make_klein_schedule(cfg.value(), N, L);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      expect_bits_eq(s->sigmas,
                     load_f32(sched_dir() / ("var_" + name + "_sigmas_" + std::to_string(N) + ".npy")),
                     "sigmas " + tag);
      expect_bits_eq(
          s->timesteps,
          load_f32(sched_dir() / ("var_" + name + "_timesteps_" + std::to_string(N) + ".npy")),
          "timesteps " + tag);
    }
  }
}

TEST(Scheduler, KnownValuesFromSpec) {
  // spec §5.3: 1024x1024, 4 steps; hex 0x1.ef4cf6p-1, 0x1.d0f83ep-1, 0x1.88ce6ep-1
  auto s = make_klein_schedule(FlowMatchConfig::flux2(), 4, 4096);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->sigmas.size(), 5u);
  ASSERT_EQ(s->timesteps.size(), 4u);
  EXPECT_EQ(s->sigmas[0], 1.0f);
  EXPECT_EQ(s->sigmas[1], 0x1.ef4cf6p-1f);
  EXPECT_EQ(s->sigmas[2], 0x1.d0f83ep-1f);
  EXPECT_EQ(s->sigmas[3], 0x1.88ce6ep-1f);
  EXPECT_EQ(s->sigmas[4], 0.0f);
  EXPECT_EQ(s->timesteps[1], 967.384033203125f);
  EXPECT_EQ(s->timesteps[3], 767.199951171875f);
  EXPECT_DOUBLE_EQ(s->mu, 2.291179894115571);
}

TEST(Scheduler, EmpiricalMuJumpsAbove4300Tokens) {
  EXPECT_NEAR(compute_empirical_mu(4300, 4), 2.308, 1e-3);
  EXPECT_NEAR(compute_empirical_mu(4301, 4), 1.185, 1e-3);
  // above the switch the step count is ignored
  EXPECT_EQ(compute_empirical_mu(4624, 1), compute_empirical_mu(4624, 50));
  EXPECT_NE(compute_empirical_mu(4096, 1), compute_empirical_mu(4096, 50));
}

TEST(Scheduler, NumpyLinspace) {
  EXPECT_EQ(numpy_linspace(1.0, 1.0, 1), std::vector<double>{1.0});
  EXPECT_TRUE(numpy_linspace(1.0, 0.5, 0).empty());
  auto v = numpy_linspace(1.0, 1.0 / 3.0, 3);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[2], 1.0 / 3.0);  // the endpoint is stored exactly
  // step = (1/3 - 1) / 2, y = 1 * step + 1
  const double step = (1.0 / 3.0 - 1.0) / 2.0;
  EXPECT_EQ(v[1], step + 1.0);
}

TEST(Scheduler, StaticShiftWhenDynamicShiftingOff) {
  FlowMatchConfig c = FlowMatchConfig::flux2();
  c.use_dynamic_shifting = false;  // spec §5.4: 3s / (1 + 2s)
  auto s = make_klein_schedule(c, 4, 1024);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->sigmas, (std::vector<float>{1.0f, 0.9f, 0.75f, 0.5f, 0.0f}));
}

TEST(Scheduler, RejectsBadArguments) {
  EXPECT_EQ(make_klein_schedule(FlowMatchConfig::flux2(), 0, 1024).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(make_klein_schedule(FlowMatchConfig::flux2(), 4, 0).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(flow_match_set_timesteps(FlowMatchConfig::flux2(), {1.0, 0.5}, std::nullopt)
                .status()
                .code(),
            Code::kInvalidArgument);
}

TEST(Scheduler, ConfigParsing) {
  auto tiny = FlowMatchConfig::from_file(testing::tiny_model_dir() / "scheduler" /
                                         "scheduler_config.json");
  ASSERT_TRUE(tiny.ok()) << tiny.status().to_string();
  EXPECT_TRUE(tiny->use_dynamic_shifting);
  EXPECT_EQ(tiny->time_shift_type, TimeShiftType::kExponential);
  EXPECT_EQ(tiny->shift, 3.0);
  EXPECT_EQ(tiny->num_train_timesteps, 1000);
  EXPECT_FALSE(tiny->shift_terminal.has_value());
  EXPECT_FALSE(tiny->invert_sigmas);

  // diffusers constructor defaults for absent keys
  auto empty = FlowMatchConfig::from_json(nlohmann::json::object());
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->use_dynamic_shifting);
  EXPECT_EQ(empty->shift, 1.0);
  EXPECT_EQ(empty->num_train_timesteps, 1000);

  auto lin = FlowMatchConfig::from_json({{"time_shift_type", "linear"}, {"shift_terminal", 0.1}});
  ASSERT_TRUE(lin.ok());
  EXPECT_EQ(lin->time_shift_type, TimeShiftType::kLinear);
  ASSERT_TRUE(lin->shift_terminal.has_value());
  EXPECT_EQ(*lin->shift_terminal, 0.1);

  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                          "stochastic_sampling"}) {
    auto r = FlowMatchConfig::from_json({{key, true}});
    EXPECT_EQ(r.status().code(), Code::kUnsupported) << key;
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().message();
    EXPECT_TRUE(FlowMatchConfig::from_json({{key, false}}).ok()) << key;
  }
  EXPECT_EQ(FlowMatchConfig::from_json({{"time_shift_type", "cosine"}}).status().code(),
            Code::kFormatError);
  EXPECT_EQ(FlowMatchConfig::from_json({{"shift", "3"}}).status().code(), Code::kFormatError);
  EXPECT_EQ(FlowMatchConfig::from_json({{"_class_name", "EulerDiscreteScheduler"}}).status().code(),
            Code::kUnsupported);
  EXPECT_EQ(FlowMatchConfig::from_file(sched_dir() / "no_such.json").status().code(),
            Code::kNotFound);
}

// scheduler.step as the pipeline calls it, 4 steps at 1024x1024, fp32 and bf16 model dtype.
void run_steps(const std::string& dt, bool bf16) {
  const auto cases = load_cases();
  auto s = make_klein_schedule(FlowMatchConfig::flux2(), 4, 4096);
  ASSERT_TRUE(s.ok());
  std::vector<float> x = load_f32(sched_dir() / ("step_x0_" + dt + ".npy"));
  const std::vector<float> v = load_f32(sched_dir() / ("step_v_" + dt + ".npy"));
  ASSERT_EQ(x.size(), v.size());
  ASSERT_FALSE(x.empty());
  for (int i = 0; i < 4; ++i) {
    if (bf16) {
      euler_step_bf16(x.data(), v.data(), static_cast<int64_t>(x.size()), s->sigmas[i],
                      s->sigmas[i + 1]);
    } else {
      euler_step(x.data(), v.data(), static_cast<int64_t>(x.size()), s->sigmas[i],
                 s->sigmas[i + 1]);
    }
    expect_bits_eq(x, load_f32(sched_dir() / ("step_x" + std::to_string(i + 1) + "_" + dt + ".npy")),
                   "step " + std::to_string(i + 1) + " " + dt);
  }
}

TEST(Scheduler, EulerStepFp32MatchesDiffusersBitwise) { run_steps("f32", false); }
TEST(Scheduler, EulerStepBf16MatchesDiffusersBitwise) { run_steps("bf16", true); }

TEST(Scheduler, EulerStepTensorShapeCheck) {
  Tensor a({2, 3}), b({3, 3});
  EXPECT_EQ(euler_step(a, b, 1.0f, 0.5f).code(), Code::kInvalidArgument);
  Tensor v({2, 3});
  for (int i = 0; i < 6; ++i) v.data()[i] = 2.0f;
  ASSERT_TRUE(euler_step(a, v, 1.0f, 0.75f).ok());
  EXPECT_EQ(a.data()[5], -0.5f);
}

}  // namespace
}  // namespace klein
