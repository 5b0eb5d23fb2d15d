// The transformer and decode phases of Flux2KleinPipeline.__call__ on loaded components:
// the Euler flow-matching loop over packed latent tokens (with reference tokens appended), and
// the VAE decode with diffusers' 8-bit post-processing.
#pragma once

#include <functional>
#include <string>

#include "backend/buffer_pool.h"
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

// One text condition of the transformer: prompt embeddings [1, L, joint_attention_dim] on the
// backend's device (uploaded once per request, not once per step) and their text position ids.
struct TextCondition {
  Tensor up;                     // the device copy, when the host tensor is not on the device
  const Tensor* embeds = nullptr;
  Flux2Ids txt_ids;
  static Result<TextCondition> make(Backend& be, const Tensor& prompt_embeds, const std::string& what);
};

// Combines the conditional and unconditional velocities as Flux2KleinPipeline does
// (`neg + guidance_scale * (pos - neg)`, each operation rounded to float32 as torch's tensors
// are, no fused multiply-add): v_cond is overwritten with the guided velocity.
void cfg_combine(float* v_cond, const float* v_uncond, int64_t n, float guidance_scale);

// What a denoising step asks for: the velocity of the N noise tokens for the model input
// `model_in` ([N + S_ref, 128] on the device: the latents, then the reference tokens) at
// timestep t (the schedule's, 0..1000), on the host [N, 128].
class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual Result<Tensor> predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids,
                                 const RunContext& ctx, BufferPool* work) = 0;
  // Once before the loop, with the request's image ids (noise tokens, then references): what
  // every step would otherwise rebuild (the transformer's RoPE tables).
  virtual Status prepare(const Flux2Ids& img_ids, const RunContext& ctx) = 0;
  // Transformer calls per step (1 plain, 2 with guidance).
  virtual int calls_per_step() const = 0;
};

// The distilled models (and base models at guidance <= 1): one call on the prompt.
class PlainPredictor final : public Predictor {
 public:
  PlainPredictor(const Flux2Transformer& dit, const TextCondition& cond) : dit_(&dit), cond_(&cond) {}
  Result<Tensor> predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids, const RunContext& ctx,
                         BufferPool* work) override;
  Status prepare(const Flux2Ids& img_ids, const RunContext& ctx) override;
  int calls_per_step() const override { return 1; }

 private:
  const Flux2Transformer* dit_;
  const TextCondition* cond_;
  std::optional<Flux2Rope> rope_;  // after prepare
};

// Classifier-free guidance (base models, guidance_scale > 1): the prompt's call, then the
// negative prompt's, combined by cfg_combine.
class CfgPredictor final : public Predictor {
 public:
  CfgPredictor(const Flux2Transformer& dit, const TextCondition& cond, const TextCondition& uncond, float scale)
      : cond_(dit, cond), uncond_(dit, uncond), scale_(scale) {}
  Result<Tensor> predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids, const RunContext& ctx,
                         BufferPool* work) override;
  Status prepare(const Flux2Ids& img_ids, const RunContext& ctx) override;
  int calls_per_step() const override { return 2; }

 private:
  PlainPredictor cond_, uncond_;
  float scale_;
};

// The KV-cached editing distill (diffusers' Flux2KleinKVPipeline): the first call with reference
// tokens is the transformer's "extract" call (references first, modulated at timestep 0, attending
// to themselves only, their keys and values stored in `cache`); every later call runs only the
// text and noise tokens against the cached keys and values. Without references, the plain call.
// The cache depends on the references alone, so a filled one serves later images of a batch too.
class KvPredictor final : public Predictor {
 public:
  // bf16_cache: store the cache as packed bf16 (half the memory; `fast`), else float32.
  KvPredictor(const Flux2Transformer& dit, const TextCondition& cond, Flux2KvCache& cache, bool bf16_cache)
      : dit_(&dit), cond_(&cond), cache_(&cache), bf16_(bf16_cache), plain_(dit, cond) {}
  Result<Tensor> predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids, const RunContext& ctx,
                         BufferPool* work) override;
  // The plain call's tables; the cached calls' (text + noise tokens) are made at the first of them.
  Status prepare(const Flux2Ids& img_ids, const RunContext& ctx) override { return plain_.prepare(img_ids, ctx); }
  int calls_per_step() const override { return 1; }

 private:
  const Flux2Transformer* dit_;
  const TextCondition* cond_;
  Flux2KvCache* cache_;
  bool bf16_;
  PlainPredictor plain_;                  // no references
  std::optional<Flux2Rope> cached_rope_;  // the cached calls' RoPE tables
};

// Hooks around every step i (0-based), all optional; an error stops the loop with it.
struct StepHooks {
  // Before the prediction, on the latents [N, 128] (packed): e.g. an img2img or inpainting start.
  std::function<Status(int i, Tensor& latents)> before_step;
  // After the Euler update, on the new latents: e.g. inpainting's blend of the re-noised source.
  std::function<Status(int i, Tensor& latents)> after_step;
};

// noise: [1, 128, th, tw]. Returns the final latents [1, 128, th, tw] (normalised space), finite
// or an error. Reports ("denoise", i, steps) and dumps velocity_step<k> (the guided velocity) /
// latents_step<k>; with `preview`, calls it after every step. Cancellation is polled before
// every step (ctx.check_cancel).
Result<Tensor> run_denoise(Predictor& predictor, const ReferenceTokens& refs, Tensor noise, const Schedule& schedule,
                           const RunContext& ctx, const StepPreview* preview = nullptr, const StepHooks* hooks = nullptr);

// z: [1, 128, th, tw] normalised latents -> the VAE's image [1, 3, 16·th, 16·tw], finite or an
// error. Dumps "latents_final" (the VAE input) and "image".
// `tiling`: the VAE's tiled decoding (models/flux2_vae.h).
Result<Tensor> decode_latents(const Flux2Vae& vae, Tensor z, const RunContext& ctx, const VaeTiling& tiling = {});

// (x * 0.5 + 0.5).clamp(0, 1), then (x * 255).round() half-to-even, as diffusers' "pil" output.
Image to_rgb8(const Tensor& image);

}  // namespace klein
