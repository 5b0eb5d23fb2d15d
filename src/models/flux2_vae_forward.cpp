// AutoencoderKLFlux2 forward passes (decoder, encoder mean); config and loading are in
// flux2_vae.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/conv2d.h"
#include "kernels/kernels.h"
#include "models/flux2_vae.h"

namespace klein {

// ------------------------------------------------------------------------------------------
// Forward building blocks
// ------------------------------------------------------------------------------------------
namespace {

// Per-channel affine equivalent of GroupNorm(x) on [C, HW]:  gn(x)[c] = scale[c]·x + shift[c]
// with scale = gamma·rstd_g, shift = beta − mean_g·scale (as torch's CPU kernel applies it).
// Statistics per group in double, two passes (mean, then centred variance; biased, as torch).
struct ChannelAffine {
  std::vector<float> scale, shift;
};

ChannelAffine group_norm_affine(const Tensor& x, const Flux2Vae::Norm& n, int64_t groups, double eps,
                                ThreadPool& pool) {
  const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3), cpg = C / groups;
  const std::vector<float> gamma = weight_to_vector(n.w), beta = weight_to_vector(n.b);
  ChannelAffine a{std::vector<float>(C), std::vector<float>(C)};
  pool.parallel_for(groups, [&](int64_t gb, int64_t ge) {
    for (int64_t g = gb; g < ge; ++g) {
      const float* p = x.data() + g * cpg * HW;
      const int64_t n_el = cpg * HW;
      double sum = 0;
      for (int64_t i = 0; i < n_el; ++i) sum += p[i];
      const double mean = sum / static_cast<double>(n_el);
      double ss = 0;
      for (int64_t i = 0; i < n_el; ++i) {
        const double d = p[i] - mean;
        ss += d * d;
      }
      const double var = ss / static_cast<double>(n_el);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float meanf = static_cast<float>(mean);
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
        a.scale[c] = gamma[c] * rstd;
        a.shift[c] = beta[c] - meanf * a.scale[c];
      }
    }
  });
  return a;
}

kernels::Conv2dParams same3() { return kernels::Conv2dParams::same(3); }

// y = conv(x) with a fresh output tensor.
Tensor conv(const Tensor& x, const Flux2Vae::Conv& c, const kernels::Conv2dParams& p, ThreadPool& pool) {
  const int64_t kh = c.w.shape[2], kw = c.w.shape[3];
  const int64_t OH = kernels::conv2d_out_size(x.dim(2), kh, p.stride, p.pad_top, p.pad_bottom, p.upsample2x);
  const int64_t OW = kernels::conv2d_out_size(x.dim(3), kw, p.stride, p.pad_left, p.pad_right, p.upsample2x);
  Tensor y({x.dim(0), c.w.shape[0], OH, OW});
  kernels::conv2d(x.data(), x.dim(0), x.dim(1), x.dim(2), x.dim(3), c.w, &c.b, y.data(), p, pool);
  return y;
}

// The first `n` output channels of a conv (rows are the outer weight dimension, so a prefix of
// the storage).
Flux2Vae::Conv first_outputs(const Flux2Vae::Conv& c, int64_t n) {
  Flux2Vae::Conv r = c;
  r.w.shape[0] = n;
  r.b.shape[0] = n;
  return r;
}

// ResnetBlock2D (temb None, output_scale_factor 1):
//   out = shortcut(x) + conv2(silu(gn2(conv1(silu(gn1(x))))))
// GN + SiLU are conv prologues; the residual is the accumulation target of conv2.
Tensor resnet(const Flux2Vae::Resnet& r, Tensor x, int64_t groups, double eps, ThreadPool& pool) {
  const ChannelAffine a1 = group_norm_affine(x, r.norm1, groups, eps, pool);
  kernels::Conv2dParams p1 = same3();
  p1.in_scale = a1.scale.data(), p1.in_shift = a1.shift.data(), p1.in_silu = true;
  Tensor t = conv(x, r.conv1, p1, pool);
  const ChannelAffine a2 = group_norm_affine(t, r.norm2, groups, eps, pool);
  Tensor out;
  if (!r.shortcut.w.empty()) {
    out = conv(x, r.shortcut, kernels::Conv2dParams{}, pool);
    x = Tensor();  // free the input before conv2
  } else {
    out = std::move(x);
  }
  kernels::Conv2dParams p2 = same3();
  p2.in_scale = a2.scale.data(), p2.in_shift = a2.shift.data(), p2.in_silu = true;
  p2.accumulate = true;
  kernels::conv2d(t.data(), t.dim(0), t.dim(1), t.dim(2), t.dim(3), r.conv2.w, &r.conv2.b, out.data(), p2,
                  pool);
  return out;
}

// Mid-block attention (Attention with one head of dim C, residual_connection, AttnProcessor2_0):
//   x += to_out(sdpa(to_q(t), to_k(t), to_v(t)))  with t = GN(x) as tokens [HW, C].
void attention_block(const Flux2Vae::Attn& at, Tensor& x, int64_t groups, double eps, ThreadPool& pool) {
  const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
  const ChannelAffine a = group_norm_affine(x, at.norm, groups, eps, pool);
  Tensor t({HW, C});
  constexpr int64_t kT = 32;  // transpose tile
  pool.parallel_for((HW + kT - 1) / kT, [&](int64_t b, int64_t e) {
    for (int64_t pb = b * kT; pb < std::min(HW, e * kT); pb += kT)
      for (int64_t c0 = 0; c0 < C; c0 += kT)
        for (int64_t p = pb; p < std::min(HW, pb + kT); ++p)
          for (int64_t c = c0; c < std::min(C, c0 + kT); ++c)
            t.data()[p * C + c] = x.data()[c * HW + p] * a.scale[c] + a.shift[c];
  });
  Tensor q({HW, C}), k({HW, C}), v({HW, C});
  kernels::linear(t.data(), HW, C, at.q, &at.qb, q.data(), pool);
  kernels::linear(t.data(), HW, C, at.k, &at.kb, k.data(), pool);
  kernels::linear(t.data(), HW, C, at.v, &at.vb, v.data(), pool);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(C)));
  kernels::attention(q.data(), k.data(), v.data(), t.data(), HW, HW, 1, 1, static_cast<int>(C), scale,
                     kernels::AttnMask{}, pool);
  k = Tensor();
  v = Tensor();
  kernels::linear(t.data(), HW, C, at.o, &at.ob, q.data(), pool);
  pool.parallel_for((C + kT - 1) / kT, [&](int64_t b, int64_t e) {
    for (int64_t cb = b * kT; cb < std::min(C, e * kT); cb += kT)
      for (int64_t p0 = 0; p0 < HW; p0 += kT)
        for (int64_t c = cb; c < std::min(C, cb + kT); ++c)
          for (int64_t p = p0; p < std::min(HW, p0 + kT); ++p) x.data()[c * HW + p] += q.data()[p * C + c];
  });
}

Tensor mid_block(const Flux2Vae::Mid& m, Tensor x, int64_t groups, double eps, ThreadPool& pool) {
  x = resnet(m.r0, std::move(x), groups, eps, pool);
  if (m.has_attn) attention_block(m.attn, x, groups, eps, pool);
  return resnet(m.r1, std::move(x), groups, eps, pool);
}

// GroupNorm then SiLU folded into `c` (the conv_out of encoder and decoder). With `dump_name`
// wanted, the normalised tensor (before SiLU) is materialised for the dump.
Tensor norm_silu_conv(const Tensor& x, const Flux2Vae::Norm& n, const Flux2Vae::Conv& c, int64_t groups,
                      double eps, const RunContext& ctx, const std::string& dump_name) {
  const ChannelAffine a = group_norm_affine(x, n, groups, eps, *ctx.pool);
  if (ctx.wants_dump(dump_name)) {
    Tensor g(x.shape());
    const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t i = 0; i < HW; ++i)
        g.data()[ch * HW + i] = x.data()[ch * HW + i] * a.scale[ch] + a.shift[ch];
    ctx.dump(dump_name, g);
  }
  kernels::Conv2dParams p = same3();
  p.in_scale = a.scale.data(), p.in_shift = a.shift.data(), p.in_silu = true;
  return conv(x, c, p, *ctx.pool);
}

// Batch item `b` of x as its own [1, C, H, W] tensor.
Tensor batch_item(const Tensor& x, int64_t b) {
  Tensor t({1, x.dim(1), x.dim(2), x.dim(3)});
  std::memcpy(t.data(), x.data() + b * t.numel(), t.numel() * sizeof(float));
  return t;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Decoder
// ------------------------------------------------------------------------------------------
Result<Tensor> Flux2Vae::decode(const Tensor& z, const RunContext& ctx) const {
  const auto& c = cfg_;
  if (z.ndim() != 4 || z.dim(1) != c.latent_channels || z.dim(0) < 1 || z.dim(2) < 1 || z.dim(3) < 1)
    return invalid_argument("vae decode: expected a latent [B, " + std::to_string(c.latent_channels) +
                            ", h, w], got " + shape_str(z.shape()));
  if (!ctx.pool) return invalid_argument("vae decode: RunContext without a thread pool");
  if (!all_finite(z.data(), z.numel())) return invalid_argument("vae decode: the latent has NaN or Inf values");
  const int64_t B = z.dim(0), f = c.scale_factor();
  if (B == 1) {
    Tensor x({1, z.dim(1), z.dim(2), z.dim(3)});
    std::memcpy(x.data(), z.data(), z.numel() * sizeof(float));
    return decode_one(std::move(x), ctx);
  }
  Tensor out({B, c.out_channels, z.dim(2) * f, z.dim(3) * f});
  for (int64_t b = 0; b < B; ++b) {
    KLEIN_ASSIGN_OR_RETURN(Tensor img, decode_one(batch_item(z, b), ctx));
    std::memcpy(out.data() + b * img.numel(), img.data(), img.numel() * sizeof(float));
  }
  return out;
}

Result<Tensor> Flux2Vae::decode_one(Tensor x, const RunContext& ctx) const {
  const auto& c = cfg_;
  ThreadPool& pool = *ctx.pool;
  const int64_t G = c.norm_num_groups;
  const double eps = c.norm_eps;
  const int total = static_cast<int>(dec_blocks_.size()) + 2;
  int done = 0;
  ctx.report("decode", done, total);
  if (c.use_post_quant_conv) {
    x = conv(x, post_quant_conv_, kernels::Conv2dParams{}, pool);
    ctx.dump("vae.post_quant_conv", x);
  }
  x = conv(x, dec_conv_in_, same3(), pool);
  ctx.dump("vae.conv_in", x);
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE decoding"));
  x = mid_block(dec_mid_, std::move(x), G, eps, pool);
  ctx.dump("vae.mid", x);
  ctx.report("decode", ++done, total);
  for (size_t i = 0; i < dec_blocks_.size(); ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE decoding"));
    const Block& b = dec_blocks_[i];
    for (const Resnet& r : b.resnets) x = resnet(r, std::move(x), G, eps, pool);
    if (b.has_sampler) {  // Upsample2D: nearest ×2, then 3×3 conv (fused)
      kernels::Conv2dParams p = same3();
      p.upsample2x = true;
      x = conv(x, b.sampler, p, pool);
    }
    ctx.dump("vae.up" + std::to_string(i), x);
    ctx.report("decode", ++done, total);
  }
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE decoding"));
  Tensor img = norm_silu_conv(x, dec_norm_out_, dec_conv_out_, G, eps, ctx, "vae.conv_norm_out");
  x = Tensor();
  ctx.dump("vae.conv_out", img);
  ctx.report("decode", ++done, total);
  return img;
}

// ------------------------------------------------------------------------------------------
// Encoder (posterior mean)
// ------------------------------------------------------------------------------------------
Result<Tensor> Flux2Vae::encode_mean(const Tensor& image, const RunContext& ctx) const {
  const auto& c = cfg_;
  const int64_t f = c.scale_factor();
  if (image.ndim() != 4 || image.dim(1) != c.in_channels || image.dim(0) < 1)
    return invalid_argument("vae encode: expected an image [B, " + std::to_string(c.in_channels) +
                            ", H, W], got " + shape_str(image.shape()));
  if (image.dim(2) < f || image.dim(3) < f || image.dim(2) % f != 0 || image.dim(3) % f != 0)
    return invalid_argument("vae encode: image height and width must be positive multiples of " +
                            std::to_string(f) + ", got " + shape_str(image.shape()));
  if (!ctx.pool) return invalid_argument("vae encode: RunContext without a thread pool");
  if (!all_finite(image.data(), image.numel()))
    return invalid_argument("vae encode: the image has NaN or Inf values");
  const int64_t B = image.dim(0);
  if (B == 1) {
    Tensor x({1, image.dim(1), image.dim(2), image.dim(3)});
    std::memcpy(x.data(), image.data(), image.numel() * sizeof(float));
    return encode_one(std::move(x), ctx);
  }
  Tensor out({B, c.latent_channels, image.dim(2) / f, image.dim(3) / f});
  for (int64_t b = 0; b < B; ++b) {
    KLEIN_ASSIGN_OR_RETURN(Tensor m, encode_one(batch_item(image, b), ctx));
    std::memcpy(out.data() + b * m.numel(), m.data(), m.numel() * sizeof(float));
  }
  return out;
}

Result<Tensor> Flux2Vae::encode_one(Tensor x, const RunContext& ctx) const {
  const auto& c = cfg_;
  ThreadPool& pool = *ctx.pool;
  const int64_t G = c.norm_num_groups, lat = c.latent_channels;
  const double eps = c.norm_eps;
  const int total = static_cast<int>(enc_blocks_.size()) + 2;
  int done = 0;
  ctx.report("vae_encode", done, total);
  x = conv(x, enc_conv_in_, same3(), pool);
  ctx.dump("vae_enc.conv_in", x);
  for (size_t i = 0; i < enc_blocks_.size(); ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE encoding"));
    const Block& b = enc_blocks_[i];
    for (const Resnet& r : b.resnets) x = resnet(r, std::move(x), G, eps, pool);
    if (b.has_sampler) {  // Downsample2D(padding=0): zero-pad right 1, bottom 1; 3×3 stride 2
      kernels::Conv2dParams p;
      p.stride = 2;
      p.pad_bottom = p.pad_right = 1;
      x = conv(x, b.sampler, p, pool);
    }
    ctx.dump("vae_enc.down" + std::to_string(i), x);
    ctx.report("vae_encode", ++done, total);
  }
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE encoding"));
  x = mid_block(enc_mid_, std::move(x), G, eps, pool);
  ctx.dump("vae_enc.mid", x);
  ctx.report("vae_encode", ++done, total);
  Tensor mean;
  if (c.use_quant_conv) {
    Tensor h = norm_silu_conv(x, enc_norm_out_, enc_conv_out_, G, eps, ctx, "vae_enc.conv_norm_out");
    x = Tensor();
    ctx.dump("vae_enc.conv_out", h);
    // Only the mean half of quant_conv's output is needed (logvar = channels [lat, 2·lat)).
    mean = conv(h, first_outputs(quant_conv_, lat), kernels::Conv2dParams{}, pool);
  } else {
    mean = norm_silu_conv(x, enc_norm_out_, first_outputs(enc_conv_out_, lat), G, eps, ctx,
                          "vae_enc.conv_norm_out");
  }
  ctx.dump("vae_enc.mean", mean);
  ctx.report("vae_encode", ++done, total);
  return mean;
}

}  // namespace klein
