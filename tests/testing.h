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

}  // namespace klein::testing
