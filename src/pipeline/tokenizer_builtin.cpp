// The tokenizer built into the library: cmake/embedded_tokenizer.S.in assembles the real
// FLUX.2-klein tokenizer.json (Qwen3's) into read-only data, so that single-file checkpoints
// (a DiT, a VAE and a text encoder, none of which carries a tokenizer) need no other file.
#include <cstdint>
#include <string_view>

#include "pipeline/tokenizer.h"

extern "C" {
extern const char klein_builtin_tokenizer_json[];
extern const uint64_t klein_builtin_tokenizer_json_size;
}

namespace klein {

std::string_view Tokenizer::builtin_json() {
  return std::string_view(klein_builtin_tokenizer_json, klein_builtin_tokenizer_json_size);
}

Result<Tokenizer> Tokenizer::builtin() { return from_json_text(builtin_json(), "the built-in Qwen3 tokenizer"); }

}  // namespace klein
