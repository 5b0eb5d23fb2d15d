#include "api/residency.h"

namespace klein::api {

RunContext BlockStreamer::hooked(const RunContext& ctx) {
  RunContext c = ctx;
  c.on_block = [this](int i) { enter(i); };
  return c;
}

void BlockStreamer::advise(int i, Residency r) const {
  if (i < 0 || i >= static_cast<int>(blocks_.size())) return;
  for (const auto& [p, n] : blocks_[i]) source_->advise(p, n, r);
}

void BlockStreamer::enter(int i) {
  if (current_ >= 0 && current_ != i) advise(current_, Residency::kDontNeed);
  current_ = i;
  // The transformer runs its blocks once per step: after the last comes the first again.
  if (!blocks_.empty()) advise((i + 1) % static_cast<int>(blocks_.size()), Residency::kWillNeed);
}

void BlockStreamer::finish() {
  if (current_ >= 0) advise(current_, Residency::kDontNeed);
  current_ = -1;
}

}  // namespace klein::api
