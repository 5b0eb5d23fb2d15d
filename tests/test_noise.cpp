// torch_randn against torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed)),
// fixtures from scripts/reference/dump_schedule_noise.py: bitwise equality, float32 and bf16, for
// both ATen CPU kernels (AVX2 = what x86 machines run, DEFAULT = ATEN_CPU_CAPABILITY=default).
// Small shapes are stored in full; large ones as a 64-bit hash of the element bit patterns.
// Set KLEIN_NOISE_EXTRA=<file> (written by the script's --extra) to check many more shapes/seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "klein/klein.h"
#include "pipeline/noise.h"
#include "testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path noise_dir() { return testing::data_dir() / "ref" / "noise_exact"; }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Mirrors bits_hash() in dump_schedule_noise.py.
std::string bits_hash(const Tensor& t, bool bf16) {
  uint64_t s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t b = bf16 ? f32_to_bf16(t.data()[i]) : bits(t.data()[i]);
    s += (splitmix64(static_cast<uint64_t>(i)) | 1u) * (b + 1);
  }
  const uint64_t h = splitmix64(static_cast<uint64_t>(t.numel()) + s);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

TorchCpuKernel kernel_of(const nlohmann::json& e) {
  return e["kernel"] == "default" ? TorchCpuKernel::kDefault : TorchCpuKernel::kAvx2;
}

std::string describe(const nlohmann::json& e) {
  std::ostringstream os;
  os << "seed " << e["seed"] << " shape " << e["shape"].dump() << " " << e["dtype"].get<std::string>()
     << " kernel " << e["kernel"].get<std::string>();
  return os.str();
}

nlohmann::json load_cases(const fs::path& p) {
  auto j = read_json_file(p);
  EXPECT_TRUE(j.ok()) << j.status().to_string();
  return j.ok() ? j.value() : nlohmann::json::object();
}

// Checks hash entries; returns the number checked.
int check_hashes(const nlohmann::json& list) {
  int n = 0;
  for (const auto& e : list) {
    const bool bf16 = e["dtype"] == "bf16";
    Tensor t = torch_randn(e["shape"].get<std::vector<int64_t>>(), e["seed"].get<uint64_t>(), bf16,
                           kernel_of(e));
    EXPECT_EQ(bits_hash(t, bf16), e["hash"].get<std::string>()) << describe(e);
    if (e.contains("head")) {
      const auto head = e["head"].get<std::vector<float>>();
      for (size_t i = 0; i < head.size() && static_cast<int64_t>(i) < t.numel(); ++i) {
        EXPECT_EQ(bits(t.data()[i]), bits(head[i])) << describe(e) << " [" << i << "]";
      }
    }
    ++n;
  }
  return n;
}

TEST(Noise, Mt19937MatchesReferenceSequence) {
  // torch seeds a standard MT19937 (init_genrand); 5489 is its default seed.
  TorchCpuGenerator g(5489);
  EXPECT_EQ(g.random(), 3499211612u);
  for (int i = 1; i < 9999; ++i) (void)g.random();
  EXPECT_EQ(g.random(), 4123659995u);  // the 10000th output, as for std::mt19937
  // only the low 32 bits of the seed are used
  TorchCpuGenerator a(5), b((uint64_t{1} << 32) + 5);
  EXPECT_EQ(a.random64(), b.random64());
}

TEST(Noise, FullArraysMatchTorchBitwise) {
  const auto cases = load_cases(noise_dir() / "cases.json");
  ASSERT_GE(cases["full"].size(), 90u);
  int n_avx2 = 0, n_default = 0;
  for (const auto& e : cases["full"]) {
    const bool bf16 = e["dtype"] == "bf16";
    const auto shape = e["shape"].get<std::vector<int64_t>>();
    Tensor t = torch_randn(shape, e["seed"].get<uint64_t>(), bf16, kernel_of(e));
    EXPECT_EQ(t.shape(), shape);
    auto want = read_npy(noise_dir() / e["file"].get<std::string>());
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    ASSERT_EQ(want->shape, shape) << describe(e);
    const std::vector<float> w = want->to_f32();
    int bad = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (bits(t.data()[i]) != bits(w[i]) && ++bad <= 5) {
        ADD_FAILURE() << describe(e) << " [" << i << "]: got " << t.data()[i] << " want " << w[i];
      }
    }
    EXPECT_EQ(bad, 0) << describe(e);
    (kernel_of(e) == TorchCpuKernel::kAvx2 ? n_avx2 : n_default)++;
  }
  EXPECT_GT(n_avx2, 0);
  EXPECT_GT(n_default, 0);
}

TEST(Noise, LargeShapesMatchTorchHashes) {
  const auto cases = load_cases(noise_dir() / "cases.json");
  ASSERT_GE(cases["hashes"].size(), 30u);
  EXPECT_EQ(check_hashes(cases["hashes"]), static_cast<int>(cases["hashes"].size()));
}

TEST(Noise, Bf16IsRoundedFloatOnlyForWholeBlocksOf16) {
  // 1920 values: the bf16 draw equals the rounded float32 draw ...
  Tensor f = torch_randn({1, 128, 3, 5}, 0, false), h = torch_randn({1, 128, 3, 5}, 0, true);
  for (int64_t i = 0; i < f.numel(); ++i) ASSERT_EQ(round_bf16(f.data()[i]), h.data()[i]) << i;
  // ... but not with a partial last block: the tail block uses different uniforms.
  Tensor f17 = torch_randn({17}, 0, false), h17 = torch_randn({17}, 0, true);
  bool differs = false;
  for (int64_t i = 0; i < 17; ++i) differs |= round_bf16(f17.data()[i]) != h17.data()[i];
  EXPECT_TRUE(differs);
  const auto cases = load_cases(noise_dir() / "cases.json");
  EXPECT_TRUE(cases["facts"]["bf16_equals_rounded_f32_when_numel_multiple_of_16"].get<bool>());
  EXPECT_FALSE(cases["facts"]["bf16_equals_rounded_f32_numel17"].get<bool>());
}

// The draw's time at 1024²: klein-bench_host.
TEST(Noise, KleinShapeAndStatistics) {
  EXPECT_EQ(klein_noise_shape(1024, 1024), (std::vector<int64_t>{1, 128, 64, 64}));
  EXPECT_EQ(klein_noise_shape(1360, 768), (std::vector<int64_t>{1, 128, 48, 85}));
  EXPECT_EQ(klein_noise_shape(1000, 1000), (std::vector<int64_t>{1, 128, 62, 62}));
  Tensor t = torch_randn(klein_noise_shape(1024, 1024), 42, true);
  EXPECT_TRUE(all_finite(t.data(), t.numel()));
  // sanity: a standard normal sample
  double m = 0, v = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m += t.data()[i];
  m /= static_cast<double>(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v += (t.data()[i] - m) * (t.data()[i] - m);
  v /= static_cast<double>(t.numel());
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.01);
}

TEST(Noise, ContinuedDrawMatchesSecondCall) {
  // torch_normal_fill continues the generator: two fills of 32 == one generator used twice.
  TorchCpuGenerator g(3);
  std::vector<float> a(32), b(32);
  torch_normal_fill(g, a.data(), 32, false);
  torch_normal_fill(g, b.data(), 32, false);
  Tensor first = torch_randn({32}, 3, false);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(a[i]), bits(first.data()[i]));
  bool same = true;
  for (int i = 0; i < 32; ++i) same &= a[i] == b[i];
  EXPECT_FALSE(same);
}

TEST(Noise, ExtraCasesFromEnv) {
  const char* p = std::getenv("KLEIN_NOISE_EXTRA");
  if (p == nullptr || *p == '\0') GTEST_SKIP() << "KLEIN_NOISE_EXTRA not set";
  const auto cases = load_cases(p);
  const int n = check_hashes(cases["hashes"]);
  EXPECT_GT(n, 0);
  std::printf("checked %d extra noise cases\n", n);
}

// klein::randn, the public form (the Python package draws a batch's noise with it): torch's draw
// for the t2i fixture's seed and shape, a batch whose first slice is the single draw, and shapes
// refused with a message.
TEST(Noise, PublicRandnIsTorchsDraw) {
  auto ref = read_npy(testing::data_dir() / "ref" / "t2i_64x64" / "noise.npy");
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto one = klein::randn({1, 128, 4, 4}, 42);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->shape, (std::vector<int64_t>{1, 128, 4, 4}));
  EXPECT_EQ(one->data, ref->to_f32());
  auto batch = klein::randn({3, 128, 4, 4}, 42);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(std::equal(one->data.begin(), one->data.end(), batch->data.begin()));
  auto bf16 = klein::randn({1, 128, 4, 4}, 42, /*bf16=*/true);
  ASSERT_TRUE(bf16.ok());
  for (float v : bf16->data) EXPECT_EQ(bits(v) & 0xffffu, 0u);
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{}, {1, 0, 4}, {1 << 20, 1 << 20}}) {
    auto r = klein::randn(bad, 1);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("randn"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace klein
