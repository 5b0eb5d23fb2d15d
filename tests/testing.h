// Shared helpers for the test suite: fixture paths, .npy comparison, running the CLI.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include "core/dtype.h"

namespace klein::testing {

// tests/data in the source tree.
std::filesystem::path data_dir();
// The tiny random-weight model (a diffusers folder) shipped in tests/data/tiny.
std::filesystem::path tiny_model_dir();
// The same as a string (what Model::open and the CLI take).
inline std::string tiny() { return tiny_model_dir().string(); }
// Makes random bytes valid blocks of the ggml block format `t`: every block's fp16 scale fields
// (core/format_gguf.h) become finite values in [0.001, 0.02), so dequantized weights are finite
// and small. Other formats are left alone.
void make_ggml_blocks_valid(DType t, void* data, size_t bytes, unsigned seed);
// A fresh empty temporary directory, removed at process exit is not guaranteed.
std::filesystem::path make_temp_dir(const std::string& tag);

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the built `klein` binary with the given argument string (shell-quoted by the caller).
// KLEIN_TEST_CLI=/path/to/klein runs another binary instead (checking a corpus against a baseline).
CliResult run_cli(const std::string& args);
// The same, run from the folder `cwd` (for relative paths in `args`).
CliResult run_cli(const std::string& args, const std::filesystem::path& cwd);

// The largest single request to the global operator new (vectors, strings, Tensors: every
// container the engine allocates pixels and activations in) while an instance is alive. The test
// binary replaces operator new to record it; one instance at a time, on the test's own thread.
// Asserts "nothing large was allocated" directly, where a time bound would only hint at it.
class LargestAllocation {
 public:
  LargestAllocation();
  ~LargestAllocation();
  LargestAllocation(const LargestAllocation&) = delete;
  LargestAllocation& operator=(const LargestAllocation&) = delete;
  size_t bytes() const;  // the largest request so far (0: none)
};

// Sanitizer builds, for tests whose bounds measure what a sanitizer changes. AddressSanitizer
// (KLEIN_SANITIZE): its allocator and shadow memory change what RSS counts. ThreadSanitizer
// (KLEIN_TSAN): every memory access is instrumented (time bounds do not hold) and its allocator
// clears what it hands out (RSS counts pages never written). GCC defines __SANITIZE_*__; clang
// answers __has_feature.
#if defined(__has_feature)
#define KLEIN_TESTING_HAS_FEATURE(x) __has_feature(x)
#else
#define KLEIN_TESTING_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || KLEIN_TESTING_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#if defined(__SANITIZE_THREAD__) || KLEIN_TESTING_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#undef KLEIN_TESTING_HAS_FEATURE

}  // namespace klein::testing
