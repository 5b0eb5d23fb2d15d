// `klein tokenize` and `klein encode`: the text side of the pipeline on its own.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "backend/cpu/cpu_backend.h"
#include "io/model_folder.h"
#include "io/npy.h"
#include "pipeline/prompt_encoder.h"
#include "pipeline/tokenizer.h"
#include "progress.h"

namespace fs = std::filesystem;

namespace klein::cli {

namespace {
// A pipeline folder has its tokenizer in tokenizer/; a tokenizer folder is used as it is.
fs::path tokenizer_dir_of(const fs::path& model) {
  std::error_code ec;
  if (fs::exists(model / "model_index.json", ec) && fs::is_directory(model / "tokenizer", ec))
    return model / "tokenizer";
  return model;
}
}  // namespace

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
    auto tok = Tokenizer::load(tokenizer_dir_of(o->model));
    if (!tok.ok()) return fail(tok.status());
    std::string text = o->templ ? Tokenizer::klein_template(o->text) : o->text;
    nlohmann::json j;
    if (o->max_length > 0) {
      auto p = tok->encode_padded(text, o->max_length);
      j["ids"] = p.ids;
      j["mask"] = p.mask;
    } else {
      j["ids"] = tok->encode(text);
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  };
  return c;
}

Command make_encode_command() {
  struct Opts {
    std::string model, prompt, out, dump, dump_filter;
    int threads = 0, max_length = kKleinMaxSequenceLength;
    bool quiet = false;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("encode", "Encode a prompt to prompt_embeds [1, 512, 3*hidden] (.npy, float32)");
    s->add_option("--model", o->model, "Model folder (diffusers layout, with model_index.json)")->required();
    s->add_option("--prompt,-p", o->prompt, "Prompt text")->required();
    s->add_option("-o,--output", o->out, "Output .npy path")->required();
    s->add_option("--max-length", o->max_length, "Sequence length (klein: 512)")->check(CLI::Range(1, 1 << 16));
    s->add_option("--threads,-t", o->threads, "Worker threads (default: all cores)")->check(CLI::Range(0, 1024));
    s->add_option("--dump", o->dump, "Write named intermediate tensors (.npy) into this folder");
    s->add_option("--dump-filter", o->dump_filter, "Only dump names containing one of these comma-separated parts");
    s->add_flag("--quiet,-q", o->quiet, "No progress output");
    return s;
  };
  c.run = [o]() -> int {
    auto model = ModelFolder::open(o->model);
    if (!model.ok()) return fail(model.status());
    CpuBackend pool(CpuBackendOptions{o->threads});
    Dumper dumper(o->dump, o->dump_filter);
    if (!dumper.status().ok()) return fail(dumper.status());
    Progress progress(o->quiet);
    RunContext ctx;
    ctx.backend = &pool;
    ctx.dumper = o->dump.empty() ? nullptr : &dumper;
    ctx.progress = progress.callback();
    auto enc = encode_prompt(*model, o->prompt, ctx, o->max_length);
    progress.finish();
    if (!enc.ok()) return fail(enc.status());
    if (!dumper.status().ok()) return fail(dumper.status());
    Status s = write_npy(o->out, enc->embeds);
    if (!s.ok()) return fail(s);
    if (!o->quiet)
      std::fprintf(stderr, "wrote %s %s (%d real tokens)\n", o->out.c_str(), shape_str(enc->embeds.shape()).c_str(),
                   enc->num_real_tokens);
    return 0;
  };
  return c;
}

}  // namespace klein::cli
