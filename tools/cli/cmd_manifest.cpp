// `klein manifest`: SHA-256 and size of every file a model load reads, with what klein detected
// in them (klein::make_manifest); with --verify, checks a model against such a manifest instead.
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"

namespace klein::cli {

Command make_manifest_command() {
  struct Opts {
    ModelArgs ma;
    std::string output;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand(
        "manifest",
        "Write a manifest of a model's files (SHA-256, sizes, detected layout, variant and formats) for --verify; with "
        "--verify MANIFEST, check the model against one and exit 1 on any difference");
    o->ma.add(s, kModelFileHelp);
    s->add_option("-o,--output", o->output, "Manifest file to write (default: standard output)");
    s->add_option("--threads,-t", o->threads, "Files hashed at once (default: one per core)")->check(CLI::Range(0, 1024));
    return s;
  };
  c.run = [o]() -> int {
    if (!o->ma.any()) return fail(ModelArgs::none_given("manifest"));
    LoadOptions lo;
    o->ma.apply(lo);
    lo.threads = o->threads;
    const auto t0 = std::chrono::steady_clock::now();
    if (!lo.verify_manifest.empty()) {
      if (!o->output.empty()) return fail(invalid_argument("manifest: -o and --verify exclude each other"));
      const std::string manifest = lo.verify_manifest;
      lo.verify_manifest.clear();
      if (Status st = verify_manifest(manifest, o->ma.model, lo); !st.ok()) return fail(st);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "verified against %s in %.1f s\n", manifest.c_str(), s);
      return 0;
    }
    if (o->output.empty()) {
      auto text = make_manifest(o->ma.model, lo);
      if (!text.ok()) return fail(text.status());
      std::fwrite(text->data(), 1, text->size(), stdout);
      return 0;
    }
    if (Status st = write_manifest(o->ma.model, lo, o->output); !st.ok()) return fail(st);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "wrote %s in %.1f s\n", o->output.c_str(), s);
    return 0;
  };
  return c;
}

}  // namespace klein::cli
