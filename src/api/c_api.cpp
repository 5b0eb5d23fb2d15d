// The C API over klein::Model. Every entry point is noexcept in effect: the C++ API already
// turns exceptions into Status, and the glue here runs under the same catch-all.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "api/guard.h"
#include "klein/klein.h"
#include "klein/klein_c.h"

struct klein_model {
  std::unique_ptr<klein::Model> model;
};

struct klein_session {
  std::unique_ptr<klein::Session> session;
  klein::Callbacks cb;
};

namespace {

static_assert(static_cast<int>(klein::Code::kInternal) == KLEIN_INTERNAL, "klein_status mirrors klein::Code");
static_assert(static_cast<int>(klein::Code::kOutOfMemory) == KLEIN_OUT_OF_MEMORY, "klein_status mirrors klein::Code");

klein_status report(const klein::Status& s, klein_error* err) {
  if (err) {
    err->code = static_cast<int>(s.code());
    err->message[0] = '\0';
    if (!s.ok()) {
      // The message without the code prefix; truncated to fit, always NUL-terminated.
      std::strncpy(err->message, s.message().c_str(), sizeof err->message - 1);
      err->message[sizeof err->message - 1] = '\0';
    }
  }
  return static_cast<klein_status>(s.code());
}

// The C callbacks as klein::Callbacks (capturing copies of the pointers).
template <class P>
klein::Callbacks c_callbacks(const P& p) {
  klein::Callbacks cb;
  if (p.progress) cb.progress = [p](const std::string& phase, int d, int t) { p.progress(phase.c_str(), d, t, p.user_data); };
  if (p.log) cb.log = [p](const std::string& m) { p.log(m.c_str(), p.user_data); };
  if (p.cancel) cb.cancel = [p]() { return p.cancel(p.user_data) != 0; };
  if (p.preview)
    cb.preview = [p](int step, int total, const klein::Image& img) {
      klein_image view{img.width, img.height, const_cast<unsigned char*>(img.rgb.data())};
      p.preview(step, total, &view, p.user_data);
    };
  return cb;
}

// A malloc'ed copy of `img` for the C caller (freed with klein_image_free).
klein_image* c_image(const klein::Image& img) {
  auto* ci = static_cast<klein_image*>(std::malloc(sizeof(klein_image)));
  if (!ci) throw std::bad_alloc();
  ci->width = img.width;
  ci->height = img.height;
  ci->rgb = static_cast<unsigned char*>(std::malloc(img.rgb.size() ? img.rgb.size() : 1));
  if (!ci->rgb) {
    std::free(ci);
    throw std::bad_alloc();
  }
  std::memcpy(ci->rgb, img.rgb.data(), img.rgb.size());
  return ci;
}

}  // namespace

extern "C" {

klein_load_params klein_load_default_params(void) {
  klein_load_params p;
  p.threads = 0;
  p.memory = KLEIN_MEMORY_LOW;
  p.isa = nullptr;
  p.vae_tile = 0;
  p.precision = KLEIN_PRECISION_FAST;
  p.max_memory_gib = 0;
  p.backend = KLEIN_BACKEND_AUTO;
  p.diffusion_model = nullptr;
  p.text_encoder = nullptr;
  p.vae = nullptr;
  p.variant = KLEIN_VARIANT_AUTO;
  p.verify_manifest = nullptr;
  p.lora_paths = nullptr;
  p.lora_scales = nullptr;
  p.num_loras = 0;
  p.lora_mode = KLEIN_LORA_AUTO;
  return p;
}

klein_generate_params klein_generate_default_params(void) {
  klein_generate_params p;
  std::memset(&p, 0, sizeof p);
  p.guidance_scale = -1;
  p.strength = -1;
  return p;
}

klein_session_params klein_session_default_params(void) {
  klein_session_params p;
  std::memset(&p, 0, sizeof p);
  p.guidance_scale = -1;
  return p;
}

klein_denoise_params klein_denoise_default_params(void) {
  klein_denoise_params p;
  std::memset(&p, 0, sizeof p);
  return p;
}

klein_status klein_model_open(const char* path, const klein_load_params* params, klein_model** out,
                              klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_model_open", [&]() -> klein::Status {
    if (!out) return klein::invalid_argument("klein_model_open: out is NULL");
    *out = nullptr;
    const klein_load_params p = params ? *params : klein_load_default_params();
    if (p.variant != KLEIN_VARIANT_AUTO && p.variant != KLEIN_VARIANT_DISTILLED && p.variant != KLEIN_VARIANT_BASE)
      return klein::invalid_argument(
          "klein_model_open: variant must be KLEIN_VARIANT_AUTO, KLEIN_VARIANT_DISTILLED or KLEIN_VARIANT_BASE");
    if (p.memory != KLEIN_MEMORY_LOW && p.memory != KLEIN_MEMORY_RESIDENT)
      return klein::invalid_argument("klein_model_open: memory must be KLEIN_MEMORY_LOW or KLEIN_MEMORY_RESIDENT");
    if (p.precision != KLEIN_PRECISION_FP32 && p.precision != KLEIN_PRECISION_FAST)
      return klein::invalid_argument("klein_model_open: precision must be KLEIN_PRECISION_FP32 or KLEIN_PRECISION_FAST");
    if (p.backend != KLEIN_BACKEND_AUTO && p.backend != KLEIN_BACKEND_CPU && p.backend != KLEIN_BACKEND_CUDA)
      return klein::invalid_argument(
          "klein_model_open: backend must be KLEIN_BACKEND_AUTO, KLEIN_BACKEND_CPU or KLEIN_BACKEND_CUDA");
    klein::LoadOptions o;
    o.threads = p.threads;
    o.memory = p.memory == KLEIN_MEMORY_RESIDENT ? klein::MemoryPolicy::kResident : klein::MemoryPolicy::kLow;
    o.isa = p.isa ? p.isa : "";
    o.vae_tile = p.vae_tile;
    o.max_memory_gib = p.max_memory_gib;
    o.precision = p.precision == KLEIN_PRECISION_FAST ? klein::Precision::kFast : klein::Precision::kFp32;
    o.backend = p.backend == KLEIN_BACKEND_CUDA  ? klein::BackendKind::kCuda
                : p.backend == KLEIN_BACKEND_CPU ? klein::BackendKind::kCpu
                                                 : klein::BackendKind::kAuto;
    o.diffusion_model = p.diffusion_model ? p.diffusion_model : "";
    o.text_encoder = p.text_encoder ? p.text_encoder : "";
    o.vae = p.vae ? p.vae : "";
    o.variant = p.variant == KLEIN_VARIANT_BASE        ? klein::Variant::kBase
                : p.variant == KLEIN_VARIANT_DISTILLED ? klein::Variant::kDistilled
                : p.variant == KLEIN_VARIANT_KV        ? klein::Variant::kKv
                                                       : klein::Variant::kAuto;
    o.verify_manifest = p.verify_manifest ? p.verify_manifest : "";
    if (p.num_loras < 0 || (p.num_loras > 0 && !p.lora_paths))
      return klein::invalid_argument("klein_model_open: num_loras needs that many lora_paths");
    if (p.lora_mode != KLEIN_LORA_AUTO && p.lora_mode != KLEIN_LORA_MERGE && p.lora_mode != KLEIN_LORA_RUNTIME)
      return klein::invalid_argument("klein_model_open: lora_mode must be KLEIN_LORA_AUTO, KLEIN_LORA_MERGE or "
                                     "KLEIN_LORA_RUNTIME");
    for (int i = 0; i < p.num_loras; ++i)
      o.loras.push_back({p.lora_paths[i] ? p.lora_paths[i] : "", p.lora_scales ? p.lora_scales[i] : 1.0f});
    o.lora_mode = p.lora_mode == KLEIN_LORA_MERGE     ? klein::LoraMode::kMerge
                  : p.lora_mode == KLEIN_LORA_RUNTIME ? klein::LoraMode::kRuntime
                                                      : klein::LoraMode::kAuto;
    auto m = klein::Model::open(path ? path : "", o);
    if (!m.ok()) return m.status();
    *out = new klein_model{std::move(m).value()};
    return klein::Status::Ok();
  });
  return report(s, err);
}

klein_status klein_model_generate(klein_model* model, const klein_generate_params* params, klein_image** out,
                                  klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_model_generate", [&]() -> klein::Status {
    if (!out) return klein::invalid_argument("klein_model_generate: out is NULL");
    *out = nullptr;
    if (!model || !model->model) return klein::invalid_argument("klein_model_generate: model is NULL");
    if (!params) return klein::invalid_argument("klein_model_generate: params is NULL");
    if (!params->prompt && !params->prompt_embeds_npy)
      return klein::invalid_argument("klein_model_generate: prompt is NULL (and no prompt_embeds_npy)");
    if (params->prompt && params->prompt_embeds_npy)
      return klein::invalid_argument("klein_model_generate: prompt and prompt_embeds_npy exclude each other");
    if (params->num_reference_images < 0 || (params->num_reference_images > 0 && !params->reference_images))
      return klein::invalid_argument("klein_model_generate: reference_images does not hold num_reference_images paths");
    klein::GenerateRequest req;
    if (params->prompt) req.prompt = params->prompt;
    if (params->prompt_embeds_npy) req.prompt_embeds_npy = params->prompt_embeds_npy;
    req.width = params->width;
    req.height = params->height;
    req.steps = params->steps;
    req.seed = params->seed;
    req.noise_npy = params->noise_npy ? params->noise_npy : "";
    req.bf16_noise = params->bf16_noise != 0;
    req.guidance_scale = params->guidance_scale;
    if (params->negative_prompt) req.negative_prompt = params->negative_prompt;
    if (params->mask_image && !params->init_image)
      return klein::invalid_argument("klein_model_generate: mask_image needs init_image (the source image)");
    if (params->init_image) req.init_image.path = params->init_image;
    if (params->mask_image) req.init_image.mask_path = params->mask_image;
    req.init_image.strength = params->strength;
    for (int i = 0; i < params->num_reference_images; ++i) {
      if (!params->reference_images[i])
        return klein::invalid_argument("klein_model_generate: reference_images[" + std::to_string(i) + "] is NULL");
      req.reference_images.emplace_back(params->reference_images[i]);
    }
    const klein::Callbacks cb = c_callbacks(*params);
    auto r = model->model->generate(req, cb);
    if (!r.ok()) return r.status();
    // malloc, not new: the image is a C object the caller may inspect and frees with klein_image_free.
    *out = c_image(r->image);
    return klein::Status::Ok();
  });
  return report(s, err);
}

void klein_model_free(klein_model* model) { delete model; }

klein_status klein_model_estimate_memory(klein_model* model, int width, int height, const int* ref_sizes, int num_refs,
                                         double guidance_scale, klein_memory_estimate* out, klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_model_estimate_memory", [&]() -> klein::Status {
    if (!out) return klein::invalid_argument("klein_model_estimate_memory: out is NULL");
    *out = klein_memory_estimate{};
    if (!model || !model->model) return klein::invalid_argument("klein_model_estimate_memory: model is NULL");
    if (num_refs < 0 || (num_refs > 0 && !ref_sizes))
      return klein::invalid_argument("klein_model_estimate_memory: ref_sizes does not hold num_refs pairs");
    klein::RequestSize rs;
    rs.width = width;
    rs.height = height;
    rs.guidance_scale = guidance_scale;
    for (int i = 0; i < num_refs; ++i) rs.references.emplace_back(ref_sizes[2 * i], ref_sizes[2 * i + 1]);
    auto e = model->model->estimate_memory(rs);
    if (!e.ok()) return e.status();
    *out = klein_memory_estimate{e->width, e->height, e->image_tokens, e->reference_tokens, e->guidance ? 1 : 0,
                                 e->resident_bytes, e->minimum_bytes};
    return klein::Status::Ok();
  });
  return report(s, err);
}

klein_status klein_session_create(klein_model* model, const klein_session_params* params, klein_session** out,
                                  klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_session_create", [&]() -> klein::Status {
    if (!out) return klein::invalid_argument("klein_session_create: out is NULL");
    *out = nullptr;
    if (!model || !model->model) return klein::invalid_argument("klein_session_create: model is NULL");
    const klein_session_params p = params ? *params : klein_session_default_params();
    klein::SessionOptions o;
    o.guidance_scale = p.guidance_scale;
    if (p.negative_prompt) o.negative_prompt = p.negative_prompt;
    auto r = klein::Session::create(*model->model, o);
    if (!r.ok()) return r.status();
    *out = new klein_session{std::move(r).value(), c_callbacks(p)};
    return klein::Status::Ok();
  });
  return report(s, err);
}

klein_status klein_session_encode_prompt(klein_session* session, const char* prompt, klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_session_encode_prompt", [&]() -> klein::Status {
    if (!session || !session->session) return klein::invalid_argument("klein_session_encode_prompt: session is NULL");
    if (!prompt) return klein::invalid_argument("klein_session_encode_prompt: prompt is NULL");
    return session->session->encode_prompt(prompt, session->cb);
  });
  return report(s, err);
}

klein_status klein_session_set_references(klein_session* session, const char* const* paths, int num_paths,
                                          klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_session_set_references", [&]() -> klein::Status {
    if (!session || !session->session) return klein::invalid_argument("klein_session_set_references: session is NULL");
    if (num_paths < 0 || (num_paths > 0 && !paths))
      return klein::invalid_argument("klein_session_set_references: paths does not hold num_paths paths");
    std::vector<std::string> v;
    for (int i = 0; i < num_paths; ++i) {
      if (!paths[i])
        return klein::invalid_argument("klein_session_set_references: paths[" + std::to_string(i) + "] is NULL");
      v.emplace_back(paths[i]);
    }
    return session->session->set_references(v);
  });
  return report(s, err);
}

klein_status klein_session_set_init_image(klein_session* session, const char* image, const char* mask,
                                          double strength, klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_session_set_init_image", [&]() -> klein::Status {
    if (!session || !session->session) return klein::invalid_argument("klein_session_set_init_image: session is NULL");
    if (!image) return klein::invalid_argument("klein_session_set_init_image: image is NULL");
    klein::InitImage in;
    in.path = image;
    if (mask) in.mask_path = mask;
    in.strength = strength;
    return session->session->set_init_image(in);
  });
  return report(s, err);
}

klein_status klein_session_denoise(klein_session* session, const klein_denoise_params* params, klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_session_denoise", [&]() -> klein::Status {
    if (!session || !session->session) return klein::invalid_argument("klein_session_denoise: session is NULL");
    const klein_denoise_params p = params ? *params : klein_denoise_default_params();
    klein::DenoiseParams d;
    d.width = p.width;
    d.height = p.height;
    d.steps = p.steps;
    d.seed = p.seed;
    d.bf16_noise = p.bf16_noise != 0;
    return session->session->denoise(d, session->cb);
  });
  return report(s, err);
}

klein_status klein_session_decode(klein_session* session, klein_image** out, klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_session_decode", [&]() -> klein::Status {
    if (!out) return klein::invalid_argument("klein_session_decode: out is NULL");
    *out = nullptr;
    if (!session || !session->session) return klein::invalid_argument("klein_session_decode: session is NULL");
    auto r = session->session->decode(session->cb);
    if (!r.ok()) return r.status();
    *out = c_image(*r);
    return klein::Status::Ok();
  });
  return report(s, err);
}

int klein_session_guided(const klein_session* session) {
  return session && session->session && session->session->guided() ? 1 : 0;
}

void klein_session_free(klein_session* session) { delete session; }

klein_status klein_image_save_png(const klein_image* image, const char* path, klein_error* err) {
  const klein::Status s = klein::api::guarded("klein_image_save_png", [&]() -> klein::Status {
    if (!image || !image->rgb || image->width <= 0 || image->height <= 0)
      return klein::invalid_argument("klein_image_save_png: empty image");
    if (!path) return klein::invalid_argument("klein_image_save_png: path is NULL");
    klein::Image img;
    img.width = image->width;
    img.height = image->height;
    img.rgb.assign(image->rgb, image->rgb + static_cast<size_t>(image->width) * image->height * 3);
    return klein::save_png(path, img, {{"software", std::string("klein.cpp ") + klein::version()}});
  });
  return report(s, err);
}

void klein_image_free(klein_image* image) {
  if (!image) return;
  std::free(image->rgb);
  std::free(image);
}

const char* klein_version(void) { return klein::version(); }

}  // extern "C"
