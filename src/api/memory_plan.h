// The memory planner of LoadOptions::max_memory_gib: from a request's estimated needs (weights,
// activations, kernel scratch, the process itself), which weights to stream block by block and
// which VAE tile to use so that the peak of every phase stays under the budget. Pure: sizes in,
// a plan out (unit-tested with synthetic sizes); memory_needs.cpp estimates the sizes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"

namespace klein::api {

// Weights of a model that runs in blocks. Streaming keeps `outside` plus one block resident.
struct BlockedWeights {
  uint64_t total = 0;          // everything a request touches
  uint64_t largest_block = 0;  // the largest block's weights
  uint64_t outside = 0;        // weights outside the blocks (embeddings, modulations, ...)
};

struct MemoryNeeds {
  uint64_t base = 0;     // the process before model work (code, tokenizer, configs)
  uint64_t scratch = 0;  // kernel scratch, all threads (grow-only: counts in every phase)
  BlockedWeights te, dit;
  uint64_t te_activations = 0;   // the encode phase's buffers
  uint64_t dit_activations = 0;  // the denoise phase's buffers, the prompt embeddings included
  uint64_t vae_weights = 0;
  uint64_t vae_whole = 0;        // activations of the whole-image decode
  // Activations of a decode in tiles of `tile` pixels, kept activations excluded.
  std::function<uint64_t(int64_t tile)> vae_tiled;
  int64_t vae_forced_tile = 0;   // LoadOptions::vae_tile: > 0 forced, < 0 never tile, 0 planner's choice
  bool resident = false;         // MemoryPolicy::kResident: earlier phases' touched weights stay
  bool vae_during_denoise = false;  // editing: the VAE stays mapped from encoding to decoding
  bool encode_only = false;      // Model::encode_prompt: no denoise or decode phase follows
};

struct MemoryPlan {
  bool stream_te = false, stream_dit = false;
  int64_t vae_tile = 0;          // 0: the whole image
  uint64_t vae_keep_bytes = 0;   // VaeTiling::keep_bytes
  bool encode_only = false;      // MemoryNeeds::encode_only: denoise and decode are 0
  uint64_t encode = 0, denoise = 0, decode = 0;  // estimated peak of each phase
  uint64_t peak() const;
  std::string summary() const;   // one line
};

// The cheapest plan under `budget` bytes (streaming the text encoder before the transformer,
// which reads its weights once per step; the largest VAE tile that fits), or kOutOfMemory with
// "--max-memory G: this request needs at least N GiB (...)" naming the tightest phase.
Result<MemoryPlan> plan_memory(const MemoryNeeds& needs, uint64_t budget);

std::string gib(uint64_t bytes);  // "2.31"

// Tests only: called on every plan a Model makes (the tiny model's weights are too small for a
// budget to make it stream, so the streaming tests force it here). Empty: none.
void set_plan_adjuster(std::function<void(MemoryPlan&)> fn);
const std::function<void(MemoryPlan&)>& plan_adjuster();

}  // namespace klein::api
