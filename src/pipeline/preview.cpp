#include "pipeline/preview.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace klein {

extern const char kFlux2LatentRgbJson[];  // generated from data/flux2_latent_rgb.json

Result<LatentRgbMap> parse_latent_rgb_map(const std::string& text, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(where + ": not a JSON object");
  const auto& f = j.value("factors", nlohmann::json());
  const auto& b = j.value("bias", nlohmann::json());
  if (!j.contains("latent_channels") || !j["latent_channels"].is_number_integer())
    return invalid_argument(where + ": latent_channels must be an integer");
  if (!j.contains("denormalized") || !j["denormalized"].is_boolean())
    return invalid_argument(where + ": denormalized must be true or false");
  LatentRgbMap m;
  m.latent_channels = j["latent_channels"].get<int64_t>();
  m.denormalized = j["denormalized"].get<bool>();
  if (m.latent_channels < 1 || !f.is_array() || static_cast<int64_t>(f.size()) != m.latent_channels)
    return invalid_argument(where + ": factors must have latent_channels rows");
  for (const auto& row : f) {
    if (!row.is_array() || row.size() != 3) return invalid_argument(where + ": every factors row must have 3 numbers");
    for (const auto& x : row) {
      if (!x.is_number()) return invalid_argument(where + ": factors must be numbers");
      m.factors.push_back(x.get<float>());
    }
  }
  if (!b.is_array() || b.size() != 3) return invalid_argument(where + ": bias must have 3 numbers");
  for (int k = 0; k < 3; ++k) {
    if (!b[k].is_number()) return invalid_argument(where + ": bias must be numbers");
    m.bias[k] = b[k].get<float>();
  }
  return m;
}

Result<LatentRgbMap> flux2_latent_rgb_map() {
  static const Result<LatentRgbMap> map = parse_latent_rgb_map(kFlux2LatentRgbJson, "data/flux2_latent_rgb.json");
  return map;
}

Result<Image> latent_preview(const Tensor& x, const Tensor& v, float sigma, int64_t th, int64_t tw,
                             const LatentRgbMap& map, const LatentStats& stats, int out_w, int out_h) {
  const int64_t C = map.latent_channels, P = 4 * C, N = th * tw;
  if (x.numel() != N * P || v.numel() != N * P)
    return invalid_argument("latent preview: latents do not have " + std::to_string(N) + " tokens of " +
                            std::to_string(P) + " channels (preview map for another model?)");
  if (map.denormalized && (static_cast<int64_t>(stats.mean.size()) != P || static_cast<int64_t>(stats.std.size()) != P))
    return invalid_argument("latent preview: batch-norm statistics have the wrong size");
  if (out_w < 1 || out_h < 1) return invalid_argument("latent preview: empty output size");
  // The 2th × 2tw RGB projection first (the work: N·4C·3 multiply-adds), then the upsampling,
  // which only copies bytes.
  const int64_t LH = 2 * th, LW = 2 * tw;
  std::vector<uint8_t> low(static_cast<size_t>(LH * LW * 3));
  std::vector<float> x0(static_cast<size_t>(P));
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.data() + n * P;
    const float* vr = v.data() + n * P;
    for (int64_t i = 0; i < P; ++i) {
      float z = xr[i] - sigma * vr[i];  // x0 = x − σ·v
      if (map.denormalized) z = z * stats.std[i] + stats.mean[i];
      x0[i] = z;
    }
    const int64_t y = n / tw, xx = n % tw;
    for (int64_t sub = 0; sub < 4; ++sub) {  // sub = py·2 + px
      float rgb[3] = {map.bias[0], map.bias[1], map.bias[2]};
      for (int64_t c = 0; c < C; ++c) {
        const float z = x0[c * 4 + sub];
        for (int k = 0; k < 3; ++k) rgb[k] += z * map.factors[c * 3 + k];
      }
      uint8_t* px = low.data() + ((2 * y + sub / 2) * LW + 2 * xx + sub % 2) * 3;
      for (int k = 0; k < 3; ++k) {
        const float t = std::clamp((rgb[k] + 1.0f) * 0.5f, 0.0f, 1.0f);  // [-1, 1] → [0, 1]
        px[k] = static_cast<uint8_t>(std::nearbyint(t * 255.0f));
      }
    }
  }
  Image img;
  img.width = out_w;
  img.height = out_h;
  img.rgb.resize(static_cast<size_t>(out_w) * out_h * 3);
  std::vector<int64_t> sx(static_cast<size_t>(out_w));
  for (int ox = 0; ox < out_w; ++ox) sx[ox] = static_cast<int64_t>(ox) * LW / out_w;
  for (int oy = 0; oy < out_h; ++oy) {
    const uint8_t* src = low.data() + (static_cast<int64_t>(oy) * LH / out_h) * LW * 3;
    uint8_t* dst = img.rgb.data() + static_cast<size_t>(oy) * out_w * 3;
    for (int ox = 0; ox < out_w; ++ox) std::copy_n(src + sx[ox] * 3, 3, dst + ox * 3);
  }
  return img;
}

}  // namespace klein
