// `klein serve`: registers the server as a subcommand of the `klein` tool.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"
#include "server.h"

namespace klein::cli {

Command make_serve_command() {
  struct Opts {
    ModelArgs ma;
    LoraArgs lora;
    std::string memory = "resident", isa, precision = "fast", backend = "auto";
    int threads = 0, vae_tile = 0, max_body_mib = 32, load_delay_ms = 0, keep_results_mib = 256;
    double max_memory_gib = 0;
    server::ServerOptions s;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("serve", "Serve the model over HTTP: OpenAI Images API, job events, a web page at /");
    o->ma.add(s, kModelHelp);
    o->lora.add(s);
    s->add_option("--host", o->s.host, "Address to listen on (default 127.0.0.1: this machine only)");
    s->add_option("--port", o->s.port, "TCP port (default 8080; 0: any free port, printed)")->check(CLI::Range(0, 65535));
    s->add_option("--max-queue", o->s.queue.max_queue, "Jobs waiting behind the running one before 429 (default 16)")
        ->check(CLI::Range(0, 100000));
    s->add_option("--max-memory", o->max_memory_gib,
                  "Memory budget in GiB (0 to 1000000) per request (as klein generate --max-memory: streamed weights, tiled VAE; a request that cannot fit fails at once). Default: no budget")
        ->check(CLI::Range(0.0, 1e6));
    s->add_option("--api-key", o->s.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/ requests (default: KLEIN_API_KEY if set, else none)");
    s->add_option("--max-body", o->max_body_mib, "Largest request body in MiB; larger ones get 413 (default 32)")
        ->check(CLI::Range(1, 4096));
    s->add_option("--max-size", o->s.limits.max_side, "Largest width or height a request may ask for (default 2048)")
        ->check(CLI::Range(16, 16384));
    s->add_option("--keep-results", o->keep_results_mib,
                  "MiB of finished /v1/jobs results kept for GET /v1/jobs/{id}, oldest dropped first; the newest is always kept (default 256)")
        ->check(CLI::Range(0, 1 << 20));
    s->add_option("--max-streams", o->s.max_watchers, "Event streams open on one job at once; more get 429 (default 8)")
        ->check(CLI::Range(1, 1000));
    s->add_flag("--verbose,-v", o->s.verbose, "Also log /health requests, client addresses and each job's end");
    s->add_option("--lora-dir", o->s.limits.lora_dir,
                  "Folder of LoRA .safetensors files that requests may name in their `lora` field "
                  "(\"NAME[:SCALE]\" or a list), applied to that request only at run time on the resident model; "
                  "without it requests cannot name LoRAs");
    s->add_option("--threads,-t", o->threads, "Worker threads of the engine (default: all cores)")->check(CLI::Range(0, 1024));
    s->add_option("--memory", o->memory, "resident: keep all components loaded (default); low: one at a time")
        ->check(CLI::IsMember({"low", "resident"}));
    s->add_option("--isa", o->isa, kIsaHelp);
    s->add_option("--precision", o->precision, "fast (default: the dot-product kernels, as generate) or fp32 (exact)")->check(CLI::IsMember({"fp32", "fast"}));
    s->add_option("--backend", o->backend, kBackendHelp)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    s->add_option("--vae-tile", o->vae_tile, "VAE tile size in image pixels, a multiple of 8 (default: automatic)")->check(CLI::Range(8, 8192));
    // Tests hold the loading state open to check what requests get meanwhile.
    s->add_option("--test-load-delay-ms", o->load_delay_ms)->group("")->check(CLI::Range(0, 600000));
    // ... slow down building each job's final event (the window a stream must not end in), and
    // make a job throw on the worker.
    s->add_option("--test-finish-delay-ms", o->s.queue.test_finish_delay_ms)->group("")->check(CLI::Range(0, 600000));
    s->add_option("--test-throw-prompt", o->s.queue.test_throw_prompt)->group("");
    return s;
  };
  c.run = [o]() -> int {
    server::ServerOptions so = o->s;
    so.queue.model_dir = o->ma.path(/*default_tiny=*/true);
    o->ma.apply(so.queue.load);
    so.queue.load.threads = o->threads;
    so.queue.load.memory = o->memory == "low" ? MemoryPolicy::kLow : MemoryPolicy::kResident;
    so.queue.load.isa = o->isa;
    so.queue.load.vae_tile = o->vae_tile;
    so.queue.load.max_memory_gib = o->max_memory_gib;
    so.queue.load.precision = o->precision == "fast" ? Precision::kFast : Precision::kFp32;
    so.queue.load.backend = parse_backend(o->backend);
    so.queue.test_load_delay_ms = o->load_delay_ms;
    // The model loads in the background: a bad option must fail here, not in the first request.
    if (Status st = o->lora.apply(so.queue.load); !st.ok()) return fail(st);
    if (Status st = check_load_options_cli(so.queue.load); !st.ok()) return fail(st);
    so.max_body_bytes = static_cast<size_t>(o->max_body_mib) << 20;
    so.queue.keep_bytes = static_cast<size_t>(o->keep_results_mib) << 20;
    if (so.api_key.empty())
      if (const char* k = std::getenv("KLEIN_API_KEY")) so.api_key = k;
    if (!o->ma.any())
      std::fprintf(stderr, "note: no --model given; serving the tiny random-weight test model (%s): images are noise\n",
                   so.queue.model_dir.c_str());
    // The model opens in the background: its notes (a file name that suggests a base model) come
    // from a look at it now.
    const auto info = Model::inspect(so.queue.model_dir, so.queue.load);
    if (info.ok()) print_notes(info->notes);
    note_quantized_fp32(so.queue.load.precision, [&] { return info; });
    return server::serve(so);
  };
  return c;
}

}  // namespace klein::cli
