// Inpainting and image-to-image as diffusers 0.42.1's Flux2KleinInpaintPipeline computes them
// (pipeline_flux2_klein_inpaint.py __call__, prepare_latents, prepare_mask_latents, get_timesteps;
// scheduling_flow_match_euler_discrete.py scale_noise), bit for bit in float32:
//   1. The source image: if w·h > 1024² resized (Lanczos) to int(w·s) × int(h·s),
//      s = sqrt(1024² / (w·h)); then Lanczos-RESIZED (not cropped) to the multiples of 16 below
//      its size, which is the output size (any width/height asked for is not used); [-1, 1].
//   2. Its VAE latents (posterior mean, patchified, batch-norm normalised) are the blend target
//      AND the first reference of every transformer call (T = 10; further references T = 20, ...).
//   3. The mask: Lanczos-resized to the output size in RGB, then Pillow's convert("L"), /255,
//      binarised (< 0.5 → 0, else 1; white = repaint), then torch's bilinear interpolation
//      (align_corners False) down to one weight per latent token: the mean of the 2×2 pixels
//      at the centre of each 16×16 patch, so a weight is 0, ¼, ½, ¾ or 1.
//   4. The schedule of N steps is cut by `strength` (get_timesteps): t_start =
//      int(max(N − min(N·strength, N), 0)) in double, the last N − t_start steps run.
//   5. The start latents: scale_noise(image_latents, σ[t_start], noise) = σ·noise + (1 − σ)·x0.
//   6. After every Euler step: latents = (1 − m)·x0' + m·latents, x0' the source latents re-noised
//      to the next step's sigma (the clean latents after the last step).
// Image-to-image (no mask) is the same with every weight 1 (diffusers has no klein img2img
// pipeline; this is its inpainting pipeline with an all-white mask).
#pragma once

#include <string>
#include <vector>

#include "backend/run_context.h"
#include "core/status.h"
#include "core/tensor.h"
#include "klein/klein.h"
#include "pipeline/denoise.h"
#include "pipeline/scheduler.h"

namespace klein {

// diffusers' defaults for Flux2KleinInpaintPipeline.__call__.
inline constexpr double kInpaintDefaultStrength = 0.8;
inline constexpr double kInpaintDefaultGuidance = 8.0;

// Step 1: the source image as the float32 [1, 3, H, W] tensor in [-1, 1] the VAE encodes. An
// image under 16 pixels on a side is an error naming `name`.
Result<Tensor> preprocess_source_image(const Image& image, const std::string& name);

// Step 3: one weight per latent token (row-major, (height/16)·(width/16) of them) from the mask
// image, whatever its size; width and height are the output's (multiples of 16).
std::vector<float> preprocess_mask(const Image& mask, int width, int height);

// Pillow's convert("L") of one RGB pixel (ITU-R 601-2 luma in 16-bit fixed point, rounded).
inline uint8_t pillow_luma(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
}

// Step 4: the index of the first step that runs. strength must be in (0, 1].
int strength_start_step(int steps, double strength);
// The schedule from step `t_start` on (timesteps and sigmas dropped before it).
Schedule cut_schedule(const Schedule& full, int t_start);

// scale_noise: out = f32(σ·noise) + f32(f32(1 − σ)·x), each operation rounded to float32.
void scale_noise(float* out, const float* x, const float* noise, int64_t n, float sigma);
// The blend of step 6 for tokens of `channels` features: latents = f32((1 − m)·x0') + f32(m·latents).
void inpaint_blend(float* latents, const float* renoised, const float* mask, int64_t tokens, int64_t channels);

// A request's inpainting state during the denoising loop: the packed source latents and noise
// [N, 128], the token weights [N] and the sigmas of the steps that run.
struct InpaintRun {
  Tensor image_tokens, noise_tokens;
  std::vector<float> mask;
  std::vector<float> sigmas;
  Tensor renoised;  // scratch [N, 128]

  // image_latents and noise [1, 128, th, tw]; `schedule` the cut one. Returns the start latents
  // [1, 128, th, tw] (step 5). Dumps "image_latents", "init_latents" and "mask".
  static Result<InpaintRun> make(const Tensor& image_latents, const Tensor& noise, std::vector<float> mask,
                                 const Schedule& schedule, Tensor* start, const RunContext& ctx);
  // after_step runs step 6 (the object must outlive the loop).
  StepHooks hooks();
};

}  // namespace klein
