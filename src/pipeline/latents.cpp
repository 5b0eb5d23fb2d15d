#include "pipeline/latents.h"

#include <string>

#include "core/dtype.h"

namespace klein {

Result<Tensor> patchify(const Tensor& z) {
  if (z.ndim() != 4)
    return invalid_argument("patchify: expected a [B, C, H, W] latent, got " + shape_str(z.shape()));
  const int64_t B = z.dim(0), C = z.dim(1), H = z.dim(2), W = z.dim(3);
  if (H % 2 != 0 || W % 2 != 0)
    return invalid_argument("patchify: latent height and width must be even, got " + shape_str(z.shape()));
  const int64_t h = H / 2, w = W / 2;
  Tensor out({B, C * 4, h, w});
  const float* src = z.data();
  float* dst = out.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t py = 0; py < 2; ++py)
        for (int64_t px = 0; px < 2; ++px) {
          const int64_t k = c * 4 + py * 2 + px;
          float* o = dst + ((b * C * 4 + k) * h) * w;
          for (int64_t y = 0; y < h; ++y) {
            const float* row = src + ((b * C + c) * H + 2 * y + py) * W + px;
            for (int64_t x = 0; x < w; ++x) o[y * w + x] = row[2 * x];
          }
        }
  return out;
}

Result<Tensor> unpatchify(const Tensor& z) {
  if (z.ndim() != 4)
    return invalid_argument("unpatchify: expected a [B, 4C, h, w] latent, got " + shape_str(z.shape()));
  const int64_t B = z.dim(0), C4 = z.dim(1), h = z.dim(2), w = z.dim(3);
  if (C4 % 4 != 0)
    return invalid_argument("unpatchify: channel count must be a multiple of 4, got " + shape_str(z.shape()));
  const int64_t C = C4 / 4, H = 2 * h, W = 2 * w;
  Tensor out({B, C, H, W});
  const float* src = z.data();
  float* dst = out.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t py = 0; py < 2; ++py)
        for (int64_t px = 0; px < 2; ++px) {
          const int64_t k = c * 4 + py * 2 + px;
          const float* in = src + ((b * C4 + k) * h) * w;
          for (int64_t y = 0; y < h; ++y) {
            float* row = dst + ((b * C + c) * H + 2 * y + py) * W + px;
            for (int64_t x = 0; x < w; ++x) row[2 * x] = in[y * w + x];
          }
        }
  return out;
}

namespace {

Status check_stats(const Tensor& z, const LatentStats& s, const char* what) {
  if (z.ndim() != 4 || s.mean.size() != s.std.size() ||
      static_cast<int64_t>(s.mean.size()) != z.dim(1))
    return invalid_argument(std::string(what) + ": latent " + shape_str(z.shape()) + " does not match " +
                            std::to_string(s.mean.size()) + " batch-norm channels");
  return Status::Ok();
}

}  // namespace

Status normalize_latents(Tensor& z, const LatentStats& s, LatentArith arith) {
  KLEIN_RETURN_IF_ERROR(check_stats(z, s, "normalize_latents"));
  const int64_t B = z.dim(0), C = z.dim(1), HW = z.dim(2) * z.dim(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      float* p = z.data() + (b * C + c) * HW;
      const float m = s.mean[c], sd = s.std[c];
      if (arith == LatentArith::kF32) {
        for (int64_t i = 0; i < HW; ++i) p[i] = (p[i] - m) / sd;
      } else {
        const float mb = round_bf16(m), sb = round_bf16(sd);
        for (int64_t i = 0; i < HW; ++i) p[i] = round_bf16(round_bf16(round_bf16(p[i]) - mb) / sb);
      }
    }
  return Status::Ok();
}

Status denormalize_latents(Tensor& z, const LatentStats& s, LatentArith arith) {
  KLEIN_RETURN_IF_ERROR(check_stats(z, s, "denormalize_latents"));
  const int64_t B = z.dim(0), C = z.dim(1), HW = z.dim(2) * z.dim(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      float* p = z.data() + (b * C + c) * HW;
      const float m = s.mean[c], sd = s.std[c];
      if (arith == LatentArith::kF32) {
        for (int64_t i = 0; i < HW; ++i) p[i] = p[i] * sd + m;
      } else {
        const float mb = round_bf16(m), sb = round_bf16(sd);
        for (int64_t i = 0; i < HW; ++i) p[i] = round_bf16(round_bf16(round_bf16(p[i]) * sb) + mb);
      }
    }
  return Status::Ok();
}

Tensor pack_latents(const Tensor& z) {
  const int64_t C = z.dim(1), n = z.dim(2) * z.dim(3);
  Tensor t({n, C});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < n; ++i) t.data()[i * C + c] = z.data()[c * n + i];
  return t;
}

Tensor unpack_latents(const Tensor& t, int64_t h, int64_t w) {
  const int64_t C = t.dim(1), n = h * w;
  Tensor z({1, C, h, w});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < n; ++i) z.data()[c * n + i] = t.data()[i * C + c];
  return z;
}

}  // namespace klein
