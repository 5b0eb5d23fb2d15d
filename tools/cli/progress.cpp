#include "progress.h"

#include <cstdio>
#include <unistd.h>

namespace klein::cli {

Progress::Progress(bool quiet)
    : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}

std::function<void(const std::string&, int, int)> Progress::callback() {
  return [this](const std::string& p, int d, int t) { update(p, d, t); };
}

void Progress::update(const std::string& phase, int done, int total) {
  const auto now = std::chrono::steady_clock::now();
  if (phase != phase_) {
    if (!phase_.empty()) add_time(phase_, std::chrono::duration<double>(now - phase_start_).count());
    if (line_open_ && !quiet_) std::fputc('\n', stderr);
    line_open_ = false;
    phase_ = phase;
    phase_start_ = now;
  }
  if (quiet_) return;
  const double el = std::chrono::duration<double>(now - phase_start_).count();
  if (tty_) {
    const int width = 30;
    const int filled = total > 0 ? width * done / total : 0;
    std::string bar(filled, '#');
    bar.append(width - filled, '.');
    std::fprintf(stderr, "\r%-8s [%s] %d/%d  %.1fs", phase.c_str(), bar.c_str(), done, total, el);
    std::fflush(stderr);
    line_open_ = true;
  } else if (done == total || phase == "denoise") {  // logs get phase ends and steps only
    std::fprintf(stderr, "%s %d/%d %.2fs\n", phase.c_str(), done, total, el);
  }
}

// A phase re-entered (the pipeline's per-reference "vae encode" around the VAE's own
// "vae_encode" steps) adds to its first entry rather than being listed again.
void Progress::add_time(const std::string& phase, double sec) {
  for (auto& [name, t] : times_)
    if (name == phase) {
      t += sec;
      return;
    }
  times_.emplace_back(phase, sec);
}

void Progress::finish() {
  const auto now = std::chrono::steady_clock::now();
  if (!phase_.empty()) add_time(phase_, std::chrono::duration<double>(now - phase_start_).count());
  phase_.clear();
  if (line_open_ && !quiet_) std::fputc('\n', stderr);
  line_open_ = false;
}

}  // namespace klein::cli
