// Subcommand registry of the `klein` tool: each cmd_*.cpp contributes a Command.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <vector>

namespace klein::cli {

struct Command {
  CLI::App* sub = nullptr;
  std::function<CLI::App*(CLI::App&)> attach_fn;  // adds the subcommand
  std::function<int()> run;
  void attach(CLI::App& app) { sub = attach_fn(app); }
};

std::vector<Command> all_commands();

}  // namespace klein::cli

namespace klein::cli {
Command make_tokenize_command();
Command make_encode_command();
Command make_info_command();
Command make_generate_command();
Command make_serve_command();  // tools/server/cmd_serve.cpp
Command make_quantize_command();
Command make_compare_command();
Command make_decode_command();
Command make_manifest_command();
}  // namespace klein::cli
