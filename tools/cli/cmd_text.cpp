// `klein tokenize` and `klein encode`: the text side of the pipeline on its own.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"
#include "progress.h"

namespace klein::cli {

Command make_tokenize_command() {
  struct Opts {
    std::string model, text;
    bool templ = false;
    int max_length = 0;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("tokenize", "Print the token ids of TEXT as JSON {\"ids\":[...]}");
    s->add_option("--model", o->model, "Model folder (diffusers layout) or a folder with tokenizer.json")->required();
    s->add_flag("--template", o->templ, "Wrap TEXT in the klein chat template first");
    s->add_option("--max-length", o->max_length, "Truncate/pad to N tokens and also print \"mask\"")
        ->check(CLI::Range(1, 1 << 20));
    s->add_option("text", o->text, "Text to tokenize (use -- before text that starts with '-')")->required();
    return s;
  };
  c.run = [o]() -> int {
    auto model = Model::open_tokenizer(o->model);
    if (!model.ok()) return fail(model.status());
    auto t = (*model)->tokenize(o->text, o->templ, o->max_length);
    if (!t.ok()) return fail(t.status());
    nlohmann::json j;
    j["ids"] = t->ids;
    if (o->max_length > 0) j["mask"] = t->mask;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  };
  return c;
}

Command make_encode_command() {
  struct Opts {
    ModelArgs ma;
    LoraArgs lora;
    std::string prompt, prompt_file, out, dump, dump_filter, isa, precision = "fast", backend = "auto";
    int threads = 0, max_length = 512;
    double max_memory = 0;
    bool quiet = false, prompt_given = false;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("encode", "Encode a prompt to prompt_embeds [1, 512, 3*hidden] (.npy, float32)");
    o->ma.add(s, kModelFileHelp);
    o->lora.add(s);
    auto* prompt = s->add_option("--prompt,-p", o->prompt, "Prompt text (or --prompt-file)");
    prompt->each([o](const std::string&) { o->prompt_given = true; });
    s->add_option("--prompt-file", o->prompt_file, "Read the prompt from this UTF-8 text file ('-': stdin)")
        ->excludes(prompt);
    s->add_option("-o,--output", o->out, "Output .npy path")->required();
    s->add_option("--max-length", o->max_length, "Sequence length (klein: 512)")->check(CLI::Range(1, 1 << 16));
    s->add_option("--threads,-t", o->threads, "Worker threads (default: all cores)")->check(CLI::Range(0, 1024));
    s->add_option("--dump", o->dump, "Write named intermediate tensors (.npy) into this folder");
    s->add_option("--dump-filter", o->dump_filter, "Only dump names containing one of these comma-separated parts");
    s->add_option("--isa", o->isa, kIsaHelp);
    // The same numbers as generate's text encode under the same --precision (so its embeddings
    // can be given back with --prompt-embeds and give generate's own image).
    s->add_option("--precision", o->precision,
                  "fast (default): the CPU's dot-product kernels (as generate --precision fast: int8 W8A8 for "
                  "Q8_ROW weights, W4A8 for Q4_G64, int8 dot products per block for GGUF Q8_0 ... Q6_K as llama.cpp, "
                  "bf16 dot products for float weights on AMX or AVX512_BF16 where they beat float32), on CUDA bf16 "
                  "GEMMs; fp32: float32 arithmetic on the stored weights (exact; quantized weights dequantized)")
        ->check(CLI::IsMember({"fp32", "fast"}));
    s->add_option("--max-memory", o->max_memory,
                  "Memory budget in GiB (0 to 1000000): stream the text encoder block by block to stay under it, or fail at once "
                  "with what it needs. Default: no budget")
        ->check(CLI::Range(0.0, 1e6));
    s->add_option("--backend", o->backend, kBackendHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    s->add_flag("--quiet,-q", o->quiet, "No progress output");
    return s;
  };
  c.run = [o]() -> int {
    if (Status st = check_output_path("-o", o->out, {{"--prompt-file", o->prompt_file}}); !st.ok()) return fail(st);
    std::string prompt;
    if (Status st = resolve_prompt(o->prompt, o->prompt_given, o->prompt_file, &prompt); !st.ok()) return fail(st);
    LoadOptions lo;
    lo.threads = o->threads;
    lo.isa = o->isa;
    lo.precision = o->precision == "fast" ? Precision::kFast : Precision::kFp32;
    lo.max_memory_gib = o->max_memory;
    lo.backend = parse_backend(o->backend);
    o->ma.apply(lo);
    if (!o->ma.any()) return fail(ModelArgs::none_given("encode"));
    if (Status st = o->lora.apply(lo); !st.ok()) return fail(st);
    if (Status st = check_load_options_cli(lo); !st.ok()) return fail(st);
    auto model = Model::open(o->ma.model, lo);
    if (!model.ok()) return fail(model.status());
    print_notes((*model)->notes());
    if (!o->quiet) note_quantized_fp32(lo.precision, [&] { return (*model)->info(); });
    Progress progress(o->quiet);
    Callbacks cb;
    cb.progress = progress.callback();
    cb.log = print_log;
    EncodeOptions eo;
    eo.max_length = o->max_length;
    eo.dump = {o->dump, o->dump_filter};
    auto enc = (*model)->encode_prompt(prompt, eo, cb);
    progress.finish();
    if (!enc.ok()) return fail(enc.status());
    Status s = write_npy_f32(o->out, enc->shape, enc->data);
    if (!s.ok()) return fail(s);
    if (!o->quiet)
      std::fprintf(stderr, "wrote %s %s (%d real tokens)\n", o->out.c_str(), shape_text(enc->shape).c_str(),
                   enc->num_real_tokens);
    return 0;
  };
  return c;
}

}  // namespace klein::cli
