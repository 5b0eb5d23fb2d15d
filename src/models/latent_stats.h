// The VAE's latent batch-norm statistics, as the types the VAE produces them in and the pipeline
// (pipeline/latents.h) normalises with.
#pragma once

#include <vector>

namespace klein {

// Per-channel statistics of the patchified latent (128 channels for FLUX.2):
// mean = bn.running_mean, std = sqrt(bn.running_var + batch_norm_eps).
struct LatentStats {
  std::vector<float> mean;
  std::vector<float> std;
};

// How the pipeline's element-wise ops round.
//   kF32:  a float32 pipeline: every op in float32.
//   kBF16: a bfloat16 pipeline: the latent and the stats are bf16 and every op's result is
//          rounded to bf16 (x − mean rounds, / std rounds; x · std rounds, + mean rounds).
enum class LatentArith { kF32, kBF16 };

}  // namespace klein
