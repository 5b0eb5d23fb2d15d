#include "testing.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>
#include <vector>

#include "core/format.h"
#include "core/format_gguf.h"

namespace klein::testing {

std::filesystem::path data_dir() { return KLEIN_TEST_DATA; }

void make_ggml_blocks_valid(DType t, void* data, size_t bytes, unsigned seed) {
  int offs[2];
  const int n = ggml_rows::half_fields(t, offs);
  if (n == 0) return;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.001f, 0.02f);
  const size_t bb = static_cast<size_t>(format_traits(t).block_bytes);
  auto* p = static_cast<uint8_t*>(data);
  for (size_t b = 0; b + bb <= bytes; b += bb)
    for (int i = 0; i < n; ++i) {
      const uint16_t h = f32_to_f16(d(rng));
      std::memcpy(p + b + offs[i], &h, 2);
    }
}
std::filesystem::path tiny_model_dir() { return data_dir() / "tiny"; }

namespace {
// Every folder make_temp_dir made, removed when the test process exits (each ctest test is its own
// process), so tests that return early on a failed assertion leave nothing in /tmp either.
// KLEIN_TEST_KEEP=1 keeps them for debugging.
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    const char* keep = std::getenv("KLEIN_TEST_KEEP");
    if (keep && *keep && std::string(keep) != "0") return;
    for (const auto& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};
TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}
}  // namespace

std::filesystem::path make_temp_dir(const std::string& tag) {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path() /
              ("klein_test_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
  std::filesystem::create_directories(base);
  temp_dirs().dirs.push_back(base);
  return base;
}

static std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliResult run_cli(const std::string& args) { return run_cli(args, {}); }

CliResult run_cli(const std::string& args, const std::filesystem::path& cwd) {
  auto dir = make_temp_dir("cli");
  auto out = dir / "stdout", err = dir / "stderr";
  const char* cli = std::getenv("KLEIN_TEST_CLI");  // another build's binary (e.g. a baseline)
  std::string cmd = (cwd.empty() ? "" : "cd '" + cwd.string() + "' && ") + "'" + (cli && *cli ? cli : KLEIN_CLI_PATH) +
                    "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "' </dev/null";
  int rc = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace klein::testing

// LargestAllocation: operator new replaced for the whole test binary. Plain malloc/free underneath,
// so the sanitizers still see (and check) every block; only the size of each request is noted.
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

namespace klein::testing {
LargestAllocation::LargestAllocation() {
  g_largest_allocation.store(0);
  g_track_allocations.store(true);
}
LargestAllocation::~LargestAllocation() { g_track_allocations.store(false); }
size_t LargestAllocation::bytes() const { return g_largest_allocation.load(); }
}  // namespace klein::testing

void* operator new(std::size_t n) {
  if (g_track_allocations.load(std::memory_order_relaxed)) {
    size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
    while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// Every unaligned form, nothrow ones included: a block from one form may be freed by another
// (std::get_temporary_buffer: nothrow new, plain delete), and ASan checks that both are the same
// allocator's. The aligned forms stay the runtime's, on both sides.
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return ::operator new(n, std::nothrow); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
