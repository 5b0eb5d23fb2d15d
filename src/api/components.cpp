#include "api/components.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <type_traits>

#include "api/guard.h"
#include "kernels/registry.h"
#ifdef KLEIN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace klein::api {

namespace {
std::string isa_list(const std::vector<Isa>& isas) {
  std::string names;
  for (Isa i : isas) names += std::string(names.empty() ? "" : ", ") + std::string(isa_name(i));
  return names;
}

// A budget in GiB (`field` names it): finite, 0 to kMaxMemoryGib. The callers turn it into bytes
// with a cast, which is undefined behaviour for NaN or a value beyond uint64_t.
Status check_gib(const char* field, double v) {
  if (std::isfinite(v) && v >= 0 && v <= kMaxMemoryGib) return Status::Ok();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return invalid_argument(std::string(field) + " " + buf + ": expected a number of GiB from 0 (none) to " +
                          std::to_string(static_cast<int64_t>(kMaxMemoryGib)));
}
}  // namespace

Status isa_ceiling(const std::string& name, Isa* ceiling) {
  *ceiling = Isa::kCount;
  if (name.empty()) return Status::Ok();
  std::vector<Isa> all;
  for (int i = 0; i < static_cast<int>(Isa::kCount); ++i) all.push_back(static_cast<Isa>(i));
  if (!isa_from_name(name, ceiling))
    return invalid_argument("isa \"" + name + "\": unknown (expected one of " + isa_list(all) + ")");
  // A ceiling the CPU lacks would silently run the best kernels below it: not what was asked.
  const CpuFeatures& cpu = CpuFeatures::host();
  if (!cpu.has(*ceiling))
    return invalid_argument("isa \"" + name + "\": this CPU does not have it (it has " + isa_list(cpu.isas()) + ")");
  return Status::Ok();
}

Result<std::unique_ptr<Engine>> make_engine(const LoadOptions& options) {
  KLEIN_RETURN_IF_ERROR(check_load_options(options));
  Isa ceiling = Isa::kCount;
  KLEIN_RETURN_IF_ERROR(isa_ceiling(options.isa, &ceiling));
  KLEIN_ASSIGN_OR_RETURN([[maybe_unused]] const bool cuda, use_cuda(options));
  auto e = std::make_unique<Engine>();
#ifdef KLEIN_HAS_CUDA
  if (cuda) {
    CudaBackendOptions co;
    co.precision = options.precision == Precision::kFast ? CudaPrecision::kBf16 : CudaPrecision::kFp32;
    co.host_threads = options.threads;
    KLEIN_ASSIGN_OR_RETURN(e->backend, make_cuda_backend(co));
    e->isa = options.isa;
    return e;
  }
#endif
  e->backend = std::make_unique<CpuBackend>(CpuBackendOptions{
      options.threads, ceiling,
      options.precision == Precision::kFast ? kernels::Precision::kFast : kernels::Precision::kFp32});
  e->isa = options.isa;
  return e;
}

Result<bool> use_cuda(const LoadOptions& options) {
  switch (options.backend) {
    case BackendKind::kCpu:
      return false;
    case BackendKind::kAuto:
    case BackendKind::kCuda:
      break;
    default:
      return invalid_argument("backend: unknown value " + std::to_string(static_cast<int>(options.backend)));
  }
  const bool asked = options.backend == BackendKind::kCuda;
#ifdef KLEIN_HAS_CUDA
  if (options.max_memory_gib > 0) {
    // The budget plans host memory: weights streamed from mapped files, the CPU's activations.
    if (asked)
      return unsupported("--backend cuda: --max-memory budgets host memory for the CPU backend and is not "
                         "supported on the GPU (drop it, or use --backend cpu)");
    return false;
  }
  auto n = cuda_device_count();
  if (n.ok()) return true;
  if (asked) return unsupported("--backend cuda: no CUDA device found (" + n.status().message() + ")");
  return false;
#else
  if (asked) return unsupported("--backend cuda: this build has no CUDA backend (configure with -DKLEIN_CUDA=ON)");
  return false;
#endif
}

RunContext make_run_context(Engine& engine, Dumper* dumper, const Callbacks& callbacks) {
  RunContext ctx;
  ctx.backend = engine.backend.get();
  ctx.dumper = dumper && dumper->enabled() ? dumper : nullptr;
  ctx.progress = callbacks.progress;
  ctx.should_cancel = callbacks.cancel;
  return ctx;
}

namespace {
template <class M>
Result<std::shared_ptr<const M>> prepared(Result<M> loaded, Backend& be, const LoraSetup& loras = {}) {
  if (!loaded.ok()) return loaded.status();
  auto m = std::make_shared<M>(std::move(loaded).value());
  if constexpr (!std::is_same_v<M, Flux2Vae>) KLEIN_RETURN_IF_ERROR(apply_lora_setup(*m, loras, be));
  KLEIN_RETURN_IF_ERROR(m->prepare(be));
  return std::shared_ptr<const M>(std::move(m));
}
}  // namespace

Result<Qwen3Encoder> bind_text_encoder(const ComponentSpec& spec, int layers_needed) {
  KLEIN_ASSIGN_OR_RETURN(auto src, spec.open());
  return Qwen3Encoder::load(std::move(src), spec.config, spec.config_where, layers_needed);
}

Result<Flux2Transformer> bind_transformer(const ComponentSpec& spec) {
  KLEIN_ASSIGN_OR_RETURN(auto src, spec.open());
  return Flux2Transformer::load(std::move(src), spec.config, spec.config_where);
}

Result<Flux2Vae> bind_vae(const ComponentSpec& spec) {
  KLEIN_ASSIGN_OR_RETURN(auto src, spec.open());
  return Flux2Vae::load(std::move(src), spec.config, spec.config_where);
}

Result<std::shared_ptr<const Qwen3Encoder>> load_text_encoder(const ComponentSpec& spec, int layers_needed, Backend& be,
                                                              const LoraSetup& loras) {
  return prepared(bind_text_encoder(spec, layers_needed), be, loras);
}

Result<std::shared_ptr<const Flux2Transformer>> load_transformer(const ComponentSpec& spec, Backend& be,
                                                                 const LoraSetup& loras) {
  return prepared(bind_transformer(spec), be, loras);
}

LoraApply lora_apply_mode(LoraMode mode) {
  return mode == LoraMode::kMerge ? LoraApply::kMerge : mode == LoraMode::kRuntime ? LoraApply::kRuntime : LoraApply::kAuto;
}

template <class M>
Result<std::vector<LoraUse>> read_loras(const M& model, const LoraSetup& loras) {
  const std::vector<LoraTarget> targets = lora_targets(model);
  const LoraComponent comp = std::is_same_v<M, Qwen3Encoder> ? LoraComponent::kTextEncoder : LoraComponent::kTransformer;
  std::vector<LoraUse> uses;
  for (const LoraSpec& l : loras.files) {
    KLEIN_ASSIGN_OR_RETURN(LoraFile f, load_lora(l.path, targets, comp));
    uses.push_back({std::make_shared<const LoraFile>(std::move(f)), l.scale});
  }
  return uses;
}
template Result<std::vector<LoraUse>> read_loras(const Qwen3Encoder&, const LoraSetup&);
template Result<std::vector<LoraUse>> read_loras(const Flux2Transformer&, const LoraSetup&);

template <class M>
Status apply_lora_setup(M& model, const LoraSetup& loras, const Backend& be) {
  if (loras.files.empty()) return Status::Ok();
  KLEIN_ASSIGN_OR_RETURN(std::vector<LoraUse> uses, read_loras(model, loras));
  const LoraApply mode = lora_apply_mode(loras.mode);
  int runtime = 0;
  KLEIN_RETURN_IF_ERROR(apply_loras(model, uses, mode, loras.merge_to_f32, nullptr, &runtime));
  // The CUDA backend's GEMMs have no low-rank epilogue yet.
  if (runtime > 0 && be.device() != Device::kCpu)
    return unsupported("LoRA: run-time application (quantized weights, or --lora-mode runtime) runs on the CPU "
                       "backend only; use --backend cpu, or float weights with --lora-mode merge");
  return Status::Ok();
}
template Status apply_lora_setup(Qwen3Encoder&, const LoraSetup&, const Backend&);
template Status apply_lora_setup(Flux2Transformer&, const LoraSetup&, const Backend&);

Result<std::shared_ptr<const Flux2Vae>> load_vae(const ComponentSpec& spec, Backend& be) {
  return prepared(bind_vae(spec), be);
}

Result<std::string> cpu_report(const std::string& isa) {
  Isa ceiling = Isa::kCount;
  KLEIN_RETURN_IF_ERROR(isa_ceiling(isa, &ceiling));
  return kernels::describe_cpu(CpuFeatures::host(), ceiling);
}

}  // namespace klein::api

namespace klein {

Status check_load_options(const LoadOptions& options) {
  return api::guarded("check load options", [&]() -> Status {
    if (options.threads < 0 || options.threads > kMaxThreads)
      return invalid_argument("threads " + std::to_string(options.threads) + ": expected 0 (all cores) to " +
                              std::to_string(kMaxThreads));
    Isa ceiling;
    KLEIN_RETURN_IF_ERROR(api::isa_ceiling(options.isa, &ceiling));
    // The VAE downsamples by 8: a tile edge that is not a multiple of it would be rounded.
    if (options.vae_tile > 0 && options.vae_tile % 8 != 0)
      return invalid_argument("vae_tile " + std::to_string(options.vae_tile) +
                              ": must be a multiple of 8 image pixels (0: automatic, < 0: never tile)");
    KLEIN_RETURN_IF_ERROR(api::check_gib("max_memory_gib", options.max_memory_gib));
    KLEIN_RETURN_IF_ERROR(api::check_gib("vae_tile_above_gib", options.vae_tile_above_gib));
    if (options.precision != Precision::kFp32 && options.precision != Precision::kFast)
      return invalid_argument("precision: unknown value " + std::to_string(static_cast<int>(options.precision)));
    if (options.lora_mode != LoraMode::kAuto && options.lora_mode != LoraMode::kMerge &&
        options.lora_mode != LoraMode::kRuntime)
      return invalid_argument("lora_mode: unknown value " + std::to_string(static_cast<int>(options.lora_mode)));
    for (const LoraSpec& l : options.loras) {
      if (l.path.empty()) return invalid_argument("loras: an entry without a path");
      if (!std::isfinite(l.scale) || std::fabs(l.scale) > 100.0f)
        return invalid_argument("loras: " + l.path + ": the scale must be a number from -100 to 100");
    }
    return Status::Ok();
  });
}

}  // namespace klein
