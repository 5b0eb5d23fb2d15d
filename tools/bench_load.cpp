// klein-bench_load: how long opening a model takes with every component mapped and bound
// (MemoryPolicy::kResident: layout resolution, detection, configs, the three models bound and
// prepared for the CPU), for comparing the forms a checkpoint comes in (bench/load_forms.sh).
// Prints "open S" per run and "median S" (warm page cache after the first).
//
//   klein-bench_load --model DIR [--diffusion-model FILE] [--repeat 3]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "klein/klein.h"

int main(int argc, char** argv) {
  CLI::App app{"Time Model::open with every component resident"};
  std::string model;
  klein::LoadOptions lo;
  int repeat = 3;
  app.add_option("--model", model, "Model folder or file")->required();
  app.add_option("--diffusion-model", lo.diffusion_model, "Transformer file replacing the model's");
  app.add_option("--repeat", repeat, "Runs")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  lo.memory = klein::MemoryPolicy::kResident;
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto m = klein::Model::open(model, lo);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!m.ok()) {
      std::fprintf(stderr, "klein-bench_load: %s\n", m.status().message().c_str());
      return 1;
    }
    std::printf("open %.3f\n", s);
    t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  std::printf("median %.3f\n", t[t.size() / 2]);
  return 0;
}
