// klein::Session: one request's state on a shared, unchanged Model (prompt embeddings, with the
// negative prompt's under classifier-free guidance; references; latents), and Model::generate /
// generate_batch on top of it. Every public body runs under api::guarded.
#include <cmath>
#include <optional>

#include "api/guard.h"
#include "api/model_impl.h"
#include "io/image_reader.h"
#include "io/npy.h"
#include "pipeline/denoise.h"
#include "pipeline/image_preprocess.h"
#include "pipeline/inpaint.h"

namespace klein {

struct [[gnu::visibility("hidden")]] Session::Impl {
  const Model::Impl* m = nullptr;
  SessionOptions options;
  Model::Impl::Guidance gd;

  std::optional<Tensor> cond, uncond;  // [1, L, joint_attention_dim] each

  std::vector<PreparedReference> prepared;  // preprocessed pixels, until the first denoise encodes them
  std::optional<std::pair<int, int>> first_ref;  // the first reference's size (the default output size)
  std::vector<Tensor> ref_latents;
  int64_t ref_tokens = 0;
  bool refs_set = false;
  std::shared_ptr<const Flux2Vae> vae;  // held from the references' encode to a decode (editing)
  std::shared_ptr<const Flux2Transformer> dit;  // held by a batch across its denoises (else null)

  // Inpainting / image-to-image (set_init_image): the preprocessed source until the first denoise
  // encodes it (its latents are then ref_latents[0]), the mask's token weights, the strength.
  bool inpaint = false;
  std::optional<Tensor> source_pixels;
  std::vector<float> mask;
  double strength = 1.0;
  std::string source_name, mask_name;

  std::optional<Tensor> latents;  // the last denoise's [1, 128, th, tw]
  Model::Impl::Geometry g;

  // `what` names the phase in errors.
  Status need_prompt(const char* what) const {
    if (!cond)
      return invalid_argument(std::string("Session::") + what +
                              ": no prompt embeddings: call encode_prompt or set_prompt_embeddings first");
    return Status::Ok();
  }

  // Given embeddings: [1, T <= 512, joint_attention_dim], finite (checked before any model work).
  Status check_given(const Tensor& t, const std::string& what) const {
    if (t.shape().size() != 3 || t.dim(0) != 1 || t.dim(1) < 1 || t.dim(1) > kKleinMaxSequenceLength ||
        t.dim(2) != m->dit_cfg.joint_attention_dim)
      return invalid_argument(what + ": expected prompt embeddings [1, T <= " + std::to_string(kKleinMaxSequenceLength) +
                              ", " + std::to_string(m->dit_cfg.joint_attention_dim) + "] for this model, got " +
                              shape_str(t.shape()));
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.data()[i]))
        return invalid_argument(what + ": non-finite value at flat index " + std::to_string(i));
    return Status::Ok();
  }

  // The prompt (unless `given`), and the negative prompt when guidance runs (unless
  // `given_negative`): one text-encoder load for both.
  Status encode(const std::string& prompt, std::optional<Tensor> given, std::optional<Tensor> given_negative,
                const RunContext& ctx) {
    std::vector<std::string> texts;
    // The negative first: the prompt's own dumps (prompt_embeds, the encoder's) are written last.
    const bool encode_negative = gd.cfg && !given_negative;
    if (encode_negative) texts.push_back(options.negative_prompt);
    if (!given) texts.push_back(prompt);
    std::vector<PromptEncoding> enc;
    if (!texts.empty()) {
      KLEIN_ASSIGN_OR_RETURN(enc, m->encode_prompts(texts, kKleinMaxSequenceLength, ctx));
    }
    cond = given ? std::move(*given) : std::move(enc.back().embeds);
    if (gd.cfg) {
      uncond = given_negative ? std::move(*given_negative) : std::move(enc.front().embeds);
      ctx.dump("negative_prompt_embeds", *uncond);
    } else {
      uncond.reset();
    }
    return Status::Ok();
  }

  Status set_references(const std::vector<std::string>& paths, const std::vector<ReferenceImage>& data) {
    if (latents) return invalid_argument("Session::set_references: references must be set before the first denoise");
    if (refs_set) return invalid_argument("Session::set_references: references were already set for this session");
    KLEIN_ASSIGN_OR_RETURN(auto p, prepare_references(paths));
    for (const ReferenceImage& ref : data) {
      const std::string name = ref.name.empty() ? std::string("reference image") : ref.name;
      KLEIN_ASSIGN_OR_RETURN(auto img, decode_image(ref.data.data(), ref.data.size(), name));
      KLEIN_ASSIGN_OR_RETURN(Tensor t, preprocess_reference(img, name));
      p.push_back({name, std::move(t)});
    }
    prepared = std::move(p);
    refs_set = true;
    first_ref.reset();
    ref_tokens = inpaint ? static_cast<int64_t>(mask.size()) : 0;  // an inpainting source is a reference too
    if (!prepared.empty())
      first_ref = {static_cast<int>(prepared[0].pixels.dim(3)), static_cast<int>(prepared[0].pixels.dim(2))};
    for (const auto& r : prepared) ref_tokens += (r.pixels.dim(2) / 16) * (r.pixels.dim(3) / 16);
    return Status::Ok();
  }

  // Reads the source (a file, else bytes), the mask (none: all repainted) and the strength.
  Status set_init_image(const InitImage& in) {
    if (latents) return invalid_argument("Session::set_init_image: the source image must be set before the first denoise");
    if (inpaint) return invalid_argument("Session::set_init_image: a source image was already set for this session");
    if (in.empty()) return invalid_argument("Session::set_init_image: no source image (a path or encoded bytes)");
    if (m->kv)  // diffusers has no inpainting pipeline for the KV distill; its references are cached
      return unsupported("inpainting / image-to-image: " + m->path +
                         " is a Flux2KleinKVPipeline (9B-KV) model, which edits with references only");
    const double st = in.strength < 0 ? kInpaintDefaultStrength : in.strength;
    if (!(st > 0 && st <= 1))
      return invalid_argument("strength " + format_scale(in.strength) + ": must be in (0, 1] (1: start from pure noise)");
    auto read = [](const std::string& path, const ReferenceImage& data, const char* what) -> Result<Image> {
      if (!path.empty()) return read_image(path);
      return decode_image(data.data.data(), data.data.size(), data.name.empty() ? std::string(what) : data.name);
    };
    const std::string name = in.path.empty() ? (in.data.name.empty() ? "source image" : in.data.name) : in.path;
    KLEIN_ASSIGN_OR_RETURN(Image src, read(in.path, in.data, "source image"));
    KLEIN_ASSIGN_OR_RETURN(Tensor pixels, preprocess_source_image(src, name));
    const int w = static_cast<int>(pixels.dim(3)), h = static_cast<int>(pixels.dim(2));
    std::vector<float> weights(static_cast<size_t>(w / 16) * (h / 16), 1.0f);  // image-to-image: all repainted
    std::string mname;
    if (in.has_mask()) {
      mname = in.mask_path.empty() ? (in.mask_data.name.empty() ? "mask" : in.mask_data.name) : in.mask_path;
      KLEIN_ASSIGN_OR_RETURN(Image mk, read(in.mask_path, in.mask_data, "mask"));
      weights = preprocess_mask(mk, w, h);
    }
    // The inpainting pipeline's own default guidance (base models; distilled ones ignore it).
    if (options.guidance_scale < 0) {
      KLEIN_ASSIGN_OR_RETURN(gd, m->guidance(kInpaintDefaultGuidance, nullptr));
    }
    source_pixels = std::move(pixels);
    mask = std::move(weights);
    strength = st;
    source_name = name;
    mask_name = mname;
    inpaint = true;
    ref_tokens += static_cast<int64_t>(mask.size());
    return Status::Ok();
  }

  Result<Model::Impl::Geometry> geometry(int width, int height, int steps,
                                         const std::function<void(const std::string&)>& log) const {
    if (inpaint) {  // the source's size, as the pipeline (its width/height arguments are overwritten)
      const int w = static_cast<int>(source_w()), h = static_cast<int>(source_h());
      if (log && ((width > 0 && width != w) || (height > 0 && height != h)))
        log("the output takes the source image's size " + std::to_string(w) + "x" + std::to_string(h) +
            " (as diffusers' inpainting pipeline); the width and height asked for are not used");
      return m->resolve(w, h, steps, nullptr, log);
    }
    return m->resolve(width, height, steps, first_ref ? &*first_ref : nullptr, log);
  }
  // The source's preprocessed size (inpainting), from its pixels or, once encoded, its latents.
  int64_t source_w() const { return source_pixels ? source_pixels->dim(3) : ref_latents.at(0).dim(3) * 16; }
  int64_t source_h() const { return source_pixels ? source_pixels->dim(2) : ref_latents.at(0).dim(2) * 16; }

  // The references through the VAE, once (the first denoise); the VAE is held for the decode.
  // Inpainting: the source is encoded first, as the first reference.
  Status encode_references(const RunContext& ctx) {
    if (prepared.empty() && !source_pixels) return Status::Ok();
    if (source_pixels) {
      prepared.insert(prepared.begin(), PreparedReference{source_name, std::move(*source_pixels)});
      source_pixels.reset();
    }
    KLEIN_ASSIGN_OR_RETURN(vae, m->vae_model());
    KLEIN_ASSIGN_OR_RETURN(ref_latents, encode_reference_latents(*vae, prepared, ctx, m->vae_tiling()));
    prepared.clear();  // pixels no longer needed
    return Status::Ok();
  }

  Status denoise(const Model::Impl::Geometry& geo, Tensor noise, const RunContext& ctx,
                 const std::function<void(int, int, const Image&)>& preview) {
    KLEIN_RETURN_IF_ERROR(need_prompt("denoise"));
    KLEIN_RETURN_IF_ERROR(encode_references(ctx));
    latents.reset();
    Model::Impl::Inpaint ip;
    if (inpaint) {
      ip.image_latents = &ref_latents.at(0);
      ip.mask = &mask;
      ip.strength = strength;
    }
    KLEIN_ASSIGN_OR_RETURN(Tensor z, m->denoise(*cond, uncond ? &*uncond : nullptr, gd.scale, ref_latents, geo,
                                                std::move(noise), ctx, preview, dit, inpaint ? &ip : nullptr));
    latents = std::move(z);
    g = geo;
    return Status::Ok();
  }

  // The float image [1, 3, H, W] of the last denoise.
  Result<Tensor> decode(const RunContext& ctx) {
    if (!latents) return invalid_argument("Session::decode: no latents: call denoise first");
    std::shared_ptr<const Flux2Vae> v = vae;
    if (!v) {
      KLEIN_ASSIGN_OR_RETURN(v, m->vae_model());
    }
    // Without references the VAE is not kept between images (the plan has no VAE during denoising).
    if (ref_latents.empty()) vae.reset();
    return decode_latents(*v, latents->clone(), ctx, m->vae_tiling());
  }
};

// ---- Session ----------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::create(const Model& model, const SessionOptions& options) {
  return api::guarded("Session::create", [&]() -> Result<std::unique_ptr<Session>> {
    const Model::Impl& m = *model.impl_;
    KLEIN_RETURN_IF_ERROR(m.require_full_model("Session::create"));
    auto s = std::make_unique<Impl>();
    s->m = &m;
    s->options = options;
    KLEIN_ASSIGN_OR_RETURN(s->gd, m.guidance(options.guidance_scale, nullptr));
    return std::unique_ptr<Session>(new Session(std::move(s)));
  });
}

bool Session::guided() const { return impl_->gd.cfg; }
float Session::guidance_scale() const { return impl_->gd.cfg ? impl_->gd.scale : 1.0f; }
int Session::width() const { return impl_->latents ? impl_->g.width : 0; }
int Session::height() const { return impl_->latents ? impl_->g.height : 0; }
int Session::steps() const { return impl_->latents ? impl_->g.steps : 0; }

Status Session::encode_prompt(const std::string& prompt, const Callbacks& cb, const DumpOptions& dump) {
  return api::guarded("Session::encode_prompt", [&]() -> Status {
    Impl& s = *impl_;
    std::lock_guard<std::mutex> lock(s.m->mu);
    if (s.options.guidance_scale > 1 && s.m->distilled && cb.log) (void)s.m->guidance(s.options.guidance_scale, cb.log);
    Dumper dumper(dump.dir, dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*s.m->engine, &dumper, cb);
    KLEIN_RETURN_IF_ERROR(s.m->plan_request(16, 16, 0, cb.log, /*encode_only=*/true));
    KLEIN_RETURN_IF_ERROR(s.encode(prompt, std::nullopt, std::nullopt, ctx));
    return dumper.status();
  });
}

Status Session::set_prompt_embeddings(const FloatArray& embeds, const FloatArray& negative, const Callbacks& cb) {
  return api::guarded("Session::set_prompt_embeddings", [&]() -> Status {
    Impl& s = *impl_;
    KLEIN_ASSIGN_OR_RETURN(Tensor c, to_tensor(embeds, "prompt embeddings"));
    KLEIN_RETURN_IF_ERROR(s.check_given(c, "prompt embeddings"));
    std::optional<Tensor> u;
    if (!negative.data.empty()) {
      KLEIN_ASSIGN_OR_RETURN(u, to_tensor(negative, "negative prompt embeddings"));
      KLEIN_RETURN_IF_ERROR(s.check_given(*u, "negative prompt embeddings"));
    }
    std::lock_guard<std::mutex> lock(s.m->mu);
    const RunContext ctx = api::make_run_context(*s.m->engine, nullptr, cb);
    if (s.gd.cfg && !u) KLEIN_RETURN_IF_ERROR(s.m->plan_request(16, 16, 0, cb.log, /*encode_only=*/true));
    return s.encode("", std::move(c), std::move(u), ctx);
  });
}

Status Session::set_references(const std::vector<std::string>& paths, const std::vector<ReferenceImage>& data) {
  return api::guarded("Session::set_references", [&]() -> Status { return impl_->set_references(paths, data); });
}

Status Session::set_init_image(const InitImage& init) {
  return api::guarded("Session::set_init_image", [&]() -> Status { return impl_->set_init_image(init); });
}

Status Session::denoise(const DenoiseParams& p, const Callbacks& cb) {
  return api::guarded("Session::denoise", [&]() -> Status {
    Impl& s = *impl_;
    KLEIN_RETURN_IF_ERROR(s.need_prompt("denoise"));
    std::lock_guard<std::mutex> lock(s.m->mu);
    KLEIN_ASSIGN_OR_RETURN(auto g, s.geometry(p.width, p.height, p.steps, cb.log));
    KLEIN_RETURN_IF_ERROR(Model::Impl::set_schedule(g, p.steps, p.sigmas, p.shift));
    KLEIN_ASSIGN_OR_RETURN(Tensor noise, make_noise(&p.noise, p.noise_name, g.width, g.height, p.seed, p.bf16_noise));
    Dumper dumper(p.dump.dir, p.dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*s.m->engine, &dumper, cb);
    KLEIN_RETURN_IF_ERROR(s.m->plan_request(g.width, g.height, s.ref_tokens, cb.log, false, s.gd.cfg, s.inpaint));
    KLEIN_RETURN_IF_ERROR(s.denoise(g, std::move(noise), ctx, cb.preview));
    return dumper.status();
  });
}

Result<Latents> Session::latents() const {
  return api::guarded("Session::latents", [&]() -> Result<Latents> {
    if (!impl_->latents) return invalid_argument("Session::latents: no latents: call denoise first");
    Latents r;
    static_cast<FloatArray&>(r) = to_array(*impl_->latents);
    return r;
  });
}

Result<Image> Session::decode(const Callbacks& cb, const DumpOptions& dump) {
  return api::guarded("Session::decode", [&]() -> Result<Image> {
    Impl& s = *impl_;
    if (!s.latents) return invalid_argument("Session::decode: no latents: call denoise first");
    std::lock_guard<std::mutex> lock(s.m->mu);
    Dumper dumper(dump.dir, dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*s.m->engine, &dumper, cb);
    KLEIN_RETURN_IF_ERROR(s.m->plan_request(s.g.width, s.g.height, 0, cb.log));
    KLEIN_ASSIGN_OR_RETURN(Tensor image, s.decode(ctx));
    KLEIN_RETURN_IF_ERROR(dumper.status());
    return to_rgb8(image);
  });
}

// ---- Model: whole requests --------------------------------------------------------------------

bool Model::distilled() const { return impl_->distilled; }

Result<GenerateResult> Model::generate(const GenerateRequest& req, const Callbacks& cb) {
  return api::guarded("generate", [&]() -> Result<GenerateResult> {
    KLEIN_ASSIGN_OR_RETURN(auto r, generate_batch(req, {req.seed}, cb));
    return std::move(r[0]);
  });
}

Result<std::vector<GenerateResult>> Model::generate_batch(const GenerateRequest& req, const std::vector<uint64_t>& seeds,
                                                          const Callbacks& cb) {
  return api::guarded("generate", [&]() -> Result<std::vector<GenerateResult>> {
    // The whole request under one lock: the plan made below holds for every phase.
    std::lock_guard<std::mutex> lock(impl_->mu);
    const Model::Impl& m = *impl_;
    KLEIN_RETURN_IF_ERROR(m.require_full_model("generate"));
    for (const LoraSpec& l : req.loras)
      if (l.path.empty() || !std::isfinite(l.scale) || std::fabs(l.scale) > 100.0f)
        return invalid_argument("generate: lora '" + l.path + "': a file and a scale from -100 to 100");
    // This request's LoRAs, for the models it loads (cleared however the request ends).
    struct RequestLoras {
      const Model::Impl& m;
      ~RequestLoras() { m.request_loras = nullptr; }
    } request_loras{m};
    m.request_loras = req.loras.empty() ? nullptr : &req.loras;
    if (seeds.empty() || seeds.size() > 64)
      return invalid_argument("generate: " + std::to_string(seeds.size()) + " seeds (1 to 64 images per request)");
    if (seeds.size() > 1 && !req.noise_npy.empty())
      return invalid_argument("generate: a noise file gives one image; several seeds need seeded noise");
    Session::Impl s;
    s.m = &m;
    s.options.guidance_scale = req.guidance_scale;
    s.options.negative_prompt = req.negative_prompt;
    KLEIN_ASSIGN_OR_RETURN(s.gd, m.guidance(req.guidance_scale, cb.log));
    // Reference images are read and preprocessed before any model work: a bad file fails fast.
    KLEIN_RETURN_IF_ERROR(s.set_references(req.reference_images, req.reference_data));
    if (!req.init_image.empty()) KLEIN_RETURN_IF_ERROR(s.set_init_image(req.init_image));
    KLEIN_ASSIGN_OR_RETURN(auto g, s.geometry(req.width, req.height, req.steps, cb.log));
    KLEIN_RETURN_IF_ERROR(Model::Impl::set_schedule(g, req.steps, req.sigmas, req.shift));
    // The initial noise too (cheap, and a bad --noise file fails fast).
    FloatArray given;
    if (!req.noise_npy.empty()) {
      KLEIN_ASSIGN_OR_RETURN(auto arr, read_npy(req.noise_npy));
      given.shape = arr.shape;
      given.data = arr.to_f32();
    }
    KLEIN_ASSIGN_OR_RETURN(Tensor noise, make_noise(&given, req.noise_npy, g.width, g.height, seeds[0], req.bf16_noise));
    given = {};
    // Given prompt embeddings replace the text encoder; read and checked before any model work.
    std::optional<Tensor> given_embeds;
    if (!req.prompt_embeds_npy.empty()) {
      KLEIN_ASSIGN_OR_RETURN(auto arr, read_npy(req.prompt_embeds_npy));
      FloatArray e{arr.shape, arr.to_f32()};
      KLEIN_ASSIGN_OR_RETURN(Tensor t, to_tensor(e, req.prompt_embeds_npy));
      KLEIN_RETURN_IF_ERROR(s.check_given(t, req.prompt_embeds_npy));
      given_embeds = std::move(t);
    }
    // With a memory budget: the plan, or the size this request needs, before any model work.
    KLEIN_RETURN_IF_ERROR(m.plan_request(g.width, g.height, s.ref_tokens, cb.log, false, s.gd.cfg, s.inpaint));

    Dumper dumper(req.dump.dir, req.dump.filter);
    KLEIN_RETURN_IF_ERROR(dumper.status());
    const RunContext ctx = api::make_run_context(*m.engine, &dumper, cb);
    KLEIN_RETURN_IF_ERROR(s.encode(req.prompt, std::move(given_embeds), std::nullopt, ctx));

    // Several seeds: every denoise first, with the transformer loaded once for all of them, then
    // every decode (kLow keeps one of the two in memory at a time, as for one image).
    std::vector<Tensor> latents;
    if (seeds.size() > 1) {
      KLEIN_RETURN_IF_ERROR(s.encode_references(ctx));
      KLEIN_ASSIGN_OR_RETURN(s.dit, m.transformer(ctx));
    }
    for (size_t k = 0; k < seeds.size(); ++k) {
      if (k > 0) {
        KLEIN_ASSIGN_OR_RETURN(noise, make_noise(nullptr, "", g.width, g.height, seeds[k], req.bf16_noise));
      }
      KLEIN_RETURN_IF_ERROR(s.denoise(g, std::move(noise), ctx, cb.preview));
      latents.push_back(std::move(*s.latents));
    }
    s.dit.reset();
    std::vector<GenerateResult> results;
    for (size_t k = 0; k < seeds.size(); ++k) {
      s.latents = std::move(latents[k]);
      KLEIN_ASSIGN_OR_RETURN(Tensor image, s.decode(ctx));
      KLEIN_RETURN_IF_ERROR(dumper.status());

      GenerateResult r;
      r.image = to_rgb8(image);
      r.width = g.width;
      r.height = g.height;
      r.steps = g.steps;
      r.metadata = {{"prompt", req.prompt_embeds_npy.empty()
                                   ? req.prompt
                                   : "embeddings file " + last_path_component(req.prompt_embeds_npy)},
                    {"seed", req.noise_npy.empty() ? std::to_string(seeds[k]) : std::string("noise file ") + req.noise_npy},
                    {"steps", std::to_string(g.steps)},
                    {"size", std::to_string(g.width) + "x" + std::to_string(g.height)},
                    {"precision", m.options.precision == Precision::kFast ? "fast" : "fp32"},
                    {"model", last_path_component(m.path.empty() ? m.dit_spec.where : m.path)},
                    {"software", std::string("klein.cpp ") + version()}};
      if (s.inpaint) {
        r.metadata.emplace_back(s.mask_name.empty() ? "image-to-image source" : "inpainting source",
                                last_path_component(s.source_name));
        if (!s.mask_name.empty()) r.metadata.emplace_back("mask", last_path_component(s.mask_name));
        r.metadata.emplace_back("strength", format_scale(s.strength));
      }
      if (!g.sigmas.empty()) {
        std::string v;
        for (double x : g.sigmas) v += (v.empty() ? "" : ",") + format_scale(x);
        r.metadata.emplace_back("sigmas", v);
      }
      if (g.shift > 0) r.metadata.emplace_back("shift", format_scale(g.shift));
      if (s.gd.cfg) {
        r.metadata.emplace_back("guidance scale", format_scale(s.gd.scale));
        r.metadata.emplace_back("negative prompt", req.negative_prompt);
      }
      for (size_t i = 0; i < req.reference_images.size(); ++i)
        r.metadata.emplace_back("reference" + std::to_string(i + 1), last_path_component(req.reference_images[i]));
      for (size_t i = 0; i < req.reference_data.size(); ++i)
        r.metadata.emplace_back("reference" + std::to_string(req.reference_images.size() + i + 1),
                                last_path_component(req.reference_data[i].name));
      results.push_back(std::move(r));
    }
    return results;
  });
}

}  // namespace klein
