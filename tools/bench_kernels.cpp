// klein-bench_kernels: measures this machine's float32 FMA peak and the GEMM / attention kernels
// against it, so kernel changes can be judged in % of peak rather than in absolute seconds.
//
//   klein-bench_kernels [--threads N] [--reps R] [--quick] [--isa NAME]
//
// --isa caps the kernel selection (scalar, avx2, ...) to time a lower ISA's kernels on this CPU.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <time.h>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/registry.h"

#if defined(KLEIN_X86)
#include <immintrin.h>
#endif

using namespace klein;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds used by all threads of this process. On a shared, oversubscribed machine wall time
// mostly measures the neighbours; CPU time still tells how fast our cores ran while they ran.
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct Time {
  double wall = 1e30, cpu = 1e30;  // seconds, best of the repetitions (each minimised separately)
};

// Best-of-`reps` wall and CPU time of fn() after one warm-up call.
Time time_best(int reps, const std::function<void()>& fn) {
  fn();
  Time best;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s(), c0 = cpu_s();
    fn();
    best.wall = std::min(best.wall, now_s() - t0);
    best.cpu = std::min(best.cpu, cpu_s() - c0);
  }
  return best;
}

#if defined(KLEIN_X86)
// 12 independent FMA chains: more than latency (4-5 cycles) × FMA ports (2) in flight, so the
// loop runs at FMA throughput. Returns a value derived from the chains so nothing is elided.
__attribute__((target("avx2,fma"))) float fma_loop(int64_t iters) {
  __m256 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(0.001f * j);
  const __m256 m = _mm256_set1_ps(0.99999f), c = _mm256_set1_ps(1e-5f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  __m256 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}
#endif

// A measurement: `flop` done in time t by `threads` threads.
struct Row {
  std::string what;
  int threads;
  double flop;
  Time t;
};

// fp32 FMA peak with all threads of `pool` running the FMA loop at once.
Row fma_peak(ThreadPool& pool, int reps) {
  Row r{"fp32 FMA peak (12 chains of ymm FMA)", pool.size(), 0, {}};
#if defined(KLEIN_X86)
  // The CPU's capability, not the selected kernels': the peak is the yardstick whatever --isa is.
  if (!CpuFeatures::host().has(Isa::kAvx2)) return r;
  const int64_t iters = 20'000'000;  // 3.8 GFLOP per thread, ~0.05 s at 80 GFLOP/s
  std::vector<float> sink(pool.size());
  r.t = time_best(reps, [&] { pool.run([&](int i, int) { sink[i] = fma_loop(iters); }); });
  r.flop = 12.0 * 16.0 * iters * pool.size();
#endif
  return r;
}

// Wall columns: throughput and % of the same-thread-count peak, both by wall time. CPU columns:
// flop per CPU-second of all threads vs the per-core peak per CPU-second, i.e. the per-core
// efficiency, which stays meaningful when other processes share the cores.
void print(const std::vector<Row>& rows, const Row& peak1, const Row& peakn) {
  std::printf("%-42s %3s %9s %9s %7s %11s %7s\n", "kernel", "thr", "wall ms", "GFLOP/s",
              "%peak", "GFLOP/cpu-s", "%peak");
  // Per-core peak per CPU-second is a property of the core: take the best of both runs, as a
  // neighbour's cache or frequency disturbance can only make a measurement lower.
  const double p1_cpu = std::max(peak1.flop / peak1.t.cpu, peakn.flop / peakn.t.cpu);
  for (const Row& r : rows) {
    if (r.flop == 0) continue;  // peak not measurable (no AVX2/FMA)
    const Row& pk = r.threads == 1 ? peak1 : peakn;
    const double g = r.flop / r.t.wall / 1e9, gc = r.flop / r.t.cpu / 1e9;
    const double pw = pk.flop / pk.t.wall / 1e9;
    std::printf("%-42s %3d %9.2f %9.1f %6.1f%% %11.1f %6.1f%%\n", r.what.c_str(), r.threads,
                r.t.wall * 1e3, g, pw > 0 ? 100 * g / pw : 0.0, gc,
                p1_cpu > 0 ? 100 * gc / (p1_cpu / 1e9) : 0.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark the float32 FMA peak, GEMM and attention kernels"};
  int threads = 2, reps = 3;
  bool quick = false;
  app.add_option("--threads", threads, "threads for the kernels (peak is also shown for 1)");
  app.add_option("--reps", reps, "timed repetitions (best is reported)");
  app.add_flag("--quick", quick, "smaller shapes, for a smoke test");
  std::string isa_arg;
  app.add_option("--isa", isa_arg, "highest ISA for the kernels: scalar, avx2, avx512, ... (default: best)");
  CLI11_PARSE(app, argc, argv);

  Isa max_isa = Isa::kCount;
  if (!isa_arg.empty() && !isa_from_name(isa_arg, &max_isa)) {
    std::fprintf(stderr, "error: unknown ISA '%s'\n", isa_arg.c_str());
    return 2;
  }
  const kernels::KernelSet set = kernels::KernelSet::select(CpuFeatures::host(), max_isa);
  std::printf("cpu features: %s\n", CpuFeatures::host().flags().c_str());
  for (auto [op, fmt] : {std::pair{kernels::Op::kLinear, DType::kBF16}, {kernels::Op::kAttention, DType::kF32}}) {
    const kernels::KernelEntry& e = set.get(op, fmt);
    std::printf("%s %s: %s (%s)\n", std::string(kernels::op_name(op)).c_str(), std::string(dtype_name(fmt)).c_str(),
                std::string(isa_name(e.isa)).c_str(), std::string(e.name).c_str());
  }
  ThreadPool pool1(1), pool(threads);
  const Row peak1 = fma_peak(pool1, std::max(reps, 5)), peakn = fma_peak(pool, std::max(reps, 5));
  std::vector<Row> rows = {peak1};
  if (threads != 1) rows.push_back(peakn);

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  struct Shape3 {
    int64_t M, K, N;
  };
  std::vector<Shape3> shapes = {{512, 2560, 9728}, {1024, 3072, 3072}, {1, 3072, 9216}};
  if (quick) shapes = {{96, 512, 1024}, {1, 512, 1024}};
  for (const Shape3& s : shapes) {
    std::vector<uint16_t> w(s.N * s.K);
    for (auto& e : w) e = f32_to_bf16(dist(rng));
    std::vector<float> x(s.M * s.K), y(s.M * s.N);
    for (auto& e : x) e = dist(rng);
    Weight W;
    W.name = "bench";
    W.dtype = DType::kBF16;
    W.shape = {s.N, s.K};
    W.data = w.data();
    const double flop = 2.0 * s.M * s.N * s.K;
    const std::string name = "linear bf16 M=" + std::to_string(s.M) + " K=" +
                             std::to_string(s.K) + " N=" + std::to_string(s.N);
    for (ThreadPool* p : {&pool1, &pool}) {
      if (p == &pool1 && threads == 1) continue;
      const Time t = time_best(reps, [&] {
        kernels::run_linear(set, x.data(), s.M, s.K, W, nullptr, y.data(), *p);
      });
      rows.push_back({name, p->size(), flop, t});
    }
  }

  const int64_t S = quick ? 256 : 1024;
  const int H = quick ? 4 : 24, D = 128;
  std::vector<float> q(S * H * D), k(S * H * D), v(S * H * D), o(S * H * D);
  for (auto* buf : {&q, &k, &v})
    for (auto& e : *buf) e = dist(rng);
  for (bool causal : {false, true}) {
    const double flop = 4.0 * S * S * D * H * (causal ? 0.5 : 1.0);
    const Time t = time_best(reps, [&] {
      kernels::run_attention(set, q.data(), k.data(), v.data(), o.data(), S, S, H, H, D,
                             1.0f / std::sqrt(float(D)), {.causal = causal}, pool);
    });
    rows.push_back({"attention S=" + std::to_string(S) + " H=" + std::to_string(H) +
                        " D=128" + (causal ? " causal" : ""),
                    threads, flop, t});
  }
  print(rows, peak1, peakn);
  return 0;
}
