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
  // A GPU backend queues its work: the report waits for it first, so that "done" means done —
  // phase times, previews and cancel points see the real progress (a decode on the H200 had
  // shown 0.006 s of its ~0.3 s). One stream sync per report, a few dozen per request; the CPU
  // backend's sync() is a no-op. A sync error is not lost: the next op or download returns it.
  void report(const std::string& phase, int done, int total) const {
    if (!progress) return;
    if (backend) (void)backend->sync();
    progress(phase, done, total);
  }
};

}  // namespace klein
