// The engine's seams for the API layer, each in one place:
//   * make_engine / make_run_context: the Backend that executes requests (a CpuBackend with the
//     caller's threads and ISA ceiling, or in -DKLEIN_CUDA=ON builds a CudaBackend, as
//     LoadOptions::backend says) and the per-request RunContext over it.
//   * load_text_encoder / load_transformer / load_vae: load a component from its spec
//     (api/layout.h) and prepare its weights for the engine's backend.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "api/layout.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "io/dump.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/lora_apply.h"
#include "models/qwen3.h"

namespace klein::api {

// What executes a model's requests: its backend (which owns the threads and the kernels chosen
// for this CPU under the ISA ceiling).
struct Engine {
  std::unique_ptr<Backend> backend;
  std::string isa;
};

// The kernels' ceiling for LoadOptions::isa: kCount for "" (the best), else the named ISA, which
// must be known and one this CPU has.
Status isa_ceiling(const std::string& name, Isa* ceiling);
// Checks `options` (check_load_options) and creates the engine.
Result<std::unique_ptr<Engine>> make_engine(const LoadOptions& options);
// Whether `options` run on the CUDA backend: kCuda (or an error saying why it cannot: a build
// without the backend, no device, a host-memory budget), kAuto when the build has it, a device
// is visible and no budget is set; false for kCpu.
Result<bool> use_cuda(const LoadOptions& options);

// The per-request context: the engine, an optional dumper, the caller's callbacks.
RunContext make_run_context(Engine& engine, Dumper* dumper, const Callbacks& callbacks);

// The models bound from a spec (api/layout.h), not yet prepared for a backend.
Result<Qwen3Encoder> bind_text_encoder(const ComponentSpec& spec, int layers_needed);
Result<Flux2Transformer> bind_transformer(const ComponentSpec& spec);
Result<Flux2Vae> bind_vae(const ComponentSpec& spec);

// LoRAs to apply to a model between binding and preparing it (LoadOptions::loras / lora_mode).
struct LoraSetup {
  std::vector<LoraSpec> files;
  LoraMode mode = LoraMode::kAuto;
  bool merge_to_f32 = false;  // Precision::kFp32: merged weights in float32, as diffusers' float32 pipeline
};
// Reads each LoRA file against `model`'s weights and applies it (models/lora_apply.h); run-time
// terms are refused on a backend other than the CPU's.
template <class M>
Status apply_lora_setup(M& model, const LoraSetup& loras, const Backend& be);

// The LoRA files of `loras` read against `model`'s weights.
template <class M>
Result<std::vector<LoraUse>> read_loras(const M& model, const LoraSetup& loras);
LoraApply lora_apply_mode(LoraMode mode);

Result<std::shared_ptr<const Qwen3Encoder>> load_text_encoder(const ComponentSpec& spec, int layers_needed, Backend& be,
                                                              const LoraSetup& loras = {});
Result<std::shared_ptr<const Flux2Transformer>> load_transformer(const ComponentSpec& spec, Backend& be,
                                                                 const LoraSetup& loras = {});
Result<std::shared_ptr<const Flux2Vae>> load_vae(const ComponentSpec& spec, Backend& be);

// The CPU report behind klein::cpu_info(): model name, features, usable ISAs and the kernel
// chosen per (op, format) with the best ISA (or the `isa` ceiling), for both precisions.
Result<std::string> cpu_report(const std::string& isa);

}  // namespace klein::api
