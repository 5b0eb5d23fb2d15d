// Per-request execution state handed to the model forward functions: the Backend that does the
// arithmetic (the CPU backend owns the threads), the tensor dumper, and the caller's progress /
// cancel callbacks. Loaded models stay immutable, so one model serves many RunContexts.
#pragma once

#include <functional>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "io/dump.h"

namespace klein {

struct RunContext {
  Backend* backend = nullptr;
  Dumper* dumper = nullptr;  // null = no dumps
  // Called as work advances: phase name ("encode", "denoise", "decode"), done units, total units.
  std::function<void(const std::string& phase, int done, int total)> progress;
  // Polled between layers/steps; returning true aborts the run with Code::kCancelled.
  std::function<bool()> should_cancel;
  // Called before block i of a model that runs in blocks (the text encoder's layers; the
  // transformer's double then single blocks, numbered on), so the caller can stream that
  // model's weights (api/residency.h); the models themselves do no I/O.
  std::function<void(int block)> on_block;

  Backend& be() const { return *backend; }
  bool wants_dump(const std::string& name) const { return dumper && dumper->wants(name); }
  // Writes `x` (on any device; downloaded first if needed) as <name>.npy with `shape` (default:
  // the view's own shape). A failure is kept in the dumper's status.
  void dump(const std::string& name, const TensorView& x, const Shape& shape = {}) const;
  Status check_cancel(const std::string& where) const {
    if (should_cancel && should_cancel()) return cancelled("cancelled during " + where);
    return Status::Ok();
  }
  void enter_block(int i) const {
    if (on_block) on_block(i);
  }
  void report(const std::string& phase, int done, int total) const {
    if (progress) progress(phase, done, total);
  }
};

}  // namespace klein
