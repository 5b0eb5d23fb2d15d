#include "api/components.h"

#include <cstdlib>
#include <fstream>

#include "kernels/kernels.h"

namespace klein::api {

namespace {

constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512", "avx512vnni", "avx512bf16", "avxvnni"};

bool known_isa(const std::string& s) {
  for (const char* n : kIsaNames)
    if (s == n) return true;
  return false;
}

// Today the kernels pick AVX2 or scalar once per process (kernels::cpu_has_avx2, which honours
// KLEIN_DISABLE_AVX2). A "scalar" ceiling is applied through that switch, so it must come
// before the first kernel runs; with the Backend merge this becomes CpuBackend(max_isa).
Status apply_isa_ceiling(const std::string& isa) {
  if (isa.empty() || isa != "scalar") return Status::Ok();  // avx2 and above: no lower than today
  ::setenv("KLEIN_DISABLE_AVX2", "1", 1);
  if (kernels::cpu_has_avx2())
    return unsupported("isa \"scalar\": the AVX2 kernels were already chosen in this process; open the first model "
                       "with this ceiling or set KLEIN_DISABLE_AVX2=1");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> make_engine(const LoadOptions& options) {
  if (options.threads < 0) return invalid_argument("threads must be >= 0 (0: all cores)");
  if (!options.isa.empty() && !known_isa(options.isa))
    return invalid_argument("isa \"" + options.isa +
                            "\": unknown (expected scalar, avx2, avx512, avx512vnni, avx512bf16 or avxvnni)");
  KLEIN_RETURN_IF_ERROR(apply_isa_ceiling(options.isa));
  auto e = std::make_unique<Engine>();
  e->pool = std::make_unique<ThreadPool>(options.threads);
  e->isa = options.isa;
  return e;
}

RunContext make_run_context(Engine& engine, Dumper* dumper, const Callbacks& callbacks) {
  RunContext ctx;
  ctx.pool = engine.pool.get();
  ctx.dumper = dumper && dumper->enabled() ? dumper : nullptr;
  ctx.progress = callbacks.progress;
  ctx.should_cancel = callbacks.cancel;
  return ctx;
}

Result<std::shared_ptr<const Qwen3Encoder>> load_text_encoder(const std::filesystem::path& dir, int layers_needed) {
  KLEIN_ASSIGN_OR_RETURN(auto m, Qwen3Encoder::load(dir, layers_needed));
  return std::shared_ptr<const Qwen3Encoder>(std::make_shared<Qwen3Encoder>(std::move(m)));
}

Result<std::shared_ptr<const Flux2Transformer>> load_transformer(const std::filesystem::path& dir) {
  KLEIN_ASSIGN_OR_RETURN(auto m, Flux2Transformer::load(dir));
  return std::shared_ptr<const Flux2Transformer>(std::make_shared<Flux2Transformer>(std::move(m)));
}

Result<std::shared_ptr<const Flux2Vae>> load_vae(const std::filesystem::path& dir) {
  KLEIN_ASSIGN_OR_RETURN(auto m, Flux2Vae::load(dir));
  return std::shared_ptr<const Flux2Vae>(std::make_shared<Flux2Vae>(std::move(m)));
}

std::string minimal_cpu_report() {
  std::string name = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      const auto start = colon == std::string::npos ? colon : line.find_first_not_of(" \t", colon + 1);
      if (start != std::string::npos) name = line.substr(start);
      break;
    }
  return "cpu      " + name + "\nkernels  " + (kernels::cpu_has_avx2() ? "avx2 (AVX2 + FMA + F16C)" : "scalar (no AVX2)") +
         "\n";
}

}  // namespace klein::api
