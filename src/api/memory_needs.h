// Estimates what a request needs (api/memory_plan.h's MemoryNeeds) from the models' weights
// (sizes read once at open, per block) and the request's shapes.
#pragma once

#include <cstdint>
#include <filesystem>

#include "api/components.h"
#include "api/layout.h"
#include "api/memory_plan.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"

namespace klein::api {

// The weights' sizes, measured once (mapping the files, touching no tensor data).
struct WeightSizes {
  BlockedWeights te, dit;        // te.outside without the embedding table
  uint64_t te_embed_row = 0;     // bytes of one embedding row (only the prompt's rows are read)
  uint64_t te_embed_total = 0;
  uint64_t vae = 0;
  bool converts = false;         // a weight format the GEMMs expand per slab (not f32/bf16/f16)
};
// `loras` (LoadOptions::loras): their factors and merged copies count as resident weights
// outside the blocks (api/components.h read_loras, models/lora_apply.h lora_memory).
Result<WeightSizes> measure_weights(const ComponentSpec& te, int te_layers, const ComponentSpec& dit,
                                    const ComponentSpec& vae, const LoraSetup& loras = {});
// Pure helpers behind measure_weights (exposed for tests).
BlockedWeights blocked_weights(Flux2Transformer& m);
BlockedWeights blocked_weights(Qwen3Encoder& m, uint64_t* embed_row, uint64_t* embed_total);

struct RequestShape {
  int64_t width = 0, height = 0;  // output pixels
  int64_t text_tokens = 512;
  int64_t ref_tokens = 0;         // reference image tokens (editing)
  int threads = 1;
  bool editing = false;
  bool cfg = false;               // classifier-free guidance: negative embeddings, a second velocity
  bool inpaint = false;           // inpainting / image-to-image: the source's tokens, noise and mask kept
  bool kv = false;                // the KV variant: the references' keys and values of every block
  bool kv_bf16 = false;           // ... stored as bf16 (fast)
};
MemoryNeeds estimate_needs(const WeightSizes& w, const Qwen3Config& te, const Flux2Config& dit,
                           const Flux2VaeConfig& vae, const RequestShape& r);

// This process's resident set now (/proc/self/statm), 0 when unknown.
uint64_t process_rss_bytes();

}  // namespace klein::api
