// Per-request execution state handed to the model forward functions: threads, the tensor
// dumper, and the caller's progress / cancel callbacks. Loaded models stay immutable.
#pragma once

#include <functional>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/dump.h"

namespace klein {

struct RunContext {
  ThreadPool* pool = nullptr;
  Dumper* dumper = nullptr;  // null = no dumps
  // Called as work advances: phase name ("encode", "denoise", "decode"), done units, total units.
  std::function<void(const std::string& phase, int done, int total)> progress;
  // Polled between layers/steps; returning true aborts the run with Code::kCancelled.
  std::function<bool()> should_cancel;

  void dump(const std::string& name, const float* data, const Shape& shape) const {
    if (dumper) dumper->dump(name, data, shape);
  }
  void dump(const std::string& name, const Tensor& t) const { dump(name, t.data(), t.shape()); }
  bool wants_dump(const std::string& name) const { return dumper && dumper->wants(name); }
  Status check_cancel(const std::string& where) const {
    if (should_cancel && should_cancel()) return cancelled("cancelled during " + where);
    return Status::Ok();
  }
  void report(const std::string& phase, int done, int total) const {
    if (progress) progress(phase, done, total);
  }
};

}  // namespace klein
