// Reference images for editing: read + preprocess before any model work (so bad files fail
// fast), then VAE-encode into normalised packed tokens with their RoPE ids (T = 10 + 10·i).
#pragma once

#include <string>
#include <vector>

#include "backend/run_context.h"
#include "core/tensor.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"

namespace klein {

// A preprocessed reference: [1, 3, H, W] in [-1, 1], H and W multiples of 16.
struct PreparedReference {
  std::string path;
  Tensor pixels;
};

// Reads and preprocesses each image exactly as Flux2KleinPipeline does (validation, downscale
// to <= 1024² px with PIL's Lanczos, centre crop to multiples of 16).
Result<std::vector<PreparedReference>> prepare_references(const std::vector<std::string>& paths);

struct ReferenceTokens {
  Tensor tokens;  // [S_ref, 128]: all references' tokens, in order
  Flux2Ids ids;   // S_ref ids: (10 + 10·i, y, x, 0)
};

// VAE encode (posterior mean) -> patchify -> batch-norm normalise, for each reference:
// [1, 128, H/16, W/16] each.
Result<std::vector<Tensor>> encode_reference_latents(const Flux2Vae& vae, const std::vector<PreparedReference>& refs,
                                                     const RunContext& ctx, const VaeTiling& tiling = {});

// Packs normalised reference latents into tokens with their ids (reference i: T = 10 + 10·i).
// Dumps "ref_latents" [1, S_ref, 128].
Result<ReferenceTokens> pack_reference_tokens(const std::vector<Tensor>& latents, const RunContext& ctx);

// Both of the above.
Result<ReferenceTokens> encode_references(const Flux2Vae& vae, const std::vector<PreparedReference>& refs,
                                          const RunContext& ctx);

}  // namespace klein
