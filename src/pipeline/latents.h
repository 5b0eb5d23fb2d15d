// FLUX.2 latent layout helpers shared by the pipeline and the VAE:
//   - patchify / unpatchify between the VAE's 32-channel latent and the 128-channel space the
//     transformer works in (reference doc §4.4, pipeline_flux2_klein.py _patchify_latents /
//     _unpatchify_latents);
//   - the batch-norm normalisation of the patchified latent with the VAE's bn running stats
//     (§4.5, _encode_vae_image and the decode path of __call__).
#pragma once

#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "models/latent_stats.h"

namespace klein {

// [B, C, 2h, 2w] → [B, 4C, h, w]; out channel k = c·4 + py·2 + px holds z[c, 2y+py, 2x+px].
// Odd spatial sizes are an error (the pipeline only makes even ones).
Result<Tensor> patchify(const Tensor& z);
// Exact inverse: [B, 4C, h, w] → [B, C, 2h, 2w].
Result<Tensor> unpatchify(const Tensor& z);

// Token packing (_pack_latents / _unpack_latents_with_ids): [1, C, h, w] <-> [h*w, C], token
// n = y*w + x, feature = channel.
Tensor pack_latents(const Tensor& z);
Tensor unpack_latents(const Tensor& tokens, int64_t h, int64_t w);


// In place on [B, C, h, w] with C == stats size:  z = (z − mean) / std   (encode side).
Status normalize_latents(Tensor& z, const LatentStats& stats, LatentArith arith = LatentArith::kF32);
// In place:  z = z · std + mean   (decode side, before unpatchify).
Status denormalize_latents(Tensor& z, const LatentStats& stats, LatentArith arith = LatentArith::kF32);

}  // namespace klein
