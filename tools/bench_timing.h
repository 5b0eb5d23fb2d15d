// Timing helpers shared by the klein-bench_* tools: best-of-N wall and CPU time.
#pragma once

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>

namespace klein::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds used by all threads of this process. On a shared, oversubscribed machine wall time
// mostly measures the neighbours; CPU time still tells how fast our cores ran while they ran.
inline double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct Time {
  double wall = 1e30, cpu = 1e30;  // seconds, best of the repetitions (each minimised separately)
};

// Best-of-`reps` wall and CPU time of fn() after one warm-up call; `before` (untimed, optional)
// runs before each timed call, e.g. to evict the operands from the caches.
inline Time time_best(int reps, const std::function<void()>& fn, const std::function<void()>& before = {}) {
  fn();
  Time best;
  for (int r = 0; r < reps; ++r) {
    if (before) before();
    const double t0 = now_s(), c0 = cpu_s();
    fn();
    best.wall = std::min(best.wall, now_s() - t0);
    best.cpu = std::min(best.cpu, cpu_s() - c0);
  }
  return best;
}

}  // namespace klein::bench
