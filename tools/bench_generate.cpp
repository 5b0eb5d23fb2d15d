// klein-bench_generate: warm timings of whole requests on a model held open, as a server runs
// them — the numbers `klein generate` cannot give, since each of its runs is a cold start (load,
// upload, first-use setup). Opens the model once (--memory resident by default), runs one
// request to warm up (reported as "first"), then --repeat timed requests and prints each, the
// median and, per phase, the median of the phase times. With the CUDA backend it also prints
// the peak of the device's memory pool (everything the backend allocates) per request.
//
//   klein-bench_generate --model DIR [--backend cuda] [--precision fast] [-W 1024 -H 1024]
//                        [--steps 4] [--ref IMG ...] [--repeat 3]
//
// One line per result on stdout ("first 1.234 s", "run 2 0.456 s", "median 0.456 s", "phase
// denoise 0.300 s", "peak_gpu_gib 12.34"), for scripts (scripts/cuda_device_check.sh).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "klein/klein.h"
#ifdef KLEIN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

using namespace klein;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Per phase: the time from its first progress report to its last (the "load transformer" and
// "tokenize" phases included), as the CLI's --progress table measures them.
struct PhaseClock {
  std::map<std::string, std::pair<Clock::time_point, Clock::time_point>> spans;
  std::vector<std::string> order;
  void on(const std::string& phase) {
    const auto now = Clock::now();
    auto it = spans.find(phase);
    if (it == spans.end()) {
      spans[phase] = {now, now};
      order.push_back(phase);
    } else {
      it->second.second = now;
    }
  }
};

double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Warm timings of klein requests on a model held open", "klein-bench_generate"};
  std::string model, backend = "auto", precision = "fp32", memory = "resident", prompt = "A cat holding a sign that says hello world";
  std::vector<std::string> refs;
  int width = 1024, height = 1024, steps = 4, repeat = 3, threads = 0;
  uint64_t seed = 0;
  app.add_option("--model,-m", model, "Model folder (diffusers layout)")->required();
  app.add_option("--backend", backend, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--precision", precision, "fp32 or fast")->check(CLI::IsMember({"fp32", "fast"}));
  app.add_option("--memory", memory, "resident (default) or low")->check(CLI::IsMember({"low", "resident"}));
  app.add_option("--width,-W", width)->check(CLI::Range(16, 8192));
  app.add_option("--height,-H", height)->check(CLI::Range(16, 8192));
  app.add_option("--steps", steps)->check(CLI::Range(1, 1000));
  app.add_option("--seed", seed);
  app.add_option("--prompt,-p", prompt);
  app.add_option("--ref", refs, "Reference image (editing; repeatable)");
  app.add_option("--repeat", repeat, "Timed requests after the warm-up one")->check(CLI::Range(1, 1000));
  app.add_option("--threads,-t", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);

  LoadOptions lo;
  lo.threads = threads;
  lo.memory = memory == "low" ? MemoryPolicy::kLow : MemoryPolicy::kResident;
  lo.precision = precision == "fast" ? Precision::kFast : Precision::kFp32;
  lo.backend = backend == "cuda" ? BackendKind::kCuda : backend == "cpu" ? BackendKind::kCpu : BackendKind::kAuto;
  const auto t_open = Clock::now();
  auto m = Model::open(model, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "klein-bench_generate: %s\n", m.status().to_string().c_str());
    return 1;
  }
  std::printf("backend %s\nopen %.3f s\n", (*m)->backend_name().c_str(), since(t_open));
  [[maybe_unused]] const bool cuda = (*m)->backend_name() == "cuda";

  GenerateRequest g;
  g.prompt = prompt;
  g.width = width;
  g.height = height;
  g.steps = steps;
  g.seed = seed;
  g.reference_images = refs;
  std::vector<double> totals;
  std::map<std::string, std::vector<double>> phases;
  std::vector<std::string> phase_order;
  for (int i = 0; i <= repeat; ++i) {
#ifdef KLEIN_HAS_CUDA
    if (cuda) (void)cuda_memory_stats(0, /*reset_peaks=*/true);
#endif
    PhaseClock pc;
    Callbacks cb;
    cb.progress = [&pc](const std::string& phase, int, int) { pc.on(phase); };
    const auto t0 = Clock::now();
    auto r = (*m)->generate(g, cb);
    const double t = since(t0);
    if (!r.ok()) {
      std::fprintf(stderr, "klein-bench_generate: %s\n", r.status().to_string().c_str());
      return 1;
    }
    if (i == 0) {
      std::printf("first %.3f s (%dx%d, %d steps, %zu refs)\n", t, r->width, r->height, r->steps, refs.size());
    } else {
      std::printf("run %d %.3f s\n", i, t);
      totals.push_back(t);
      for (const auto& name : pc.order) {
        const auto& [a, b] = pc.spans[name];
        if (!phases.count(name)) phase_order.push_back(name);
        phases[name].push_back(std::chrono::duration<double>(b - a).count());
      }
    }
#ifdef KLEIN_HAS_CUDA
    if (cuda) {
      auto st = cuda_memory_stats(0);
      if (st.ok()) std::printf("peak_gpu_gib %.2f (pool reserved %.2f)\n", gib(st->used_peak), gib(st->reserved_peak));
    }
#endif
  }
  std::printf("median %.3f s over %d runs\n", median(totals), repeat);
  for (const auto& name : phase_order) std::printf("phase %s %.3f s\n", name.c_str(), median(phases[name]));
  return 0;
}
