// The transformer and decode phases of Flux2KleinPipeline.__call__ on loaded components:
// the Euler flow-matching loop over packed latent tokens (with reference tokens appended), and
// the VAE decode with diffusers' 8-bit post-processing.
#pragma once

#include "backend/run_context.h"
#include "core/tensor.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "pipeline/preview.h"
#include "pipeline/references.h"
#include "pipeline/scheduler.h"

namespace klein {

// Live previews during denoising: after each step, `callback(step, steps, image)` with the
// step's predicted clean latent projected by `map` (pipeline/preview.h), width × height.
struct StepPreview {
  LatentRgbMap map;
  LatentStats stats;  // the VAE's batch-norm statistics (map.denormalized)
  int width = 0, height = 0;
  std::function<void(int step, int total, const Image& image)> callback;
};

// noise: [1, 128, th, tw]; prompt_embeds: [1, L, joint_attention_dim]. Returns the final
// latents [1, 128, th, tw] (normalised space), finite or an error. Reports ("denoise", i, steps)
// and dumps velocity_step<k> / latents_step<k>; with `preview`, calls it after every step.
Result<Tensor> run_denoise(const Flux2Transformer& dit, const Tensor& prompt_embeds, const ReferenceTokens& refs,
                           Tensor noise, const Schedule& schedule, const RunContext& ctx,
                           const StepPreview* preview = nullptr);

// z: [1, 128, th, tw] normalised latents -> the VAE's image [1, 3, 16·th, 16·tw], finite or an
// error. Dumps "latents_final" (the VAE input) and "image".
// `tiling`: the VAE's tiled decoding (models/flux2_vae.h).
Result<Tensor> decode_latents(const Flux2Vae& vae, Tensor z, const RunContext& ctx, const VaeTiling& tiling = {});

// (x * 0.5 + 0.5).clamp(0, 1), then (x * 255).round() half-to-even, as diffusers' "pil" output.
Image to_rgb8(const Tensor& image);

}  // namespace klein
