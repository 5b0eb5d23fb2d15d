// `klein quantize`: a model folder rewritten with q8 / q4 / bf16 weights (klein::quantize_model).
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"
#include "progress.h"

namespace klein::cli {

Command make_quantize_command() {
  struct Opts {
    QuantizeOptions q;
    ModelArgs ma;
    bool quiet = false;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("quantize", "Write a model (a folder or single files) as a diffusers folder with q8, "
                                             "q4 or bf16 weights, or its transformer as a GGUF file");
    o->ma.add(s, kModelFileHelp);
    s->add_option("--type", o->q.type,
                  "q8: int8 per output row (W8A8 under --precision fast); q4: MLX affine int4, group 64; bf16; "
                  "gguf:Q8_0|Q4_0|Q4_1|Q5_0|Q5_1|Q2_K|Q3_K|Q4_K|Q5_K|Q6_K|F16|BF16|F32: the transformer alone as one "
                  "GGUF file (-o FILE.gguf), ggml's reference quantizers")
        ->required();
    s->add_option("--flavor", o->q.flavor,
                  "gguf only: comfy (ComfyUI-GGUF: BFL names, general.architecture flux, its unquantized layers; "
                  "default) or sdcpp (stable-diffusion.cpp: model.diffusion_model. names, no metadata)");
    s->add_option("--keep", o->q.keep,
                  "Also keep these tensors as stored (name globs, repeatable; '*' matches dots too)");
    s->add_option("-o,--output", o->q.output, "Output folder, or .gguf file for gguf types (must not exist)")->required();
    s->add_option("--threads,-t", o->q.threads, "Worker threads (default: all cores)")->check(CLI::Range(0, 1024));
    s->add_flag("--quiet,-q", o->quiet, "No progress output");
    return s;
  };
  c.run = [o]() -> int {
    if (!o->ma.any()) return fail(ModelArgs::none_given("quantize"));
    LoadOptions lo;
    o->ma.apply(lo);
    o->q.model = o->ma.model;
    o->q.diffusion_model = lo.diffusion_model;
    o->q.text_encoder = lo.text_encoder;
    o->q.vae = lo.vae;
    o->q.variant = lo.variant;
    o->q.verify_manifest = lo.verify_manifest;
    // A bar on a terminal, each component's end as a line otherwise (as generate's progress).
    Progress progress(o->quiet);
    Callbacks cb;
    if (!o->quiet) {
      cb.progress = progress.callback();
      cb.log = [&progress](const std::string& m) {
        progress.finish();  // the component's summary goes on a line of its own
        std::fprintf(stderr, "%s\n", m.c_str());
      };
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status st = quantize_model(o->q, cb);
    progress.finish();
    if (!st.ok()) return fail(st);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o->quiet) std::fprintf(stderr, "wrote %s (%s) in %.1f s\n", o->q.output.c_str(), o->q.type.c_str(), s);
    return 0;
  };
  return c;
}

}  // namespace klein::cli
