// Robustness of the parsers and core types against bad files and configs (issue 12): each test
// here failed before its fix — an exception, undefined behaviour, a silently accepted input or a
// message that did not name the culprit.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "core/checked.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "corrupt.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/png_writer.h"
#include "io/safetensors.h"
#include "models/flux2_dit.h"
#include "models/qwen3.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace klein;
using klein::testing::make_temp_dir;
using klein::testing::write_raw_npy;

namespace {

TEST(Checked, MulAddNumelTrunc) {
  int64_t r = 0;
  EXPECT_TRUE(checked_mul(int64_t{1} << 31, int64_t{1} << 31, &r));
  EXPECT_EQ(r, int64_t{1} << 62);
  EXPECT_FALSE(checked_mul(int64_t{1} << 32, int64_t{1} << 31, &r));
  EXPECT_FALSE(checked_add(INT64_MAX, 1, &r));
  EXPECT_FALSE(checked_numel({1000000000000, 1000000000000}, &r));
  EXPECT_FALSE(checked_numel({-1, 2}, &r));
  EXPECT_TRUE(checked_numel({}, &r));
  EXPECT_EQ(r, 1);
  EXPECT_FALSE(checked_trunc(1e300, &r));
  EXPECT_FALSE(checked_trunc(std::nan(""), &r));
  EXPECT_TRUE(checked_trunc(-2.9, &r));
  EXPECT_EQ(r, -2);
  auto e = checked_mul(int64_t{1} << 40, int64_t{1} << 40, "cfg.json", "heads x dim");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("cfg.json: heads x dim"), std::string::npos);
  EXPECT_EQ(shape_numel({int64_t{1} << 40, int64_t{1} << 40}), INT64_MAX);  // saturates, no UB
}

// ---- .npy

Status read_header(const std::string& dict, const std::string& data = std::string(64, '\0')) {
  const fs::path d = make_temp_dir("npyhdr");
  write_raw_npy(d / "a.npy", dict, data);
  Status s = read_npy(d / "a.npy").status();
  fs::remove_all(d);
  return s;
}

TEST(NpyRobust, ShapeEntriesAreParsedWithoutStoll) {
  // std::stoll threw std::out_of_range here ("internal error: stoll").
  Status s = read_header("{'descr': '<f4', 'fortran_order': False, 'shape': (12345678901234567890123,), }");
  EXPECT_EQ(s.code(), Code::kFormatError) << s.to_string();
  EXPECT_NE(s.message().find("a.npy"), std::string::npos);
}

TEST(NpyRobust, SizeIsCheckedAgainstTheFileBeforeAllocating) {
  // (100000000000,) float32 = 400 GB: was allocated (bad_alloc, "out of memory") before the read.
  Status s = read_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }");
  EXPECT_EQ(s.code(), Code::kFormatError) << s.to_string();
  EXPECT_NE(s.message().find("truncated data"), std::string::npos) << s.message();
  // A product that overflows int64 (signed overflow in shape_numel before).
  s = read_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000000000, 1000000000), }");
  EXPECT_EQ(s.code(), Code::kFormatError) << s.to_string();
}

TEST(NpyRobust, FloatToI64IsDefinedForNaNAndHugeValues) {
  NpyArray a;
  a.dtype = DType::kF32;
  a.shape = {4};
  const float v[4] = {std::nanf(""), 1e30f, -1e30f, 7.9f};
  a.bytes.resize(16);
  std::memcpy(a.bytes.data(), v, 16);
  const auto r = a.to_i64();
  EXPECT_EQ(r, (std::vector<int64_t>{0, INT64_MAX, INT64_MIN, 7}));
}

// ---- Result, Tensor, ThreadPool

TEST(ResultRobust, ValueOnAnErrorAbortsWithTheMessage) {
  Result<int> r = not_found("weights.safetensors: tensor 'x' is missing");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) called on an error: not found: weights.safetensors");
  EXPECT_EQ(r.value_or(7), 7);
  EXPECT_EQ(Result<int>(3).value_or(7), 3);
}

TEST(TensorRobust, ReshapeMismatchIsAStatus) {
  Tensor t({2, 3});
  EXPECT_FALSE(t.reshape({4, 2}).ok());
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_TRUE(t.reshape({3, 2}).ok());
  EXPECT_FALSE(Tensor::alloc({int64_t{1} << 40, int64_t{1} << 40}, "test").ok());
}

TEST(ThreadPoolRobust, AWorkersExceptionReachesTheCaller) {
  ThreadPool pool(4);
  for (int victim : {0, 1, 3}) {  // the caller's share and two workers'
    std::atomic<int> ran{0};
    try {
      pool.run([&](int t, int) {
        ++ran;
        if (t == victim) throw std::runtime_error("share " + std::to_string(t));
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "share " + std::to_string(victim));
    }
    EXPECT_EQ(ran.load(), 4);  // every share finished before the rethrow
  }
  std::atomic<int> after{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { after += static_cast<int>(e - b); });
  EXPECT_EQ(after.load(), 100);  // still usable
}

// Jobs back to back (workers still spinning) and after pauses longer than the spin (workers
// asleep on the condition variable): every share runs exactly once per job either way.
TEST(ThreadPoolRobust, EveryShareRunsOnceWhetherWorkersSpinOrSleep) {
  ThreadPool pool(3);
  std::array<std::atomic<int>, 3> hits{};
  auto job = [&](int t, int n) {
    ASSERT_EQ(n, 3);
    hits[t].fetch_add(1);
  };
  for (int i = 0; i < 2000; ++i) pool.run(job);
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pool.run(job);
  }
  for (int t = 0; t < 3; ++t) EXPECT_EQ(hits[t].load(), 2020) << "share " << t;
}

// ---- configs

Result<Flux2Config> dit_config(const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(klein::testing::slurp_file(klein::testing::tiny_model_dir() / "transformer/config.json"));
  edit(j);
  return Flux2Config::from_json(j, "transformer/config.json");
}

TEST(ConfigRobust, TransformerSizesAreChecked) {
  EXPECT_TRUE(dit_config([](auto&) {}).ok());
  // Summing axes_dims_rope overflowed (UB) for entries near 2^62.
  auto r = dit_config([](auto& j) { j["axes_dims_rope"] = {int64_t{1} << 62, int64_t{1} << 62, 2, 2}; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("axes_dims_rope"), std::string::npos) << r.status().message();
  // inner_dim() = heads * head_dim overflowed.
  r = dit_config([](auto& j) { j["num_attention_heads"] = int64_t{1} << 40; j["attention_head_dim"] = int64_t{1} << 40; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("transformer/config.json"), std::string::npos);
  // int(inner_dim * 1e300) was an out-of-range double→int64 cast.
  r = dit_config([](auto& j) { j["mlp_ratio"] = 1e300; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mlp_ratio"), std::string::npos);
  r = dit_config([](auto& j) { j["num_layers"] = uint64_t{1} << 63; });  // wrapped negative before
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_layers"), std::string::npos);
}

TEST(ConfigRobust, Qwen3HeadProductIsChecked) {
  auto j = nlohmann::json::parse(klein::testing::slurp_file(klein::testing::tiny_model_dir() / "text_encoder/config.json"));
  j["num_attention_heads"] = int64_t{1} << 31;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = int64_t{1} << 31;
  auto r = Qwen3Config::from_json(j, "text_encoder/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_attention_heads x head_dim"), std::string::npos) << r.status().message();
}

// ---- safetensors

TEST(SafetensorsRobust, ATensorNamedTwiceIsAnError) {
  const fs::path d = make_temp_dir("st_dup");
  const std::string data(8, '\0');
  const std::string e = "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  klein::testing::st_write(d / "m.safetensors", "{\"w\":" + e + ",\"w\":" + e + "}", data);
  auto s = WeightStore::open(d / "m.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'w' is named twice"), std::string::npos) << s.status().message();
  fs::remove_all(d);
}

// ---- PNG text and atomic writes

TEST(PngRobust, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(repair_utf8("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(repair_utf8("caf\xe9!"), "caf\xef\xbf\xbd!");
  EXPECT_EQ(repair_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong '/'
  EXPECT_EQ(repair_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(repair_utf8("\xf0\x9f\x98"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // cut short
  const fs::path d = make_temp_dir("png_utf8");
  const std::vector<uint8_t> rgb(4 * 4 * 3, 128);
  ASSERT_TRUE(write_png(d / "a.png", 4, 4, rgb.data(), {{"prompt", "bad \xff byte"}}).ok());
  const std::string png = klein::testing::slurp_file(d / "a.png");
  EXPECT_NE(png.find("bad \xef\xbf\xbd byte"), std::string::npos);
  EXPECT_EQ(png.find("\xff byte"), std::string::npos);
  fs::remove_all(d);
}

std::vector<std::string> folder(const fs::path& d) {
  std::vector<std::string> r;
  for (const auto& e : fs::directory_iterator(d)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

TEST(AtomicFileRobust, FailureLeavesNothingAndTheTargetUntouched) {
  const fs::path d = make_temp_dir("atomic_fail");
  klein::testing::spit_file(d / "t.bin", "old");
  Status s = write_file_atomic(d / "t.bin", [](std::FILE* f) { return std::fputs("partial", f) >= 0 && false; });
  EXPECT_FALSE(s.ok());
  EXPECT_THROW(write_file_atomic(d / "t.bin", [](std::FILE*) -> bool { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_EQ(folder(d), std::vector<std::string>{"t.bin"});
  EXPECT_EQ(klein::testing::slurp_file(d / "t.bin"), "old");
  fs::remove_all(d);
}

TEST(AtomicFileRobust, ThreadsWritingOnePathNeverShareATempFile) {
  const fs::path d = make_temp_dir("atomic_threads");
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      const std::string body(100000, static_cast<char>('a' + t));
      for (int i = 0; i < 5; ++i)
        if (!write_file_atomic(d / "same.bin", [&](std::FILE* f) {
               return std::fwrite(body.data(), 1, body.size(), f) == body.size();
             }).ok())
          ++failures;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(folder(d), std::vector<std::string>{"same.bin"});
  const std::string got = klein::testing::slurp_file(d / "same.bin");
  ASSERT_EQ(got.size(), 100000u);
  EXPECT_EQ(got.find_first_not_of(got[0]), std::string::npos);  // one writer's whole content
  fs::remove_all(d);
}

}  // namespace
