// The engine's seams for the API layer, each in ONE place so the pending merges are one-line
// changes:
//   * make_run_context: builds the per-request RunContext (today a ThreadPool*; after the
//     backend merge a Backend* owned by a CpuBackend with the ISA ceiling).
//   * load_text_encoder / load_transformer / load_vae: the model load calls (today
//     X::load(dir, ...); after the loader merge X::load(TensorSource, ...)).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/run_context.h"
#include "core/thread_pool.h"
#include "io/dump.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"

namespace klein::api {

// What executes a request: today the thread pool; the ISA ceiling applies process-wide until
// the Backend lands (see apply_isa_ceiling).
struct Engine {
  std::unique_ptr<ThreadPool> pool;
  std::string isa;
};

// Validates `isa` ("" or a known ISA name) and creates the engine.
Result<std::unique_ptr<Engine>> make_engine(const LoadOptions& options);

// The per-request context: the engine, an optional dumper, the caller's callbacks.
RunContext make_run_context(Engine& engine, Dumper* dumper, const Callbacks& callbacks);

Result<std::shared_ptr<const Qwen3Encoder>> load_text_encoder(const std::filesystem::path& dir, int layers_needed);
Result<std::shared_ptr<const Flux2Transformer>> load_transformer(const std::filesystem::path& dir);
Result<std::shared_ptr<const Flux2Vae>> load_vae(const std::filesystem::path& dir);

// CPU model name and the kernels' instruction set (the minimal report behind klein::cpu_info()).
std::string minimal_cpu_report();

}  // namespace klein::api
