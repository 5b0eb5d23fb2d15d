// Flux2KleinPipeline.__call__ for text-to-image (and, later, reference editing), fp32 compute.
// Each component is loaded right before its phase and released after it, so the text encoder is
// gone before the transformer is mapped and the transformer before the VAE decodes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_context.h"
#include "io/model_folder.h"
#include "io/npy.h"
#include "io/png_writer.h"
#include "klein/klein.h"
#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "pipeline/latents.h"
#include "pipeline/noise.h"
#include "pipeline/prompt_encoder.h"
#include "pipeline/references.h"
#include "pipeline/scheduler.h"

namespace fs = std::filesystem;

namespace klein {

const char* version() { return KLEIN_VERSION; }

namespace {

// Post-processing as diffusers' image processor for output_type="pil" from an fp32 pipeline:
// (x * 0.5 + 0.5).clamp(0, 1), then (x * 255).round() with numpy's round-half-to-even.
Image to_image(const Tensor& img) {
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

}  // namespace

Result<GenerateResult> generate(const GenerateOptions& opt) {
  auto log = [&](const std::string& m) {
    if (opt.on_log) opt.on_log(m);
  };
  KLEIN_ASSIGN_OR_RETURN(auto model, ModelFolder::open(opt.model_dir));
  if (!model.pipeline_class().empty() && model.pipeline_class() != "Flux2KleinPipeline")
    return unsupported((model.root() / "model_index.json").string() + ": pipeline \"" + model.pipeline_class() +
                       "\" (klein.cpp runs Flux2KleinPipeline models)");
  if (!model.is_distilled())
    return unsupported((model.root() / "model_index.json").string() +
                       ": not a distilled model (is_distilled is false); base models need classifier-free guidance, "
                       "which klein.cpp does not implement yet");
  // Reference images are read and preprocessed before any model work: a bad file fails fast.
  std::vector<PreparedReference> refs;
  if (!opt.reference_images.empty()) {
    KLEIN_ASSIGN_OR_RETURN(refs, prepare_references(opt.reference_images));
  }

  // Size: the caller's, else the first reference's processed size, else 1024 (each dimension on
  // its own, as `height = height or image_height`); floored to multiples of 16 with a warning.
  int width = opt.width > 0 ? opt.width : (refs.empty() ? 1024 : static_cast<int>(refs[0].pixels.dim(3)));
  int height = opt.height > 0 ? opt.height : (refs.empty() ? 1024 : static_cast<int>(refs[0].pixels.dim(2)));
  if (opt.width < 0 || opt.height < 0) return invalid_argument("width and height must be positive");
  if (width < 16 || height < 16) return invalid_argument("width and height must be at least 16 pixels");
  if (width > 8192 || height > 8192) return invalid_argument("width and height must be at most 8192 pixels");
  if (width % 16 || height % 16) {
    const int w16 = width / 16 * 16, h16 = height / 16 * 16;
    log("size " + std::to_string(width) + "x" + std::to_string(height) + " is not a multiple of 16; using " +
        std::to_string(w16) + "x" + std::to_string(h16));
    width = w16;
    height = h16;
  }
  const int steps = opt.steps > 0 ? opt.steps : 4;
  if (opt.steps < 0 || steps > 1000) return invalid_argument("steps must be between 1 and 1000");
  const int64_t th = height / 16, tw = width / 16;

  // Initial noise before any model work (cheap, and bad --noise files fail fast).
  Tensor noise;
  if (!opt.noise_npy.empty()) {
    KLEIN_ASSIGN_OR_RETURN(auto arr, read_npy(opt.noise_npy));
    const Shape want = {1, 128, th, tw};
    if (arr.shape != want)
      return invalid_argument(opt.noise_npy + ": noise has shape " + shape_str(arr.shape) + ", expected " +
                              shape_str(want) + " for " + std::to_string(width) + "x" + std::to_string(height));
    noise = arr.to_tensor();
    if (!all_finite(noise.data(), noise.numel())) return invalid_argument(opt.noise_npy + ": noise has NaN/Inf values");
  } else {
    noise = torch_randn(klein_noise_shape(width, height), opt.seed, opt.bf16_noise);
  }

  KLEIN_ASSIGN_OR_RETURN(auto sched_cfg_json, model.config("scheduler"));
  KLEIN_ASSIGN_OR_RETURN(auto sched_cfg, FlowMatchConfig::from_json(sched_cfg_json,
                                                                    (model.root() / "scheduler").string()));
  KLEIN_ASSIGN_OR_RETURN(auto schedule, make_klein_schedule(sched_cfg, steps, th * tw));

  CpuBackend backend(CpuBackendOptions{opt.threads});
  Backend& be = backend;
  Dumper dumper(opt.dump_dir, opt.dump_filter);
  KLEIN_RETURN_IF_ERROR(dumper.status());
  RunContext ctx;
  ctx.backend = &backend;
  ctx.dumper = opt.dump_dir.empty() ? nullptr : &dumper;
  ctx.progress = opt.on_progress;
  ctx.should_cancel = opt.should_cancel;

  // 1. Text.
  KLEIN_ASSIGN_OR_RETURN(auto prompt, encode_prompt(model, opt.prompt, ctx));
  ctx.dump("noise", noise);

  // 2. Reference latents (editing): VAE-encoded, normalised, packed; constant over the steps.
  KLEIN_ASSIGN_OR_RETURN(auto vdir, model.component("vae"));
  ReferenceTokens ref_tokens;
  if (!refs.empty()) {
    KLEIN_ASSIGN_OR_RETURN(auto vae, Flux2Vae::load(vdir.dir));
    KLEIN_ASSIGN_OR_RETURN(ref_tokens, encode_references(vae, refs, ctx));
    refs.clear();  // pixels no longer needed
  }

  // 3. Denoise.
  KLEIN_ASSIGN_OR_RETURN(auto tdir, model.component("transformer"));
  Tensor latents;
  {
    ctx.report("load transformer", 0, 1);
    KLEIN_ASSIGN_OR_RETURN(auto dit, Flux2Transformer::load(tdir.dir));
    if (dit.config().in_channels != 128 || dit.config().joint_attention_dim != prompt.embeds.dim(2))
      return format_error(tdir.dir.string() + "/config.json: transformer expects in_channels " +
                          std::to_string(dit.config().in_channels) + " and joint_attention_dim " +
                          std::to_string(dit.config().joint_attention_dim) + ", but the latents have 128 channels and the text encoder gives " +
                          std::to_string(prompt.embeds.dim(2)) + " (wrong component combination?)");
    // Model input tokens: the N noisy latents, then the reference tokens (ids T = 10, 20, ...).
    Flux2Ids img_ids = flux2_image_ids(static_cast<int>(th), static_cast<int>(tw), 0);
    img_ids.insert(img_ids.end(), ref_tokens.ids.begin(), ref_tokens.ids.end());
    const Flux2Ids txt_ids = flux2_text_ids(static_cast<int>(prompt.embeds.dim(1)));
    const int64_t N = th * tw, S_ref = ref_tokens.tokens.empty() ? 0 : ref_tokens.tokens.dim(0);
    latents = pack_latents(noise);  // [N, 128]
    KLEIN_ASSIGN_OR_RETURN(Tensor model_in, be.alloc({N + S_ref, 128}, "the transformer input"));
    if (S_ref) KLEIN_RETURN_IF_ERROR(be.copy(ref_tokens.tokens, model_in.view().row_range(N, N + S_ref)));
    ctx.report("denoise", 0, steps);
    for (int i = 0; i < steps; ++i) {
      KLEIN_RETURN_IF_ERROR(ctx.check_cancel("denoising"));
      const float t = schedule.timesteps[i];
      KLEIN_RETURN_IF_ERROR(be.copy(latents, model_in.view().row_range(0, N)));
      KLEIN_ASSIGN_OR_RETURN(Tensor v, dit.forward(model_in, prompt.embeds, t / 1000.0f, img_ids, txt_ids, ctx));
      v.reshape({v.numel() / 128, 128});
      if (S_ref) {  // keep only the noise tokens' prediction
        KLEIN_ASSIGN_OR_RETURN(Tensor vn, be.alloc({N, 128}, "the velocity"));
        KLEIN_RETURN_IF_ERROR(be.copy(v.view().row_range(0, N), vn));
        v = std::move(vn);
      }
      KLEIN_RETURN_IF_ERROR(euler_step(latents, v, schedule.sigmas[i], schedule.sigmas[i + 1]));
      if (ctx.dumper) {
        ctx.dump("velocity_step" + std::to_string(i + 1), unpack_latents(v, th, tw));
        ctx.dump("latents_step" + std::to_string(i + 1), unpack_latents(latents, th, tw));
      }
      ctx.report("denoise", i + 1, steps);
    }
  }  // transformer released here
  Tensor z = unpack_latents(latents, th, tw);  // [1, 128, th, tw]
  if (!all_finite(z.data(), z.numel()))
    return internal_error("denoising produced non-finite latents (NaN/Inf); no image written");

  // 4. Decode.
  Tensor image;
  {
    KLEIN_ASSIGN_OR_RETURN(auto vae, Flux2Vae::load(vdir.dir));
    KLEIN_RETURN_IF_ERROR(denormalize_latents(z, vae.latent_stats()));
    KLEIN_ASSIGN_OR_RETURN(Tensor zu, unpatchify(z));  // [1, 32, 2*th, 2*tw]: the VAE's input
    ctx.dump("latents_final", zu);
    KLEIN_ASSIGN_OR_RETURN(image, vae.decode(zu, ctx));
  }
  ctx.dump("image", image);
  KLEIN_RETURN_IF_ERROR(dumper.status());
  if (!all_finite(image.data(), image.numel()))
    return internal_error("the VAE produced a non-finite image (NaN/Inf); no image written");

  GenerateResult r;
  r.image = to_image(image);
  r.width = width;
  r.height = height;
  r.steps = steps;
  r.metadata = {{"prompt", opt.prompt},
                {"seed", opt.noise_npy.empty() ? std::to_string(opt.seed) : std::string("noise file ") + opt.noise_npy},
                {"steps", std::to_string(steps)},
                {"size", std::to_string(width) + "x" + std::to_string(height)},
                {"model", fs::absolute(opt.model_dir).lexically_normal().string()},
                {"software", std::string("klein.cpp ") + KLEIN_VERSION}};
  for (size_t i = 0; i < opt.reference_images.size(); ++i)
    r.metadata.emplace_back("reference" + std::to_string(i + 1), opt.reference_images[i]);
  return r;
}

Status save_png(const std::string& path, const Image& image,
                const std::vector<std::pair<std::string, std::string>>& metadata) {
  if (image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    return invalid_argument("save_png: image buffer does not match its size");
  return write_png(path, image.width, image.height, image.rgb.data(), metadata);
}

}  // namespace klein
