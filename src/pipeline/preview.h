// Live previews: the predicted clean latent of a denoising step, x0 = x − σ·v (rectified flow),
// mapped to RGB by a fixed linear map per VAE latent channel plus a bias — no network, a few
// milliseconds at 1024².
//
// The map is data: data/flux2_latent_rgb.json (ComfyUI's Flux2 latent_rgb_factors), embedded in
// the library at build time so an installed libklein needs no file beside it. Its
// "denormalized" flag says which latent domain it expects. We ship `true`: ComfyUI applies
// latent_rgb_factors to the latent its VAE decodes, i.e. after the batch-norm de-normalisation
// and unpatchify — the same domain our `latents_final` dump is in.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "klein/klein.h"
#include "models/latent_stats.h"

namespace klein {

struct LatentRgbMap {
  int64_t latent_channels = 0;  // C (32 for FLUX.2); the packed latent has 4·C channels
  bool denormalized = true;     // apply to z·std + mean (true) or to the normalised latent (false)
  std::vector<float> factors;   // [C, 3] row-major: factors[c·3 + k], k = R, G, B
  std::array<float, 3> bias{};
};

// Parses a map file's text; `where` names it in messages.
Result<LatentRgbMap> parse_latent_rgb_map(const std::string& json_text, const std::string& where);
// The FLUX.2 map embedded at build time (parsed once).
Result<LatentRgbMap> flux2_latent_rgb_map();

// x, v: packed tokens [th·tw, 4·C] (token n = y·tw + x, channel c·4 + py·2 + px ↔ latent channel
// c at pixel (2y+py, 2x+px)); sigma: the step's σ. stats: the VAE's batch-norm statistics of
// the 4·C packed channels (used when map.denormalized). Returns an out_w × out_h image:
// the 2th × 2tw projection upsampled by nearest neighbour, [-1, 1] clamped → [0, 255].
Result<Image> latent_preview(const Tensor& x, const Tensor& v, float sigma, int64_t th, int64_t tw,
                             const LatentRgbMap& map, const LatentStats& stats, int out_w, int out_h);

}  // namespace klein
