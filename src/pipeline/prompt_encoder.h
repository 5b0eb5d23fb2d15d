// Prompt -> prompt_embeds, as Flux2KleinPipeline._get_qwen3_prompt_embeds: klein chat template,
// right-padded to max_length, Qwen3 hidden states 9/18/27 concatenated per token.
#pragma once

#include <string>
#include <vector>

#include "backend/run_context.h"
#include "core/status.h"
#include "core/tensor.h"
#include "models/qwen3.h"
#include "pipeline/tokenizer.h"

namespace klein {

inline constexpr int kKleinMaxSequenceLength = 512;
inline const std::vector<int> kKleinTextTaps = {9, 18, 27};
// Layers the text encoder needs: the deepest tap (27); later layers are never loaded.
inline constexpr int kKleinTextLayersNeeded = 27;

struct PromptEncoding {
  Tensor embeds;                 // [1, max_length, 3 * hidden]
  std::vector<int32_t> ids;      // [max_length]
  std::vector<int32_t> mask;     // [max_length]
  int num_real_tokens = 0;
  int untruncated_length = 0;
};

// Tokenizes and encodes with a loaded tokenizer and text encoder (loading is the caller's: see
// src/api/components.h). Dumps "prompt_embeds".
Result<PromptEncoding> encode_prompt(const Tokenizer& tokenizer, const Qwen3Encoder& encoder,
                                     const std::string& prompt, const RunContext& ctx,
                                     int max_length = kKleinMaxSequenceLength);

}  // namespace klein
