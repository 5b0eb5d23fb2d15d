#include "pipeline/denoise.h"

#include <algorithm>
#include <cmath>

#include "backend/buffer_pool.h"
#include "backend/transfer.h"
#include "pipeline/latents.h"
#include "pipeline/noise.h"

namespace klein {

Result<TextCondition> TextCondition::make(Backend& be, const Tensor& prompt_embeds, const std::string& what) {
  TextCondition c;
  KLEIN_ASSIGN_OR_RETURN(c.embeds, on_device(be, prompt_embeds, c.up, what));
  c.txt_ids = flux2_text_ids(static_cast<int>(prompt_embeds.dim(1)));
  return c;
}

// (Compiled with -ffp-contract=off: three roundings, as torch's three tensor operations.)
void cfg_combine(float* v_cond, const float* v_uncond, int64_t n, float guidance_scale) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = v_cond[i] - v_uncond[i];  // noise_pred - neg_noise_pred
    const float s = guidance_scale * d;       // guidance_scale * (...)
    v_cond[i] = v_uncond[i] + s;              // neg_noise_pred + ...
  }
}

Result<Tensor> PlainPredictor::predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids,
                                       const RunContext& ctx, BufferPool* work) {
  // Only the noise tokens' prediction is used: the reference tokens' rows are not computed.
  KLEIN_ASSIGN_OR_RETURN(Tensor out, dit_->forward(model_in, *cond_->embeds, t / 1000.0f, img_ids, cond_->txt_ids,
                                                   ctx, std::nullopt, N, work, rope_ ? &*rope_ : nullptr));
  return ctx.be().download(out);
}

Status PlainPredictor::prepare(const Flux2Ids& img_ids, const RunContext& ctx) {
  KLEIN_ASSIGN_OR_RETURN(rope_, dit_->rope(img_ids, cond_->txt_ids, ctx.be()));
  return Status::Ok();
}

Status CfgPredictor::prepare(const Flux2Ids& img_ids, const RunContext& ctx) {
  KLEIN_RETURN_IF_ERROR(cond_.prepare(img_ids, ctx));
  return uncond_.prepare(img_ids, ctx);
}

Result<Tensor> CfgPredictor::predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids,
                                     const RunContext& ctx, BufferPool* work) {
  KLEIN_ASSIGN_OR_RETURN(Tensor v, cond_.predict(model_in, t, N, img_ids, ctx, work));
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("denoising"));
  KLEIN_ASSIGN_OR_RETURN(Tensor vu, uncond_.predict(model_in, t, N, img_ids, ctx, work));
  cfg_combine(v.data(), vu.data(), v.numel(), scale_);
  return v;
}

Result<Tensor> KvPredictor::predict(const Tensor& model_in, float t, int64_t N, const Flux2Ids& img_ids,
                                    const RunContext& ctx, BufferPool* work) {
  const int64_t S_ref = model_in.dim(0) - N;
  if (S_ref == 0) return plain_.predict(model_in, t, N, img_ids, ctx, work);
  Backend& be = ctx.be();
  const int64_t C = model_in.dim(1);
  Flux2KvStep kv;
  kv.cache = cache_;
  Tensor in;
  Flux2Ids ids;
  if (!cache_->filled()) {
    // Extract: [references; noise], as the pipeline concatenates them (ids likewise).
    kv.mode = Flux2KvStep::Mode::kExtract;
    kv.ref_tokens = S_ref;
    kv.bf16 = bf16_;
    KLEIN_ASSIGN_OR_RETURN(in, be.alloc({S_ref + N, C}, "the transformer input"));
    KLEIN_RETURN_IF_ERROR(be.copy(model_in.view().row_range(N, N + S_ref), in.view().row_range(0, S_ref)));
    KLEIN_RETURN_IF_ERROR(be.copy(model_in.view().row_range(0, N), in.view().row_range(S_ref, S_ref + N)));
    ids.assign(img_ids.begin() + N, img_ids.end());
    ids.insert(ids.end(), img_ids.begin(), img_ids.begin() + N);
  } else {
    if (cache_->ref_tokens != S_ref)
      return internal_error("KV cache of " + std::to_string(cache_->ref_tokens) + " reference tokens used with " +
                            std::to_string(S_ref));
    kv.mode = Flux2KvStep::Mode::kCached;
    KLEIN_ASSIGN_OR_RETURN(in, be.alloc({N, C}, "the transformer input"));
    KLEIN_RETURN_IF_ERROR(be.copy(model_in.view().row_range(0, N), in.view()));
    ids.assign(img_ids.begin(), img_ids.begin() + N);
    if (!cached_rope_) {
      KLEIN_ASSIGN_OR_RETURN(cached_rope_, dit_->rope(ids, cond_->txt_ids, be));
    }
  }
  const Flux2Rope* rope = kv.mode == Flux2KvStep::Mode::kCached ? &*cached_rope_ : nullptr;  // extract: once
  KLEIN_ASSIGN_OR_RETURN(Tensor out, dit_->forward(in, *cond_->embeds, t / 1000.0f, ids, cond_->txt_ids, ctx,
                                                   std::nullopt, N, work, rope, &kv));
  return be.download(out);
}

Result<Tensor> run_denoise(Predictor& predictor, const ReferenceTokens& refs, Tensor noise, const Schedule& schedule,
                           const RunContext& ctx, const StepPreview* preview, const StepHooks* hooks) {
  const int64_t th = noise.dim(2), tw = noise.dim(3);
  const int steps = static_cast<int>(schedule.timesteps.size());
  // Model input tokens: the N noisy latents, then the reference tokens (ids T = 10, 20, ...).
  Flux2Ids img_ids = flux2_image_ids(static_cast<int>(th), static_cast<int>(tw), 0);
  img_ids.insert(img_ids.end(), refs.ids.begin(), refs.ids.end());
  const int64_t N = th * tw, S_ref = refs.tokens.empty() ? 0 : refs.tokens.dim(0);
  // The latents and the Euler update stay on the host (bit-exact float32, as the scheduler does
  // it); the transformer input and output live on the backend's device: per step the N latent
  // rows go up and the N velocity rows come back (on the CPU backend, two small copies).
  Backend& be = ctx.be();
  Tensor latents = pack_latents(noise);  // [N, 128]
  KLEIN_ASSIGN_OR_RETURN(Tensor model_in, be.alloc({N + S_ref, 128}, "the transformer input"));
  if (S_ref) {
    KLEIN_ASSIGN_OR_RETURN(Tensor rt, be.upload(refs.tokens.data(), {S_ref, 128}, "the reference tokens"));
    KLEIN_RETURN_IF_ERROR(be.copy(rt, model_in.view().row_range(N, N + S_ref)));
  }
  BufferPool work(be);  // the transformer's work buffers, reused by every step
  KLEIN_RETURN_IF_ERROR(predictor.prepare(img_ids, ctx));  // the RoPE tables, once per request
  ctx.report("denoise", 0, steps);
  for (int i = 0; i < steps; ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("denoising"));
    if (hooks && hooks->before_step) KLEIN_RETURN_IF_ERROR(hooks->before_step(i, latents));
    const float t = schedule.timesteps[i];
    {
      KLEIN_ASSIGN_OR_RETURN(Tensor x, be.upload(latents.data(), {N, 128}, "the latents"));
      KLEIN_RETURN_IF_ERROR(be.copy(x, model_in.view().row_range(0, N)));
    }
    KLEIN_ASSIGN_OR_RETURN(Tensor v, predictor.predict(model_in, t, N, img_ids, ctx, &work));
    // The preview is x0 = x − σ_i·v of this step's input x, so it is made before the update.
    Image preview_image;
    if (preview && preview->callback) {
      KLEIN_ASSIGN_OR_RETURN(preview_image, latent_preview(latents, v, schedule.sigmas[i], th, tw, preview->map,
                                                           preview->stats, preview->width, preview->height));
    }
    KLEIN_RETURN_IF_ERROR(euler_step(latents, v, schedule.sigmas[i], schedule.sigmas[i + 1]));
    if (hooks && hooks->after_step) KLEIN_RETURN_IF_ERROR(hooks->after_step(i, latents));
    if (ctx.dumper) {
      ctx.dump("velocity_step" + std::to_string(i + 1), unpack_latents(v, th, tw));
      ctx.dump("latents_step" + std::to_string(i + 1), unpack_latents(latents, th, tw));
    }
    ctx.report("denoise", i + 1, steps);
    if (preview && preview->callback) preview->callback(i + 1, steps, preview_image);
  }
  Tensor z = unpack_latents(latents, th, tw);  // [1, 128, th, tw]
  if (!all_finite(z.data(), z.numel()))
    return internal_error("denoising produced non-finite latents (NaN/Inf); no image written");
  return z;
}

Result<Tensor> decode_latents(const Flux2Vae& vae, Tensor z, const RunContext& ctx, const VaeTiling& tiling) {
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("decoding"));
  KLEIN_RETURN_IF_ERROR(denormalize_latents(z, vae.latent_stats()));
  KLEIN_ASSIGN_OR_RETURN(Tensor zu, unpatchify(z));  // [1, 32, 2*th, 2*tw]: the VAE's input
  ctx.dump("latents_final", zu);
  KLEIN_ASSIGN_OR_RETURN(Tensor dev, vae.decode(zu, ctx, tiling));
  KLEIN_ASSIGN_OR_RETURN(Tensor image, to_host(ctx.be(), std::move(dev)));
  ctx.dump("image", image);
  if (!all_finite(image.data(), image.numel()))
    return vae.non_finite_status();  // names the non-finite weight (a data error) if there is one
  return image;
}

Image to_rgb8(const Tensor& img) {
  const int64_t H = img.dim(2), W = img.dim(3), n = H * W;
  Image out;
  out.width = static_cast<int>(W);
  out.height = static_cast<int>(H);
  out.rgb.resize(static_cast<size_t>(n) * 3);
  for (int c = 0; c < 3; ++c)
    for (int64_t i = 0; i < n; ++i) {
      float v = img.data()[c * n + i] * 0.5f + 0.5f;
      v = std::min(1.0f, std::max(0.0f, v));
      out.rgb[i * 3 + c] = static_cast<uint8_t>(std::nearbyint(v * 255.0f));
    }
  return out;
}

}  // namespace klein
