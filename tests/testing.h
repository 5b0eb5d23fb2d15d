// Shared helpers for the test suite: fixture paths, .npy comparison, running the CLI.
#pragma once

#include <filesystem>
#include <string>

namespace klein::testing {

// tests/data in the source tree.
std::filesystem::path data_dir();
// The tiny random-weight model (a diffusers folder) shipped in tests/data/tiny.
std::filesystem::path tiny_model_dir();
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
