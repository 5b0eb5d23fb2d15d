// Applying parsed LoRA files (io/lora.h) to a bound model, before Backend::prepare:
//   merge:   W ← W + s·ΔW into a copy of each float weight (F32/F16/BF16), as PEFT's merge
//            (diffusers fuse_lora) computes it: ΔW = (up·down)·(alpha/rank·strength) in float32,
//            rounded to the weight's type, then added and rounded again; no per-step cost. With
//            `merge_to_f32` (klein's float32 path, like diffusers' float32 pipeline, which upcasts
//            bf16 checkpoints before fusing) the copy is float32 and nothing is rounded.
//   runtime: the factors ride on the Weight (Weight::lora) and the backend adds
//            s·(x·downᵀ)·upᵀ beside the GEMM (quantized bases: Q8/Q4/GGUF/FP8, which are never
//            rewritten; and switching LoRAs without reloading).
//   auto:    merge where the weight is float, runtime elsewhere.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/lora.h"
#include "models/flux2_dit.h"
#include "models/qwen3.h"

namespace klein {

enum class LoraApply : uint8_t { kAuto, kMerge, kRuntime };

// One LoRA file with the strength it is applied at.
struct LoraUse {
  std::shared_ptr<const LoraFile> file;
  float strength = 1.0f;
};

// The weights of each model that a LoRA may change (the 2-D weights of its tensor table).
std::vector<LoraTarget> lora_targets(const Flux2Transformer& m);
std::vector<LoraTarget> lora_targets(const Qwen3Encoder& m);

// Applies every LoRA's deltas for the model's component, in order. `merged` / `runtime` (if
// given) count the weights changed each way.
Status apply_loras(Flux2Transformer& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32 = false,
                   int* merged = nullptr, int* runtime = nullptr);
Status apply_loras(Qwen3Encoder& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32 = false,
                   int* merged = nullptr, int* runtime = nullptr);

// What applying `loras` keeps in memory beyond the model's own weights: the factors (float32)
// and, for each weight merged, its new copy (an upper bound for planning; nothing is applied).
uint64_t lora_memory(const Flux2Transformer& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32);
uint64_t lora_memory(const Qwen3Encoder& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32);

// W + s·ΔW for one float weight, as apply_loras merges it: a new owned Weight (exposed for tests).
// `out`: F32, or w's own type (then PEFT's roundings).
Result<Weight> merge_lora_deltas(const Weight& w, const std::vector<std::pair<const LoraDelta*, float>>& deltas,
                                 DType out);

}  // namespace klein
