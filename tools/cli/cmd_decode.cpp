// `klein decode`: latents (.npy) -> PNG with the model's VAE alone. Decodes what `generate --dump`
// wrote (latents_stepN.npy: the latents after step N), and measures the VAE on its own (memory, tiles).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sys/resource.h>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"
#include "progress.h"

namespace fs = std::filesystem;

namespace klein::cli {

Command make_decode_command() {
  struct Opts {
    ModelArgs ma;
    std::string latents, out, isa, dump, dump_filter, precision = "fast";
    int threads = 0, vae_tile = 0;
    double max_memory = 0;
    bool quiet = false;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("decode", "Decode latents [1, 128, H/16, W/16] (.npy, e.g. from --dump) to a PNG with the VAE");
    o->ma.add(s, kModelFileHelp);
    s->add_option("--latents,-l", o->latents,
                  "Latents .npy [1, 128, H/16, W/16] in the transformer's normalised space (generate --dump: latents_stepN.npy of the last step N)")
        ->required();
    s->add_option("-o,--output", o->out, "Output PNG path")->required();
    s->add_option("--threads,-t", o->threads, "Worker threads (default: all cores)")->check(CLI::Range(0, 1024));
    s->add_option("--isa", o->isa, kIsaHelp);
    s->add_option("--precision", o->precision,
                  "fast (default): the dot-product kernels (bf16 convolutions and "
                  "attention on AMX tiles, or with AVX512_BF16 where it beats float32: not on Intel CPUs without AMX), "
                  "else the 3x3 convolutions in float32 Winograd form; fp32: exact float32 arithmetic")
        ->check(CLI::IsMember({"fp32", "fast"}));
    s->add_option("--vae-tile", o->vae_tile,
                  "Decode in seamless tiles of N image pixels (a multiple of 8; same image, less memory). "
                  "Default: automatic, tiles only very large images")
        ->check(CLI::Range(8, 8192));
    s->add_option("--max-memory", o->max_memory,
                  "Memory budget in GiB (0 to 1000000): tile the VAE to stay under it, or fail at once with what it needs")
        ->check(CLI::Range(0.0, 1e6));
    s->add_option("--dump", o->dump, "Write named intermediate tensors (.npy) into this folder");
    s->add_option("--dump-filter", o->dump_filter, "Only dump names containing one of these comma-separated parts");
    s->add_flag("--quiet,-q", o->quiet, "No progress output");
    return s;
  };
  c.run = [o]() -> int {
    std::string ext = fs::path(o->out).extension().string();
    for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (ext != ".png") return fail(invalid_argument("-o " + o->out + ": output must be a .png file"));
    if (Status st = check_output_path("-o", o->out, {{"--latents", o->latents}}); !st.ok()) return fail(st);
    const auto t0 = std::chrono::steady_clock::now();
    LoadOptions lo;
    lo.threads = o->threads;
    lo.isa = o->isa;
    lo.precision = o->precision == "fast" ? Precision::kFast : Precision::kFp32;
    lo.vae_tile = o->vae_tile;
    lo.max_memory_gib = o->max_memory;
    o->ma.apply(lo);
    if (!o->ma.any()) return fail(ModelArgs::none_given("decode"));
    if (Status st = check_load_options_cli(lo); !st.ok()) return fail(st);
    // The latents next: a bad file fails before the model is opened.
    auto arr = load_npy(o->latents);
    if (!arr.ok()) return fail(arr.status());
    auto model = Model::open(o->ma.model, lo);
    if (!model.ok()) return fail(model.status());
    print_notes((*model)->notes());
    Latents z;
    z.shape = std::move(arr->shape);
    z.data = std::move(arr->data);
    Progress progress(o->quiet);
    Callbacks cb;
    cb.progress = progress.callback();
    cb.log = print_log;
    auto img = (*model)->decode(z, cb, {o->dump, o->dump_filter});
    progress.finish();
    if (!img.ok()) {
      // The API calls the input "latents"; name the file instead.
      const std::string& m = img.status().message();
      if (m.starts_with("latents:")) return fail(Status(img.status().code(), o->latents + m.substr(7)));
      return fail(img.status());
    }
    Status s = save_png(o->out, *img, {{"latents", fs::path(o->latents).filename().string()}});
    if (!s.ok()) return fail(s);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o->quiet) std::fprintf(stderr, "wrote %s (%dx%d)\n", o->out.c_str(), img->width, img->height);
    std::fprintf(stderr, "peak RSS %.2f GiB, %.1f s\n", static_cast<double>(ru.ru_maxrss) / (1 << 20), sec);
    return 0;
  };
  return c;
}

}  // namespace klein::cli
