// Progress reporting on stderr: a redrawn bar on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace klein::cli {

class Progress {
 public:
  explicit Progress(bool quiet);
  // A callback suitable for RunContext::progress.
  std::function<void(const std::string&, int, int)> callback();
  // Ends the current bar line (if any) and prints per-phase times unless quiet.
  void finish();
  // Seconds spent in each phase so far, in order of first appearance.
  const std::vector<std::pair<std::string, double>>& phase_times() const { return times_; }

 private:
  void update(const std::string& phase, int done, int total);
  void add_time(const std::string& phase, double sec);
  bool quiet_, tty_;
  std::string phase_;
  std::chrono::steady_clock::time_point phase_start_, start_;
  std::vector<std::pair<std::string, double>> times_;
  bool line_open_ = false;
};

}  // namespace klein::cli
