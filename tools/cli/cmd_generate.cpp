// `klein generate`: prompt -> PNG.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/resource.h>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"
#include "progress.h"

namespace fs = std::filesystem;

namespace klein::cli {

Command make_generate_command() {
  struct Opts {
    ModelArgs ma;
    LoraArgs lora;
    std::string prompt, prompt_file, prompt_embeds, out, preview, noise, noise_dtype = "f32", dump, dump_filter,
        memory = "low", isa, precision = "fast", seed = "0", backend = "auto", negative_prompt, seeds, image, mask, sigmas;
    std::vector<std::string> refs;
    int width = 0, height = 0, steps = 0, threads = 0, vae_tile = 0, batch = 1;
    double max_memory = 0, guidance = -1, strength = -1, shift = 0;
    bool quiet = false, prompt_given = false;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("generate", "Generate an image from a prompt (PNG)");
    o->ma.add(s, kModelHelp);
    o->lora.add(s);
    auto* prompt = s->add_option("--prompt,-p", o->prompt, "Prompt text (or --prompt-file)");
    auto* pfile = s->add_option("--prompt-file", o->prompt_file, "Read the prompt from this UTF-8 text file ('-': stdin)")
                      ->excludes(prompt);
    s->add_option("--prompt-embeds", o->prompt_embeds,
                  "Use these prompt embeddings [1, T, 3*hidden] (.npy, e.g. from `klein encode` or --dump's "
                  "prompt_embeds.npy) instead of encoding a prompt")
        ->excludes(prompt)
        ->excludes(pfile);
    s->add_option("-o,--output", o->out, "Output PNG path")->required();
    s->add_option("--width,-W", o->width, "Image width in pixels (default: the first reference's, else the model's native size: its VAE config's sample_size, 1024 for FLUX.2 files, 128 for the demo model; floored to a multiple of 16)")
        ->check(CLI::Range(16, 8192));
    s->add_option("--height,-H", o->height, "Image height in pixels (default: the first reference's, else the model's native size, as --width; floored to a multiple of 16)")
        ->check(CLI::Range(16, 8192));
    s->add_option("--steps", o->steps, "Denoising steps (default: 4 for distilled models, 50 for base models)")
        ->check(CLI::Range(1, 1000));
    s->add_option("--sigmas", o->sigmas,
                  "Custom sigmas, comma-separated values in [0, 1] (e.g. 1,0.75,0.5,0.25): the schedule diffusers' "
                  "sigmas= gives, shifted by the scheduler; one step each (--steps, if given, must be their count)");
    s->add_option("--shift", o->shift,
                  "A static timestep shift S > 0 (shift*t / (1 + (S-1)*t), the scheduler with use_dynamic_shifting "
                  "false) in place of FLUX.2's resolution-dependent one")
        ->check(CLI::Range(0.0, 1000.0));
    s->add_option("--guidance-scale,-g", o->guidance,
                  "Classifier-free guidance scale for base models (default 4.0, with --image 8.0; guidance runs above 1: two transformer "
                  "calls per step). Distilled models ignore it, with a note")
        ->check(CLI::Range(0.0, 100.0));
    s->add_option("--negative-prompt", o->negative_prompt,
                  "The negative (unconditional) prompt of guidance on base models (default: \"\", as diffusers)");
    // A string: the CLI checks the range itself (parse_seed), CLI11 would wrap "-1".
    auto* seed = s->add_option("--seed,-s", o->seed,
                               "Seed of torch.Generator('cpu') for the initial noise, 0..2^64-1 (default 0)");
    auto* noise = s->add_option("--noise", o->noise, "Initial noise (1,128,H/16,W/16) from a .npy instead of --seed")
                      ->excludes(seed);
    auto* batch = s->add_option("--batch,-n", o->batch,
                                "Images to make, seeds --seed, --seed+1, ...: the prompt and references are encoded once; "
                                "with more than one, -o OUT.png writes OUT-SEED.png per image")
                      ->check(CLI::Range(1, 64))
                      ->excludes(noise);
    s->add_option("--seeds", o->seeds,
                  "Comma-separated seeds, one image each (as --batch; e.g. 1,2,7): -o OUT.png writes OUT-SEED.png")
        ->excludes(seed)
        ->excludes(noise)
        ->excludes(batch);
    s->add_option("--noise-dtype", o->noise_dtype,
                  "Draw the seeded noise as a float32 (f32, default) or bfloat16 (bf16) diffusers pipeline does")
        ->check(CLI::IsMember({"f32", "bf16"}));
    s->add_option("--ref", o->refs, "Reference image for editing: PNG/JPEG/WebP (repeatable; the first sets the default size)");
    auto* image = s->add_option("--image", o->image,
                                "Inpainting / image-to-image source (PNG/JPEG/WebP), as diffusers' Flux2KleinInpaintPipeline: "
                                "the output takes its size (multiples of 16, at most about 1024x1024) and it conditions "
                                "every step as the first reference (--ref images follow it)");
    s->add_option("--mask", o->mask,
                  "Inpainting mask for --image: white = repaint, black = keep (grey binarised at 50%; resized to the "
                  "image's size). Without it, image-to-image: everything repainted from the noised source")
        ->needs(image);
    s->add_option("--strength", o->strength,
                  "With --image: how far from the source, in (0, 1]: of the schedule's N steps, those from "
                  "int(N - N*strength) on run (diffusers' get_timesteps); 1 starts from pure noise. Default 0.8; on "
                  "base models the default guidance scale is then 8.0, as the inpainting pipeline's")
        ->needs(image);
    s->add_option("--threads,-t", o->threads, "Worker threads (default: all cores)")->check(CLI::Range(0, 1024));
    s->add_option("--dump", o->dump, "Write named intermediate tensors (.npy) into this folder");
    s->add_option("--dump-filter", o->dump_filter, "Only dump names containing one of these comma-separated parts");
    s->add_option("--memory", o->memory,
                  "low: one component in memory at a time (default); resident: keep all loaded")
        ->check(CLI::IsMember({"low", "resident"}));
    s->add_option("--isa", o->isa, kIsaHelp);
    s->add_option("--vae-tile", o->vae_tile,
                  "Decode/encode with the VAE in seamless tiles of N image pixels (a multiple of 8; same image, less "
                  "memory). Default: automatic, tiles only very large images")
        ->check(CLI::Range(8, 8192));
    s->add_option("--max-memory", o->max_memory,
                  "Memory budget in GiB (0 to 1000000): plan the run to stay under it (stream the text encoder and transformer "
                  "block by block, tile the VAE), or fail at once with what it needs. Default: no budget")
        ->check(CLI::Range(0.0, 1e6));
    s->add_option("--preview", o->preview,
                  "Rewrite this PNG (atomically) after every denoising step with a live preview of the image");
    s->add_option("--precision", o->precision,
                  "fast (default): the CPU's dot-product kernels (bf16 GEMMs, convolutions and attention on AMX "
                  "tiles, or with AVX512_BF16 where it beats float32: not on Intel CPUs without AMX; int8 W8A8 for "
                  "Q8_ROW weights, W4A8 for Q4_G64, int8 dot products per block for GGUF Q8_0 ... Q6_K as llama.cpp; "
                  "without bf16 convolutions the VAE's 3x3 ones in float32 Winograd form), on CUDA bf16 GEMMs; fp32: "
                  "float32 arithmetic on the stored weights (exact: diffusers' float32 pipeline; quantized weights "
                  "dequantized)")
        ->check(CLI::IsMember({"fp32", "fast"}));
    s->add_option("--backend", o->backend, kBackendHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    s->add_flag("--quiet,-q", o->quiet, "No progress output");
    prompt->each([o](const std::string&) { o->prompt_given = true; });
    return s;
  };
  c.run = [o]() -> int {
    const fs::path out(o->out);
    std::string ext = out.extension().string();
    for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (ext != ".png") return fail(invalid_argument("-o " + o->out + ": output must be a .png file"));
    std::vector<std::pair<std::string, std::string>> inputs = {
        {"--noise", o->noise}, {"--prompt-file", o->prompt_file}, {"--prompt-embeds", o->prompt_embeds}};
    for (const auto& r : o->refs) inputs.emplace_back("--ref", r);
    if (!o->image.empty()) inputs.emplace_back("--image", o->image);
    if (!o->mask.empty()) inputs.emplace_back("--mask", o->mask);
    if (!o->image.empty() && o->strength >= 0 && !(o->strength > 0 && o->strength <= 1)) {
      char v[32];
      std::snprintf(v, sizeof v, "%g", o->strength);
      return fail(invalid_argument(std::string("--strength ") + v + ": must be in (0, 1]"));
    }
    if (Status st = check_output_path("-o", o->out, inputs); !st.ok()) return fail(st);
    uint64_t seed = 0;
    if (Status st = parse_seed(o->seed, &seed); !st.ok()) return fail(st);
    // The images' seeds: --seeds, or --batch N from --seed.
    std::vector<uint64_t> seeds;
    if (!o->seeds.empty()) {
      size_t at = 0;
      while (at <= o->seeds.size()) {
        const size_t comma = std::min(o->seeds.find(',', at), o->seeds.size());
        uint64_t v = 0;
        if (Status st = parse_seed(o->seeds.substr(at, comma - at), &v); !st.ok())
          return fail(invalid_argument("--seeds " + o->seeds + ": " + st.message().substr(st.message().find(':') + 2)));
        if (std::find(seeds.begin(), seeds.end(), v) != seeds.end())
          return fail(invalid_argument("--seeds " + o->seeds + ": seed " + std::to_string(v) + " is given twice"));
        seeds.push_back(v);
        at = comma + 1;
      }
      if (seeds.size() > 64) return fail(invalid_argument("--seeds: at most 64 seeds"));
    } else {
      for (int i = 0; i < o->batch; ++i) {
        if (seed + static_cast<uint64_t>(i) < seed) return fail(invalid_argument("--batch: --seed + N overflows"));
        seeds.push_back(seed + static_cast<uint64_t>(i));
      }
    }
    // One output per seed: OUT.png for one image, OUT-SEED.png for several.
    std::vector<std::string> outs;
    for (uint64_t v : seeds)
      outs.push_back(seeds.size() == 1 ? o->out
                                       : (out.parent_path() / (out.stem().string() + "-" + std::to_string(v) +
                                                               out.extension().string())).string());
    if (outs.size() > 1)
      for (const std::string& path : outs)
        if (Status st = check_output_path("-o", path, inputs); !st.ok()) return fail(st);
    std::string prompt;
    if (o->prompt_embeds.empty())
      if (Status st = resolve_prompt(o->prompt, o->prompt_given, o->prompt_file, &prompt); !st.ok()) return fail(st);

    if (!o->preview.empty()) {
      const fs::path pv(o->preview);
      std::string pext = pv.extension().string();
      for (auto& ch : pext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (pext != ".png") return fail(invalid_argument("--preview " + o->preview + ": must be a .png file"));
      auto others = inputs;
      others.emplace_back("-o", o->out);
      if (Status st = check_output_path("--preview", o->preview, others); !st.ok()) return fail(st);
    }

    const std::string model_dir = o->ma.path(/*default_tiny=*/true);
    if (!o->ma.any() && !o->quiet)
      std::fprintf(stderr, "note: no --model given; using the tiny random-weight test model (%s): the image is noise\n",
                   model_dir.c_str());
    LoadOptions lo;
    lo.threads = o->threads;
    lo.memory = o->memory == "resident" ? MemoryPolicy::kResident : MemoryPolicy::kLow;
    lo.isa = o->isa;
    lo.vae_tile = o->vae_tile;
    lo.max_memory_gib = o->max_memory;
    lo.precision = o->precision == "fast" ? Precision::kFast : Precision::kFp32;
    lo.backend = parse_backend(o->backend);
    o->ma.apply(lo);
    if (Status st = o->lora.apply(lo); !st.ok()) return fail(st);
    if (Status st = check_load_options_cli(lo); !st.ok()) return fail(st);
    GenerateRequest g;
    g.prompt = prompt;
    g.width = o->width;
    g.height = o->height;
    g.steps = o->steps;
    g.seed = seeds[0];
    g.guidance_scale = o->guidance;
    g.negative_prompt = o->negative_prompt;
    g.noise_npy = o->noise;
    g.prompt_embeds_npy = o->prompt_embeds;
    g.bf16_noise = o->noise_dtype == "bf16";
    g.reference_images = o->refs;
    if (!o->sigmas.empty()) {
      size_t at = 0;
      while (at <= o->sigmas.size()) {
        const size_t comma = std::min(o->sigmas.find(',', at), o->sigmas.size());
        const std::string t = o->sigmas.substr(at, comma - at);
        char* end = nullptr;
        const double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
        if (t.empty() || end != t.c_str() + t.size())
          return fail(invalid_argument("--sigmas " + o->sigmas + ": \"" + t + "\" is not a number"));
        g.sigmas.push_back(v);
        at = comma + 1;
      }
    }
    g.shift = o->shift;
    g.init_image.path = o->image;
    g.init_image.mask_path = o->mask;
    g.init_image.strength = o->strength;
    g.dump = {o->dump, o->dump_filter};
    Progress progress(o->quiet);
    Callbacks cb;
    cb.progress = progress.callback();
    cb.log = print_log;
    if (!o->preview.empty()) {
      // save_png writes a temporary file and renames it, so a viewer never sees a partial file.
      cb.preview = [o](int step, int total, const Image& img) {
        Status st = save_png(o->preview, img, {{"preview step", std::to_string(step) + "/" + std::to_string(total)}});
        if (!st.ok()) std::fprintf(stderr, "warning: preview: %s\n", st.to_string().c_str());
      };
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto model = Model::open(model_dir, lo);
    if (!model.ok()) {
      progress.finish();
      return fail(model.status());
    }
    print_notes((*model)->notes());
    if (!o->quiet) note_quantized_fp32(lo.precision, [&] { return (*model)->info(); });
    auto r = (*model)->generate_batch(g, seeds, cb);
    progress.finish();
    if (!r.ok()) return fail(r.status());
    for (size_t i = 0; i < r->size(); ++i) {
      Status s = save_png(outs[i], (*r)[i].image, (*r)[i].metadata);
      if (!s.ok()) return fail(s);
    }
    if (!o->quiet) {
      for (const auto& [phase, sec] : progress.phase_times()) std::fprintf(stderr, "  %-18s %8.2f s\n", phase.c_str(), sec);
      std::fprintf(stderr, "  %-18s %8.2f s\n", "total",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      for (size_t i = 0; i < r->size(); ++i)
        std::fprintf(stderr, "wrote %s (%dx%d, %d steps)\n", outs[i].c_str(), (*r)[i].width, (*r)[i].height,
                     (*r)[i].steps);
    }
    // Always (even --quiet): what the run cost, for memory budgets and benchmarks.
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::fprintf(stderr, "peak RSS %.2f GiB, %.1f s\n", static_cast<double>(ru.ru_maxrss) / (1 << 20),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
  };
  return c;
}

}  // namespace klein::cli
