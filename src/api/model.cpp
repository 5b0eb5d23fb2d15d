// klein::Model: open once, run many requests. Every public body runs under api::guarded, so no
// exception crosses the API.
#include <cmath>
#include <cstdio>
#include <cstring>
#if defined(__GLIBC__)  // (defined by the libc headers above)
#include <malloc.h>
#endif
#include <filesystem>
#include <optional>
#include <thread>

#include "api/guard.h"
#include "api/manifest.h"
#include "api/model_impl.h"
#include "api/residency.h"
#include "io/image_reader.h"
#include "io/json_file.h"
#include "io/npy.h"
#include "pipeline/denoise.h"
#include "pipeline/inpaint.h"
#include "pipeline/image_preprocess.h"
#include "pipeline/noise.h"

namespace fs = std::filesystem;

namespace klein {

// ---- conversions ------------------------------------------------------------------------------

FloatArray to_array(const Tensor& t) {
  FloatArray a;
  a.shape = t.shape();
  a.data.assign(t.data(), t.data() + t.numel());
  return a;
}

Result<Tensor> to_tensor(const FloatArray& a, const std::string& what) {
  for (int64_t d : a.shape)
    if (d < 0) return invalid_argument(what + ": negative dimension in shape " + shape_str(a.shape));
  if (a.shape.empty() || static_cast<size_t>(shape_numel(a.shape)) != a.data.size())
    return invalid_argument(what + ": shape " + shape_str(a.shape) + " does not match its " +
                            std::to_string(a.data.size()) + " values");
  Tensor t(a.shape);
  if (!a.data.empty()) std::memcpy(t.data(), a.data.data(), a.data.size() * sizeof(float));
  return t;
}

std::string format_scale(double g) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", g);
  return buf;
}

// ---- Impl -------------------------------------------------------------------------------------

Status Model::Impl::require_full_model(const char* what) const {
  if (tokenizer_only)
    return invalid_argument(std::string(what) + ": " + path + " was opened with open_tokenizer (tokenizer only)");
  return Status::Ok();
}

namespace {
// `base` with a request's LoRAs at run time: a copy of the model object (its weights share the
// base's storage) whose changed weights carry the terms; the base stays as loaded.
template <class M>
Result<std::shared_ptr<const M>> with_request_loras(std::shared_ptr<const M> base, const std::vector<LoraSpec>* loras,
                                                    Backend& be) {
  if (!loras || loras->empty()) return base;
  auto copy = std::make_shared<M>(*base);
  KLEIN_RETURN_IF_ERROR(api::apply_lora_setup(*copy, {*loras, LoraMode::kRuntime, false}, be));
  return std::shared_ptr<const M>(std::move(copy));
}
}  // namespace

Result<std::shared_ptr<const Qwen3Encoder>> Model::Impl::text_encoder() const {
  std::shared_ptr<const Qwen3Encoder> m = te;
  if (!m) {
    KLEIN_ASSIGN_OR_RETURN(m, api::load_text_encoder(te_spec, kKleinTextLayersNeeded, *engine->backend,
                                                     {options.loras, options.lora_mode,
                                                      options.precision == Precision::kFp32}));
  }
  return with_request_loras(std::move(m), request_loras, *engine->backend);
}

Result<std::shared_ptr<const Flux2Transformer>> Model::Impl::transformer(const RunContext& ctx) const {
  std::shared_ptr<const Flux2Transformer> m = dit;
  if (!m) {
    ctx.report("load transformer", 0, 1);
    KLEIN_ASSIGN_OR_RETURN(m, api::load_transformer(dit_spec, *engine->backend,
                                                    {options.loras, options.lora_mode,
                                                     options.precision == Precision::kFp32}));
    ctx.report("load transformer", 1, 1);
  }
  return with_request_loras(std::move(m), request_loras, *engine->backend);
}

Result<std::shared_ptr<const Flux2Vae>> Model::Impl::vae_model() const {
  if (vae) return vae;
  return api::load_vae(vae_spec, *engine->backend);
}

VaeTiling Model::Impl::vae_tiling() const {
  VaeTiling t;
  t.tile = options.vae_tile;
  if (options.vae_tile_above_gib > 0) t.auto_above_bytes = static_cast<uint64_t>(options.vae_tile_above_gib * (1 << 30));
  if (plan) {
    t.tile = plan->vae_tile > 0 ? plan->vae_tile : -1;
    if (plan->vae_tile > 0) t.keep_bytes = plan->vae_keep_bytes;
  }
  return t;
}

api::MemoryNeeds Model::Impl::needs_for(const api::WeightSizes& w, int width, int height, int64_t ref_tokens,
                                        bool encode_only, bool cfg, bool inpaint) const {
  api::RequestShape r;
  r.width = width;
  r.height = height;
  r.ref_tokens = ref_tokens;
  r.editing = ref_tokens > 0;
  r.inpaint = inpaint;
  r.cfg = cfg;
  r.kv = kv;
  r.kv_bf16 = options.precision == Precision::kFast;
  r.threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  api::MemoryNeeds n = api::estimate_needs(w, te_cfg, dit_cfg, vae_cfg, r);
  // The process as it is now (code, tokenizer; with kResident the mapped, untouched models) and
  // the allocator's slack. Free heap memory the allocator kept (the CLI keeps up to 256 MiB, and a
  // server's earlier requests leave some) is returned first, so that it is not counted as in use.
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  n.base = api::process_rss_bytes() + (uint64_t{64} << 20);
  n.resident = options.memory == MemoryPolicy::kResident;
  n.vae_forced_tile = options.vae_tile;
  n.encode_only = encode_only;
  return n;
}

Status Model::Impl::plan_request(int width, int height, int64_t ref_tokens,
                                 const std::function<void(const std::string&)>& log, bool encode_only, bool cfg,
                                 bool inpaint) const {
  plan.reset();
  if (options.max_memory_gib <= 0 || !sizes) return Status::Ok();
  const api::MemoryNeeds n = needs_for(*sizes, width, height, ref_tokens, encode_only, cfg, inpaint);
  KLEIN_ASSIGN_OR_RETURN(auto p, api::plan_memory(n, static_cast<uint64_t>(options.max_memory_gib * (1ull << 30))));
  if (api::plan_adjuster()) api::plan_adjuster()(p);
  if (log) log(p.summary());
  plan = p;
  return Status::Ok();
}

Result<Model::Impl::Geometry> Model::Impl::resolve(int width, int height, int steps, const std::pair<int, int>* first_ref,
                                                   const std::function<void(const std::string&)>& log) const {
  if (width < 0 || height < 0) return invalid_argument("width and height must be positive");
  Geometry g;
  // Each dimension on its own, as the pipeline's `height = height or image_height`.
  // Without a reference: diffusers' 1024, which is what every FLUX.2 VAE config's sample_size says;
  // a model made for another size (the shapes demo: 128) declares it there.
  const int native = static_cast<int>(vae_cfg.sample_size);
  g.width = width > 0 ? width : (first_ref ? first_ref->first : native);
  g.height = height > 0 ? height : (first_ref ? first_ref->second : native);
  if (g.width < 16 || g.height < 16) return invalid_argument("width and height must be at least 16 pixels");
  if (g.width > 8192 || g.height > 8192) return invalid_argument("width and height must be at most 8192 pixels");
  if (g.width % 16 || g.height % 16) {
    const int w16 = g.width / 16 * 16, h16 = g.height / 16 * 16;
    if (log)
      log("size " + std::to_string(g.width) + "x" + std::to_string(g.height) + " is not a multiple of 16; using " +
          std::to_string(w16) + "x" + std::to_string(h16));
    g.width = w16;
    g.height = h16;
  }
  g.steps = steps > 0 ? steps : (distilled ? 4 : 50);  // diffusers' 50; BFL's 4 for distilled models
  if (steps < 0 || g.steps > 1000) return invalid_argument("steps must be between 1 and 1000");
  return g;
}

Status Model::Impl::set_schedule(Geometry& g, int steps, const std::vector<double>& sigmas, double shift) {
  if (!std::isfinite(shift) || shift < 0 || shift > 1000)
    return invalid_argument("shift " + format_scale(shift) + ": must be a number from 0 (none) to 1000");
  g.shift = shift;
  if (sigmas.empty()) return Status::Ok();
  if (sigmas.size() > 1000) return invalid_argument("sigmas: " + std::to_string(sigmas.size()) + " values (at most 1000)");
  for (size_t i = 0; i < sigmas.size(); ++i)
    if (!(sigmas[i] >= 0 && sigmas[i] <= 1))
      return invalid_argument("sigmas[" + std::to_string(i) + "] " + format_scale(sigmas[i]) + ": must be in [0, 1]");
  if (steps > 0 && steps != static_cast<int>(sigmas.size()))
    return invalid_argument("steps " + std::to_string(steps) + " and " + std::to_string(sigmas.size()) +
                            " sigmas: the steps are the sigmas' count (leave steps at 0)");
  g.sigmas = sigmas;
  g.steps = static_cast<int>(sigmas.size());
  return Status::Ok();
}

Result<Model::Impl::Guidance> Model::Impl::guidance(double requested,
                                                     const std::function<void(const std::string&)>& log) const {
  if (!std::isfinite(requested) || requested > 100)
    return invalid_argument("guidance scale " + std::to_string(requested) + ": must be a number up to 100");
  Guidance g;
  g.scale = requested < 0 ? 4.0f : static_cast<float>(requested);  // diffusers' default guidance_scale
  // diffusers' do_classifier_free_guidance: guidance_scale > 1 and not is_distilled.
  g.cfg = !distilled && g.scale > 1.0f;
  if (distilled && requested > 1 && log)  // as the pipeline's check_inputs warns
    log("guidance scale " + format_scale(requested) +
        " is ignored: this is a step-wise distilled model (no classifier-free guidance)");
  return g;
}

Result<std::vector<PromptEncoding>> Model::Impl::encode_prompts(const std::vector<std::string>& prompts,
                                                                int max_length, const RunContext& ctx) const {
  KLEIN_ASSIGN_OR_RETURN(auto enc, text_encoder());  // kLow: released on return
  std::vector<PromptEncoding> r;
  for (const std::string& prompt : prompts) {
    if (plan && plan->stream_te) {
      api::BlockStreamer streamer(*enc);
      KLEIN_ASSIGN_OR_RETURN(auto e, klein::encode_prompt(*tokenizer, *enc, prompt, streamer.hooked(ctx), max_length));
      r.push_back(std::move(e));
    } else {
      KLEIN_ASSIGN_OR_RETURN(auto e, klein::encode_prompt(*tokenizer, *enc, prompt, ctx, max_length));
      r.push_back(std::move(e));
    }
  }
  return r;
}

Result<PromptEncoding> Model::Impl::encode_prompt(const std::string& prompt, int max_length,
                                                  const RunContext& ctx) const {
  KLEIN_ASSIGN_OR_RETURN(auto r, encode_prompts({prompt}, max_length, ctx));
  return std::move(r[0]);
}

Status Model::Impl::check_embeds(const Tensor& embeds) const {
  const std::string& cfg_path = dit_spec.config_where;
  if (dit_cfg.in_channels != 128 || embeds.shape().size() != 3 || embeds.dim(0) != 1 ||
      embeds.dim(2) != dit_cfg.joint_attention_dim)
    return invalid_argument(cfg_path + ": transformer expects in_channels " + std::to_string(dit_cfg.in_channels) +
                            " and joint_attention_dim " + std::to_string(dit_cfg.joint_attention_dim) +
                            ", but the latents have 128 channels and the prompt embeddings are " +
                            shape_str(embeds.shape()) + " (wrong component combination?)");
  return Status::Ok();
}

Result<Tensor> Model::Impl::denoise(const Tensor& embeds, const Tensor* uncond, float guidance_scale,
                                    const std::vector<Tensor>& ref_latents, const Geometry& g, Tensor noise,
                                    const RunContext& ctx,
                                    const std::function<void(int, int, const Image&)>& preview,
                                    std::shared_ptr<const Flux2Transformer> held, const Inpaint* inpaint) const {
  KLEIN_RETURN_IF_ERROR(check_embeds(embeds));
  if (uncond) KLEIN_RETURN_IF_ERROR(check_embeds(*uncond));
  const int64_t th = g.height / 16, tw = g.width / 16;
  // diffusers' sigmas= (shifted with mu of their count), and a static shift from a scheduler
  // config with use_dynamic_shifting false.
  FlowMatchConfig sc = sched_cfg;
  if (g.shift > 0) {
    sc.use_dynamic_shifting = false;
    sc.shift = g.shift;
  }
  Schedule schedule;
  if (g.sigmas.empty()) {
    KLEIN_ASSIGN_OR_RETURN(schedule, make_klein_schedule(sc, g.steps, th * tw));
  } else {
    KLEIN_ASSIGN_OR_RETURN(schedule, flow_match_set_timesteps(sc, g.sigmas, compute_empirical_mu(th * tw, g.steps)));
  }
  ctx.dump("noise", noise);
  // Inpainting: the last steps of the schedule, from the source latents noised to the first.
  std::optional<InpaintRun> inpaint_run;
  StepHooks hooks;
  if (inpaint) {
    schedule = cut_schedule(schedule, strength_start_step(g.steps, inpaint->strength));
    Tensor start;
    KLEIN_ASSIGN_OR_RETURN(inpaint_run, InpaintRun::make(*inpaint->image_latents, noise, *inpaint->mask, schedule,
                                                         &start, ctx));
    noise = std::move(start);
    hooks = inpaint_run->hooks();  // refers to *inpaint_run, which outlives the loop
  }
  const StepHooks* hk = inpaint_run ? &hooks : nullptr;
  KLEIN_ASSIGN_OR_RETURN(auto refs, pack_reference_tokens(ref_latents, ctx));
  std::optional<StepPreview> sp;
  if (preview) {
    sp.emplace();
    KLEIN_ASSIGN_OR_RETURN(sp->map, flux2_latent_rgb_map());
    {  // the batch-norm statistics only (kLow: the mapped VAE is released again at once)
      KLEIN_ASSIGN_OR_RETURN(auto vae, vae_model());
      sp->stats = vae->latent_stats();
    }
    sp->width = g.width;
    sp->height = g.height;
    sp->callback = preview;
  }
  std::shared_ptr<const Flux2Transformer> m = std::move(held);
  if (!m) {
    KLEIN_ASSIGN_OR_RETURN(m, transformer(ctx));
  }
  // kLow: the transformer is released on return (unless the caller holds it). The prompt
  // embeddings go to the device once.
  KLEIN_ASSIGN_OR_RETURN(TextCondition cond, TextCondition::make(ctx.be(), embeds, "the prompt embeddings"));
  std::optional<TextCondition> neg;
  if (uncond) {
    KLEIN_ASSIGN_OR_RETURN(neg, TextCondition::make(ctx.be(), *uncond, "the negative prompt embeddings"));
  }
  std::unique_ptr<Predictor> predictor;
  Flux2KvCache kv_cache;  // the references' keys and values (KV variant), for this image's steps
  if (kv && !neg)
    predictor = std::make_unique<KvPredictor>(*m, cond, kv_cache, options.precision == Precision::kFast);
  else if (neg)
    predictor = std::make_unique<CfgPredictor>(*m, cond, *neg, guidance_scale);
  else
    predictor = std::make_unique<PlainPredictor>(*m, cond);
  if (plan && plan->stream_dit) {
    api::BlockStreamer streamer(*m);
    return run_denoise(*predictor, refs, std::move(noise), schedule, streamer.hooked(ctx), sp ? &*sp : nullptr, hk);
  }
  return run_denoise(*predictor, refs, std::move(noise), schedule, ctx, sp ? &*sp : nullptr, hk);
}

// The noise for a request: the caller's (checked against the size) or torch's seeded draw.
Result<Tensor> make_noise(const FloatArray* given, const std::string& name, int width, int height, uint64_t seed,
                          bool bf16) {
  const Shape want = klein_noise_shape(width, height);
  if (!given || given->data.empty()) return torch_randn(want, seed, bf16);
  const std::string what = name.empty() ? std::string("noise") : name;
  if (given->shape != want)
    return invalid_argument(what + ": noise has shape " + shape_str(given->shape) + ", expected " + shape_str(want) +
                            " for " + std::to_string(width) + "x" + std::to_string(height));
  KLEIN_ASSIGN_OR_RETURN(Tensor t, to_tensor(*given, what));
  if (!all_finite(t.data(), t.numel())) return invalid_argument(what + ": noise has NaN/Inf values");
  return t;
}

// Privacy: an image's metadata names the model and references by their last path component
// only ("FLUX.2-klein-4B", "photo.jpg"), never the folders above (a home directory, a user name).
std::string last_path_component(const std::string& p) {
  fs::path q = fs::path(p).lexically_normal();
  if (q.filename().empty()) q = q.parent_path();  // "dir/" → "dir"
  return q.filename().string();
}


// ---- Model: lifetime --------------------------------------------------------------------------

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const LoadOptions& Model::load_options() const { return impl_->options; }

const std::vector<std::string>& Model::notes() const { return impl_->layout.notes; }

std::string Model::backend_name() const {
  return impl_->engine && impl_->engine->backend ? std::string(impl_->engine->backend->name()) : std::string();
}

Result<std::unique_ptr<Model>> Model::open(const std::string& path, const LoadOptions& options) {
  return api::guarded("open model", [&]() -> Result<std::unique_ptr<Model>> {
    auto m = std::make_unique<Impl>();
    m->path = path;
    m->options = options;
    KLEIN_ASSIGN_OR_RETURN(m->engine, api::make_engine(options));
    KLEIN_ASSIGN_OR_RETURN(m->layout, api::resolve_layout(api::layout_request(path, options)));
    const api::Layout& l = m->layout;
    if (l.folder) {
      const ModelFolder& f = *l.folder;
      const std::string index = (f.root() / "model_index.json").string();
      if (!f.pipeline_class().empty() && f.pipeline_class() != "Flux2KleinPipeline" &&
          f.pipeline_class() != "Flux2KleinKVPipeline")
        return unsupported(index + ": pipeline \"" + f.pipeline_class() +
                           "\" (klein.cpp runs Flux2KleinPipeline and Flux2KleinKVPipeline models)");
    }
    // Base models (is_distilled false, or --variant base for files) run classifier-free guidance.
    m->distilled = l.distilled;
    m->kv = l.kv;
    KLEIN_RETURN_IF_ERROR(l.complete());
    if (!options.verify_manifest.empty())
      KLEIN_RETURN_IF_ERROR(api::verify_layout(l, options.verify_manifest, options.threads));
    m->te_spec = *l.text_encoder.spec;
    m->dit_spec = *l.transformer.spec;
    m->vae_spec = *l.vae.spec;
    if (m->te_spec.from_folder) {
      const std::string cls = l.folder->component("text_encoder")->class_name;
      if (cls != "Qwen3ForCausalLM" && cls != "Qwen3Model")
        return unsupported((l.folder->root() / "model_index.json").string() + ": text_encoder class \"" + cls +
                           "\" (klein uses Qwen3ForCausalLM)");
    }

    // Every config once: a bad one fails here, not in the middle of a request.
    KLEIN_ASSIGN_OR_RETURN(m->te_cfg, Qwen3Config::from_json(m->te_spec.config, m->te_spec.config_where));
    KLEIN_ASSIGN_OR_RETURN(m->dit_cfg, Flux2Config::from_json(m->dit_spec.config, m->dit_spec.config_where));
    KLEIN_ASSIGN_OR_RETURN(m->vae_cfg, Flux2VaeConfig::from_json(m->vae_spec.config, m->vae_spec.config_where));
    KLEIN_ASSIGN_OR_RETURN(m->sched_cfg, FlowMatchConfig::from_json(l.scheduler, l.scheduler_where));
    // What the pipeline itself fixes (klein's limits, not the configs' faults): name the field.
    const std::string& vae_cfg_path = m->vae_spec.config_where;
    const std::string& dit_cfg_path = m->dit_spec.config_where;
    if (m->vae_cfg.latent_channels != 32)
      return unsupported(vae_cfg_path + ": latent_channels is " + std::to_string(m->vae_cfg.latent_channels) +
                         "; klein's pipeline supports only 32 (FLUX.2's VAE: patchified to 128 transformer channels)");
    if (m->vae_cfg.block_out_channels.size() != 4)
      return unsupported(vae_cfg_path + ": block_out_channels has " +
                         std::to_string(m->vae_cfg.block_out_channels.size()) + " entries (latent scale factor " +
                         std::to_string(m->vae_cfg.scale_factor()) +
                         "); klein's pipeline supports only 4 (scale factor 8, as FLUX.2's VAE)");
    if (m->vae_cfg.in_channels != 3 || m->vae_cfg.out_channels != 3)
      return unsupported(vae_cfg_path + ": in_channels/out_channels are " + std::to_string(m->vae_cfg.in_channels) +
                         "/" + std::to_string(m->vae_cfg.out_channels) + "; klein's pipeline supports only 3 (RGB)");
    if (m->dit_cfg.in_channels != 128)
      return unsupported(dit_cfg_path + ": in_channels is " + std::to_string(m->dit_cfg.in_channels) +
                         "; klein's pipeline supports only 128 (4 x the VAE's 32 latent channels)");
    const int64_t text_width = static_cast<int64_t>(kKleinTextTaps.size()) * m->te_cfg.hidden_size;
    if (m->dit_cfg.joint_attention_dim != text_width)
      return format_error(dit_cfg_path + ": joint_attention_dim is " + std::to_string(m->dit_cfg.joint_attention_dim) +
                          ", but the text encoder gives " + std::to_string(text_width) + " (3 x hidden_size " +
                          std::to_string(m->te_cfg.hidden_size) + "; wrong component combination?)");
    if (m->te_cfg.num_layers < kKleinTextLayersNeeded)
      return unsupported(m->te_spec.config_where + ": num_hidden_layers is " +
                         std::to_string(m->te_cfg.num_layers) + "; klein taps hidden states 9, 18 and 27, so it needs " +
                         "at least " + std::to_string(kKleinTextLayersNeeded));
    // The folder's tokenizer, or a tokenizer.json beside the model file, else the built-in one.
    KLEIN_ASSIGN_OR_RETURN(auto tok, l.tokenizer.empty() ? Tokenizer::builtin() : Tokenizer::load(l.tokenizer));
    m->tokenizer.emplace(std::move(tok));

    if (options.max_memory_gib > 0) {
      KLEIN_ASSIGN_OR_RETURN(auto sizes, api::measure_weights(m->te_spec, kKleinTextLayersNeeded, m->dit_spec,
                                                              m->vae_spec,
                                                              {options.loras, options.lora_mode,
                                                               options.precision == Precision::kFp32}));
      m->sizes = sizes;
    }
    if (options.memory == MemoryPolicy::kResident) {
      const api::LoraSetup loras{options.loras, options.lora_mode, options.precision == Precision::kFp32};
      KLEIN_ASSIGN_OR_RETURN(m->te, api::load_text_encoder(m->te_spec, kKleinTextLayersNeeded, *m->engine->backend, loras));
      KLEIN_ASSIGN_OR_RETURN(m->dit, api::load_transformer(m->dit_spec, *m->engine->backend, loras));
      KLEIN_ASSIGN_OR_RETURN(m->vae, api::load_vae(m->vae_spec, *m->engine->backend));
    }
    return std::unique_ptr<Model>(new Model(std::move(m)));
  });
}

Result<std::unique_ptr<Model>> Model::open_tokenizer(const std::string& path) {
  return api::guarded("open tokenizer", [&]() -> Result<std::unique_ptr<Model>> {
    auto m = std::make_unique<Impl>();
    m->path = path;
    m->tokenizer_only = true;
    // A pipeline folder has its tokenizer in tokenizer/; a tokenizer folder is used as it is.
    fs::path dir = path;
    std::error_code ec;
    if (fs::exists(dir / "model_index.json", ec) && fs::is_directory(dir / "tokenizer", ec)) dir /= "tokenizer";
    KLEIN_ASSIGN_OR_RETURN(auto tok, Tokenizer::load(dir));
    m->tokenizer.emplace(std::move(tok));
    return std::unique_ptr<Model>(new Model(std::move(m)));
  });
}

// ---- Model: phases ----------------------------------------------------------------------------

Result<PromptEmbeddings> Model::encode_prompt(const std::string& prompt, const EncodeOptions& options,
                                              const Callbacks& cb) {
  return api::guarded("encode_prompt", [&]() -> Result<PromptEmbeddings> {
    std::lock_guard<std::mutex> lock(impl_->mu);
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("encode_prompt"));
    Dumper dumper(options.dump.dir, options.dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*impl_->engine, &dumper, cb);
    KLEIN_RETURN_IF_ERROR(impl_->plan_request(16, 16, 0, cb.log, /*encode_only=*/true));
    KLEIN_ASSIGN_OR_RETURN(auto enc, impl_->encode_prompt(prompt, options.max_length, ctx));
    KLEIN_RETURN_IF_ERROR(dumper.status());
    PromptEmbeddings r;
    static_cast<FloatArray&>(r) = to_array(enc.embeds);
    r.ids = std::move(enc.ids);
    r.mask = std::move(enc.mask);
    r.num_real_tokens = enc.num_real_tokens;
    r.untruncated_length = enc.untruncated_length;
    return r;
  });
}

Result<ReferenceLatents> Model::encode_references(const std::vector<std::string>& paths, const Callbacks& cb,
                                                  const DumpOptions& dump) {
  return api::guarded("encode_references", [&]() -> Result<ReferenceLatents> {
    std::lock_guard<std::mutex> lock(impl_->mu);
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("encode_references"));
    Dumper dumper(dump.dir, dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*impl_->engine, &dumper, cb);
    KLEIN_ASSIGN_OR_RETURN(auto prepared, prepare_references(paths));
    ReferenceLatents r;
    if (prepared.empty()) return r;
    {  // the largest reference sets the VAE's tiles
      int w = 16, h = 16;
      for (const auto& p : prepared)
        if (p.pixels.dim(2) * p.pixels.dim(3) > int64_t{w} * h)
          w = static_cast<int>(p.pixels.dim(3)), h = static_cast<int>(p.pixels.dim(2));
      KLEIN_RETURN_IF_ERROR(impl_->plan_request(w, h, 0, cb.log));
    }
    KLEIN_ASSIGN_OR_RETURN(auto vae, impl_->vae_model());
    KLEIN_ASSIGN_OR_RETURN(auto latents, encode_reference_latents(*vae, prepared, ctx, impl_->vae_tiling()));
    for (size_t i = 0; i < latents.size(); ++i) {
      r.latents.push_back(to_array(latents[i]));
      r.paths.push_back(prepared[i].path);
    }
    KLEIN_RETURN_IF_ERROR(dumper.status());
    return r;
  });
}

Result<Latents> Model::denoise(const PromptEmbeddings& prompt, const ReferenceLatents& references,
                               const DenoiseParams& p, const Callbacks& cb) {
  return api::guarded("denoise", [&]() -> Result<Latents> {
    std::lock_guard<std::mutex> lock(impl_->mu);
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("denoise"));
    KLEIN_ASSIGN_OR_RETURN(Tensor embeds, to_tensor(prompt, "prompt embeddings"));
    std::vector<Tensor> refs;
    for (size_t i = 0; i < references.latents.size(); ++i) {
      KLEIN_ASSIGN_OR_RETURN(Tensor t, to_tensor(references.latents[i], "reference latent " + std::to_string(i + 1)));
      if (t.shape().size() != 4) return invalid_argument("reference latent " + std::to_string(i + 1) + ": expected [1, 128, h, w]");
      refs.push_back(std::move(t));
    }
    std::pair<int, int> first;
    if (!refs.empty()) first = {static_cast<int>(refs[0].dim(3) * 16), static_cast<int>(refs[0].dim(2) * 16)};
    KLEIN_ASSIGN_OR_RETURN(auto g, impl_->resolve(p.width, p.height, p.steps, refs.empty() ? nullptr : &first, cb.log));
    KLEIN_RETURN_IF_ERROR(Impl::set_schedule(g, p.steps, p.sigmas, p.shift));
    KLEIN_ASSIGN_OR_RETURN(Tensor noise, make_noise(&p.noise, p.noise_name, g.width, g.height, p.seed, p.bf16_noise));
    Dumper dumper(p.dump.dir, p.dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*impl_->engine, &dumper, cb);
    int64_t ref_tokens = 0;
    for (const Tensor& t : refs) ref_tokens += t.dim(2) * t.dim(3);
    KLEIN_RETURN_IF_ERROR(impl_->plan_request(g.width, g.height, ref_tokens, cb.log));
    KLEIN_ASSIGN_OR_RETURN(auto gd, impl_->guidance(-1, nullptr));
    if (gd.cfg)
      return invalid_argument("denoise: this base model runs classifier-free guidance (guidance scale " +
                              format_scale(gd.scale) +
                              " > 1), which needs the negative prompt's embeddings: use a klein::Session");
    KLEIN_ASSIGN_OR_RETURN(Tensor z, impl_->denoise(embeds, nullptr, gd.scale, refs, g, std::move(noise), ctx, cb.preview));
    KLEIN_RETURN_IF_ERROR(dumper.status());
    Latents r;
    static_cast<FloatArray&>(r) = to_array(z);
    return r;
  });
}

Result<Image> Model::decode(const Latents& latents, const Callbacks& cb, const DumpOptions& dump) {
  return api::guarded("decode", [&]() -> Result<Image> {
    std::lock_guard<std::mutex> lock(impl_->mu);
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("decode"));
    KLEIN_ASSIGN_OR_RETURN(Tensor z, to_tensor(latents, "latents"));
    if (z.shape().size() != 4 || z.dim(0) != 1 || z.dim(1) != 128)
      return invalid_argument("latents: shape " + shape_str(z.shape()) + ", expected [1, 128, H/16, W/16]");
    if (z.dim(2) < 1 || z.dim(3) < 1)  // else the VAE fails on an empty convolution, far from the input
      return invalid_argument("latents: shape " + shape_str(z.shape()) +
                              " holds no values, expected [1, 128, H/16, W/16] with H/16 and W/16 at least 1");
    // Caller-given latents (e.g. a .npy): a NaN here is the input's fault, not the VAE's weights'.
    for (int64_t i = 0; i < z.numel(); ++i)
      if (!std::isfinite(z.data()[i]))
        return invalid_argument("latents: non-finite value at flat index " + std::to_string(i));
    Dumper dumper(dump.dir, dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*impl_->engine, &dumper, cb);
    KLEIN_RETURN_IF_ERROR(impl_->plan_request(static_cast<int>(z.dim(3) * 16), static_cast<int>(z.dim(2) * 16), 0, cb.log));
    KLEIN_ASSIGN_OR_RETURN(auto vae, impl_->vae_model());
    KLEIN_ASSIGN_OR_RETURN(Tensor image, decode_latents(*vae, std::move(z), ctx, impl_->vae_tiling()));
    KLEIN_RETURN_IF_ERROR(dumper.status());
    return to_rgb8(image);
  });
}

// ---- Model: text ------------------------------------------------------------------------------

Result<TokenizeResult> Model::tokenize(const std::string& text, bool chat_template, int max_length) const {
  return api::guarded("tokenize", [&]() -> Result<TokenizeResult> {
    if (max_length < 0) return invalid_argument("tokenize: max_length must be >= 0 (0: no padding)");
    const std::string t = chat_template ? Tokenizer::klein_template(text) : text;
    TokenizeResult r;
    if (max_length > 0) {
      auto p = impl_->tokenizer->encode_padded(t, max_length);
      r.ids = std::move(p.ids);
      r.mask = std::move(p.mask);
    } else {
      r.ids = impl_->tokenizer->encode(t);
    }
    return r;
  });
}

}  // namespace klein
