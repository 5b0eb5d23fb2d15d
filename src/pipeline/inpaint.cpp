// (Compiled with -ffp-contract=off: scale_noise and the blend round every operation to float32
// as torch's separate tensor operations do.)
#include "pipeline/inpaint.h"

#include <algorithm>
#include <cmath>

#include "pipeline/image_preprocess.h"
#include "pipeline/latents.h"

namespace klein {

Result<Tensor> preprocess_source_image(const Image& image, const std::string& name) {
  const Image* src = &image;
  Image area;
  int64_t w = image.width, h = image.height;
  if (w * h > int64_t{1024} * 1024) {
    // `scale = math.sqrt(1024 * 1024 / (raw_h * raw_w))`, `int(raw_h * scale)`: doubles, truncated.
    const double s = std::sqrt(1048576.0 / static_cast<double>(h * w));
    area = resize_lanczos(image, static_cast<int>(static_cast<double>(w) * s), static_cast<int>(static_cast<double>(h) * s));
    src = &area;
    w = area.width;
    h = area.height;
  }
  const int w16 = static_cast<int>(w / 16 * 16), h16 = static_cast<int>(h / 16 * 16);
  if (w16 < 16 || h16 < 16)
    return invalid_argument(name + ": image " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                            " is too small: inpainting needs at least 16 pixels on each side");
  // VaeImageProcessor.preprocess(resize_mode="default"): a Lanczos resize to (w16, h16).
  const Image sized = resize_lanczos(*src, w16, h16);
  Tensor t({1, 3, h16, w16});
  float* out = t.data();
  const size_t plane = static_cast<size_t>(h16) * w16;
  for (size_t i = 0; i < plane; ++i)
    for (int c = 0; c < 3; ++c) {
      // numpy float32(u) / 255.0, then torch's 2.0 * x - 1.0 (2x is exact).
      const float v = static_cast<float>(sized.rgb[i * 3 + c]) / 255.0f;
      out[c * plane + i] = 2.0f * v - 1.0f;
    }
  return t;
}

std::vector<float> preprocess_mask(const Image& mask, int width, int height) {
  // VaeImageProcessor.preprocess resizes before the grey conversion: Lanczos on the RGB image.
  const Image sized = resize_lanczos(mask, width, height);
  auto bit = [&](int y, int x) -> float {
    const uint8_t* p = sized.rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
    const float v = static_cast<float>(pillow_luma(p[0], p[1], p[2])) / 255.0f;
    return v < 0.5f ? 0.0f : 1.0f;  // binarize
  };
  // F.interpolate(mode="bilinear") by exactly 1/16: source row 16·y + 7.5, weights ½ and ½ on
  // rows 16y+7 and 16y+8 (the same for columns). Sums of quarters of 0/1: exact in any order.
  const int th = height / 16, tw = width / 16;
  std::vector<float> w(static_cast<size_t>(th) * tw);
  for (int y = 0; y < th; ++y)
    for (int x = 0; x < tw; ++x) {
      const int y0 = 16 * y + 7, x0 = 16 * x + 7;
      const float top = 0.5f * bit(y0, x0) + 0.5f * bit(y0, x0 + 1);
      const float bottom = 0.5f * bit(y0 + 1, x0) + 0.5f * bit(y0 + 1, x0 + 1);
      w[static_cast<size_t>(y) * tw + x] = 0.5f * top + 0.5f * bottom;
    }
  return w;
}

int strength_start_step(int steps, double strength) {
  const double n = static_cast<double>(steps);
  const double init_timestep = std::min(n * strength, n);
  return static_cast<int>(std::max(n - init_timestep, 0.0));
}

Schedule cut_schedule(const Schedule& full, int t_start) {
  Schedule s;
  s.mu = full.mu;
  s.timesteps.assign(full.timesteps.begin() + t_start, full.timesteps.end());
  s.sigmas.assign(full.sigmas.begin() + t_start, full.sigmas.end());
  return s;
}

void scale_noise(float* out, const float* x, const float* noise, int64_t n, float sigma) {
  const float keep = 1.0f - sigma;  // (1.0 - sigma): a float32 tensor
  for (int64_t i = 0; i < n; ++i) {
    const float a = sigma * noise[i];
    const float b = keep * x[i];
    out[i] = a + b;
  }
}

void inpaint_blend(float* latents, const float* renoised, const float* mask, int64_t tokens, int64_t channels) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float m = mask[t], keep = 1.0f - m;
    float* l = latents + t * channels;
    const float* r = renoised + t * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const float a = keep * r[c];
      const float b = m * l[c];
      l[c] = a + b;
    }
  }
}

Result<InpaintRun> InpaintRun::make(const Tensor& image_latents, const Tensor& noise, std::vector<float> mask,
                                    const Schedule& schedule, Tensor* start, const RunContext& ctx) {
  const int64_t th = noise.dim(2), tw = noise.dim(3);
  if (image_latents.shape() != noise.shape() || static_cast<int64_t>(mask.size()) != th * tw)
    return internal_error("inpainting: source latents " + shape_str(image_latents.shape()) + ", noise " +
                          shape_str(noise.shape()) + " and " + std::to_string(mask.size()) + " mask weights differ");
  InpaintRun r;
  r.image_tokens = pack_latents(image_latents);
  r.noise_tokens = pack_latents(noise);
  r.mask = std::move(mask);
  r.sigmas = schedule.sigmas;
  r.renoised = Tensor({th * tw, noise.dim(1)});
  Tensor s(noise.shape());
  scale_noise(s.data(), image_latents.data(), noise.data(), s.numel(), schedule.sigmas[0]);
  ctx.dump("image_latents", image_latents);
  ctx.dump("init_latents", s);
  if (ctx.dumper) {
    Tensor m({1, th * tw, 1});
    std::copy(r.mask.begin(), r.mask.end(), m.data());
    ctx.dump("mask", m);
  }
  *start = std::move(s);
  return r;
}

StepHooks InpaintRun::hooks() {
  StepHooks h;
  h.after_step = [this](int i, Tensor& latents) -> Status {
    const int steps = static_cast<int>(sigmas.size()) - 1;
    const int64_t n = image_tokens.numel();
    const float* target = image_tokens.data();
    if (i < steps - 1) {  // re-noised to the next step's sigma; after the last step the clean latents
      scale_noise(renoised.data(), image_tokens.data(), noise_tokens.data(), n, sigmas[i + 1]);
      target = renoised.data();
    }
    inpaint_blend(latents.data(), target, mask.data(), latents.dim(0), latents.dim(1));
    return Status::Ok();
  };
  return h;
}

}  // namespace klein
