// klein: command-line front end. Subcommands live in cmd_*.cpp; each registers itself here.
#include <CLI/CLI.hpp>
#include <cstdio>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <iostream>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"

namespace klein::cli {

void print_log(const std::string& m) {
  std::fprintf(stderr, "%s%s\n", m.starts_with("memory plan:") ? "" : "warning: ", m.c_str());
}

int fail(const Status& s) {
  std::fprintf(stderr, "klein: %s\n", s.to_string().c_str());
  switch (s.code()) {
    case Code::kInvalidArgument: return 2;
    case Code::kCancelled: return 130;
    default: return 1;
  }
}

}  // namespace klein::cli

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // This process's allocator (the library leaves its host's alone): blocks under 48 MiB from the
  // heap, and up to 256 MiB of freed heap kept instead of returned after each op. By default
  // glibc maps every block of 32 MiB or more afresh and trims the heap early, so the VAE's 256²
  // activations (32 MiB a tensor) were faulted in anew for every conv — ~9 % of a reference
  // encode under perf (0.27-0.30 → 0.24 s, peak RSS +0.01 GiB). Larger blocks stay fresh mappings,
  // whose pages a step never writes (the fused SwiGLU's scratch) never become resident.
  mallopt(M_MMAP_THRESHOLD, 48 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
  CLI::App app{"klein.cpp — FLUX.2 [klein] inference engine (text-to-image and editing)", "klein"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("klein.cpp ") + klein::version());
  std::vector<klein::cli::Command> cmds = klein::cli::all_commands();
  for (auto& c : cmds) c.attach(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "klein: invalid argument: %s (see --help)\n", e.what());
    return 2;
  }
  for (auto& c : cmds)
    if (c.sub && c.sub->parsed()) {
      try {
        return c.run();
      } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "klein: out of memory\n");
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "klein: internal error: %s\n", e.what());
        return 1;
      }
    }
  return 2;
}
