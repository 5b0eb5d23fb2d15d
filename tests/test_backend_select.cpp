// Choosing what runs the models: LoadOptions::backend / klein_load_params.backend / --backend.
// These run in every build and need no GPU: `cuda` must fail at open with one clear line where
// it cannot run (a build without the backend, or no device), `auto` must then fall back to the
// CPU, and `cpu` is the CPU. In a -DKLEIN_CUDA=ON build ctest runs these with the GPU hidden
// (CUDA_VISIBLE_DEVICES empty, tests/CMakeLists.txt), so they check the no-device path there
// too; the CUDA tests proper are test_cuda_*.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "klein/klein.h"
#include "klein/klein_c.h"
#include "testing.h"
#ifdef KLEIN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace fs = std::filesystem;

namespace {

using klein::testing::tiny;

bool cuda_device_present() {
#ifdef KLEIN_HAS_CUDA
  return klein::cuda_device_count().ok();
#else
  return false;
#endif
}

// What opening with backend = cuda says where it cannot run: the message names the option, and
// says why.
std::string expected_cuda_failure() {
#ifdef KLEIN_HAS_CUDA
  return "--backend cuda: no CUDA device found (cudaGetDeviceCount: ";
#else
  return "--backend cuda: this build has no CUDA backend (configure with -DKLEIN_CUDA=ON)";
#endif
}

}  // namespace

TEST(BackendSelection, CpuAndAutoRunOnTheCpuWithoutADevice) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is visible: auto picks it (test_cuda_end_to_end.cpp)";
  for (auto kind : {klein::BackendKind::kCpu, klein::BackendKind::kAuto}) {
    klein::LoadOptions o;
    o.threads = 2;
    o.backend = kind;
    auto m = klein::Model::open(tiny(), o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ((*m)->backend_name(), "cpu");
  }
  klein::LoadOptions o;
  EXPECT_EQ(o.backend, klein::BackendKind::kAuto);  // the default
}

TEST(BackendSelection, CudaWithoutABackendOrDeviceFailsWithOneClearLine) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is visible";
  klein::LoadOptions o;
  o.backend = klein::BackendKind::kCuda;
  auto m = klein::Model::open(tiny(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), klein::Code::kUnsupported);
  const std::string msg = m.status().message();
  EXPECT_EQ(msg.rfind(expected_cuda_failure(), 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
#ifdef KLEIN_HAS_CUDA
  EXPECT_EQ(msg.back(), ')') << msg;  // the runtime's reason, closed
#endif
}

TEST(BackendSelection, CudaWithAMemoryBudgetIsRefusedAndAutoKeepsTheCpu) {
  klein::LoadOptions o;
  o.threads = 2;
  o.max_memory_gib = 64;
  o.backend = klein::BackendKind::kCuda;
  auto m = klein::Model::open(tiny(), o);
  ASSERT_FALSE(m.ok());
#ifdef KLEIN_HAS_CUDA
  // The budget plans host memory; the GPU would ignore it, so asking for both is an error.
  EXPECT_NE(m.status().message().find("--max-memory budgets host memory"), std::string::npos) << m.status().to_string();
#else
  EXPECT_EQ(m.status().message(), expected_cuda_failure());
#endif
  o.backend = klein::BackendKind::kAuto;
  auto a = klein::Model::open(tiny(), o);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ((*a)->backend_name(), "cpu");
}

TEST(BackendSelection, UnknownValuesAreInvalidArguments) {
  klein::LoadOptions o;
  o.backend = static_cast<klein::BackendKind>(7);
  auto m = klein::Model::open(tiny(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), klein::Code::kInvalidArgument);
  EXPECT_NE(m.status().message().find("backend"), std::string::npos);

  klein_load_params lp = klein_load_default_params();
  EXPECT_EQ(lp.backend, KLEIN_BACKEND_AUTO);
  lp.backend = 9;
  klein_model* model = nullptr;
  klein_error err;
  EXPECT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_INVALID_ARGUMENT);
  EXPECT_EQ(model, nullptr);
  EXPECT_NE(std::string(err.message).find("KLEIN_BACKEND_CUDA"), std::string::npos) << err.message;
}

TEST(BackendSelection, CApiReportsTheSameLine) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is visible";
  klein_load_params lp = klein_load_default_params();
  lp.backend = KLEIN_BACKEND_CUDA;
  klein_model* model = nullptr;
  klein_error err;
  EXPECT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_UNSUPPORTED);
  EXPECT_EQ(model, nullptr);
  EXPECT_EQ(std::string(err.message).rfind(expected_cuda_failure(), 0), 0u) << err.message;
  lp.backend = KLEIN_BACKEND_CPU;
  lp.threads = 2;
  ASSERT_EQ(klein_model_open(tiny().c_str(), &lp, &model, &err), KLEIN_OK) << err.message;
  klein_model_free(model);
}

TEST(BackendSelection, CliBackendOption) {
  auto dir = klein::testing::make_temp_dir("cli_backend");
  const std::string out = (dir / "o.png").string();
  if (!cuda_device_present()) {
    for (const char* cmd : {"generate", "encode"}) {
      const std::string args = std::string(cmd) + " --model '" + tiny() + "' --prompt x -q --backend cuda -o '" +
                               (std::string(cmd) == "generate" ? out : (dir / "e.npy").string()) + "'";
      auto r = klein::testing::run_cli(args);
      EXPECT_NE(r.exit_code, 0) << args;
      EXPECT_LT(r.exit_code, 128) << "crashed: " << args;
      EXPECT_NE(r.err.find(expected_cuda_failure()), std::string::npos) << args << "\nstderr: " << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    EXPECT_FALSE(fs::exists(out));
  }
  auto bad = klein::testing::run_cli("generate --model '" + tiny() + "' --prompt x -q --backend tpu -o '" + out + "'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--backend"), std::string::npos) << bad.err;
  // cpu: the ordinary run.
  auto ok = klein::testing::run_cli("generate --model '" + tiny() + "' --prompt x -q --backend cpu -W 32 -H 32 --steps 1 "
                                    "--threads 2 -o '" + out + "'");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(out));
  fs::remove_all(dir);
}
