// Low-rank (or dense) weight deltas applied beside a linear at run time: y += s·(x·Aᵀ)·Bᵀ per
// term, so a LoRA changes a quantized or shared base weight without rewriting it (io/lora.h
// parses the files, models/lora_apply.h attaches the terms to a model's Weights).
#pragma once

#include <cstdint>
#include <vector>

namespace klein {

// One LoRA's change of rows [row0, row0 + rows) of a [*, cols] weight, in float32:
//   rank > 0: ΔW = scale · up[rows, rank] · down[rank, cols]
//   rank == 0: ΔW = scale · down[rows, cols] (a dense delta: LoKr, LoHa)
struct LowRankTerm {
  int64_t row0 = 0, rows = 0, cols = 0, rank = 0;
  float scale = 1.0f;
  std::vector<float> down, up;
};

// Every term on one weight, applied in order (their sum is added to the linear's output).
struct LoraTerms {
  std::vector<LowRankTerm> terms;
  size_t bytes() const {
    size_t n = 0;
    for (const LowRankTerm& t : terms) n += (t.down.size() + t.up.size()) * sizeof(float);
    return n;
  }
};

}  // namespace klein
