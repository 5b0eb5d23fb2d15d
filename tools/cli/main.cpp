// klein: command-line front end. Subcommands live in cmd_*.cpp; each registers itself here.
#include <CLI/CLI.hpp>
#include <cstdio>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <algorithm>
#include <iostream>
#include <optional>
#include <utility>
#include <string>
#include <vector>

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

namespace {

// Optimal string alignment distance: an insertion, deletion, substitution or swap of two
// neighbours costs 1 ("genrate" and "gneerate" are both 1 from "generate").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// "; did you mean 'X'?" for the name nearest to `word`, when it is near enough to be a typo of it
// (at most a third of the word's letters differ, so "-x" is near no short option), else "".
std::string suggestion(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = word.size() / 3 + 1;
  for (const auto& n : names)
    if (const size_t d = edit_distance(word, n); d < best_d) best = n, best_d = d;
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

// The message: the suggestion, or where to look when there is none.
std::string unknown_message(const std::string& what, const std::string& hint, const std::string& help) {
  return what + (hint.empty() ? " (see " + help + ")" : hint);
}

// After a failed parse: the first argument no command or option took, as "unknown command" or
// "unknown option" with the nearest valid name. CLI11 keeps such arguments in remaining() even
// when it reports another error first (a required -o), which for a typo is the wrong message.
std::optional<std::string> unknown_argument(const CLI::App& app) {
  const auto all = [](const CLI::App*) { return true; };
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands(all))
    if (s->parsed()) sub = s;
  // CLI11 keeps an unknown option with the command being parsed when it came: before the
  // subcommand in app's list, after it in the subcommand's.
  std::vector<std::pair<const CLI::App*, std::string>> left;
  for (const auto& a : app.remaining()) left.emplace_back(&app, a);
  if (sub)
    for (const auto& a : sub->remaining()) left.emplace_back(sub, a);
  for (const auto& [owner, arg] : left) {
    if (!sub && !arg.starts_with("-")) {
      std::vector<std::string> names;
      for (const CLI::App* s : app.get_subcommands(all)) names.push_back(s->get_name());
      return unknown_message("unknown command '" + arg + "'", suggestion(arg, names), "klein --help");
    }
    if (arg.size() < 2 || !arg.starts_with("-")) continue;  // a stray value: CLI11's own message
    std::vector<std::string> names;
    for (const CLI::Option* opt : owner->get_options([](const CLI::Option* o) { return !o->get_group().empty(); })) {
      for (const auto& n : opt->get_lnames()) names.push_back("--" + n);
      for (const auto& n : opt->get_snames()) names.push_back("-" + n);
    }
    const std::string name = arg.substr(0, arg.find('='));
    if (owner == &app) return unknown_message("unknown option '" + name + "'", suggestion(name, names), "klein --help");
    return unknown_message("unknown option '" + name + "' for '" + owner->get_name() + "'", suggestion(name, names),
                           "klein " + owner->get_name() + " --help");
  }
  return std::nullopt;
}

}  // namespace

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
    if (auto m = klein::cli::unknown_argument(app)) {
      std::fprintf(stderr, "klein: invalid argument: %s\n", m->c_str());
      return 2;
    }
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
