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

// A ThreadSanitizer build (KLEIN_TSAN): every memory access is instrumented (time bounds do not
// hold) and its allocator clears what it hands out (so RSS counts pages never written).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

}  // namespace klein::testing
