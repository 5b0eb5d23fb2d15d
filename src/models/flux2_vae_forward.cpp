// AutoencoderKLFlux2 forward passes (decoder, encoder mean) in the Backend's named ops only,
// block by block; config and loading are in flux2_vae.cpp.
//
// GroupNorm (+ SiLU) is computed as a per-channel affine (Backend::group_norm_affine) and folded
// into the following conv's prologue, nearest ×2 upsampling into the Upsample2D conv, and each
// ResNet block's residual add into its second conv, so a block needs its input, one hidden
// tensor and (with a 1×1 shortcut) the output — no full-size normalised copies.
#include <cmath>

#include "backend/buffer_pool.h"
#include "backend/transfer.h"
#include "models/flux2_vae.h"

namespace klein {

namespace {

struct ChannelAffine {
  Tensor scale, shift;  // [C]
};

Result<ChannelAffine> gn_affine(Backend& be, const Tensor& x, const Flux2Vae::Norm& n, int64_t groups, double eps) {
  ChannelAffine a;
  KLEIN_ASSIGN_OR_RETURN(a.scale, be.alloc({x.dim(1)}, "GroupNorm statistics"));
  KLEIN_ASSIGN_OR_RETURN(a.shift, be.alloc({x.dim(1)}, "GroupNorm statistics"));
  KLEIN_RETURN_IF_ERROR(be.group_norm_affine(x, n.w, n.b, groups, eps, a.scale, a.shift));
  return a;
}

ConvOptions same3() { return ConvOptions::same(3); }

ConvOptions with_prologue(ConvOptions o, const ChannelAffine& a) {
  o.in_scale = a.scale;
  o.in_shift = a.shift;
  o.in_silu = true;
  return o;
}

// y = conv(x) into a fresh output tensor: from `pool` when given (a non-accumulating conv writes
// every value, so a recycled buffer's old contents never show), else from the backend.
Result<Tensor> conv(Backend& be, const Tensor& x, const Flux2Vae::Conv& c, const ConvOptions& o,
                    BufferPool* pool = nullptr) {
  const int64_t OH = conv_out_size(x.dim(2), c.w.shape[2], o.stride, o.pad_top, o.pad_bottom, o.upsample2x);
  const int64_t OW = conv_out_size(x.dim(3), c.w.shape[3], o.stride, o.pad_left, o.pad_right, o.upsample2x);
  const Shape shape = {x.dim(0), c.w.shape[0], OH, OW};
  const std::string what = "VAE activations (" + c.w.name + ")";
  KLEIN_ASSIGN_OR_RETURN(Tensor y, BufferPool::take_from(o.accumulate ? nullptr : pool, be, shape, what));
  KLEIN_RETURN_IF_ERROR(be.conv2d(x, c.w, &c.b, y, o));
  return y;
}

// The first `n` output channels of a conv (a prefix of the rows of its weight and bias).
Result<Flux2Vae::Conv> first_outputs(const Flux2Vae::Conv& c, int64_t n) {
  Flux2Vae::Conv r;
  KLEIN_ASSIGN_OR_RETURN(r.w, c.w.row_range(0, n));
  KLEIN_ASSIGN_OR_RETURN(r.b, c.b.row_range(0, n));
  return r;
}

// GroupNorm then SiLU folded into `c` (the conv_out of encoder and decoder). With `dump_name`
// wanted, the normalised tensor (before SiLU) is materialised for the dump.
Result<Tensor> norm_silu_conv(const Tensor& x, const Flux2Vae::Norm& n, const Flux2Vae::Conv& c, int64_t groups,
                              double eps, const RunContext& ctx, const std::string& dump_name) {
  Backend& be = ctx.be();
  KLEIN_ASSIGN_OR_RETURN(ChannelAffine a, gn_affine(be, x, n, groups, eps));
  if (ctx.wants_dump(dump_name)) {
    const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
    KLEIN_ASSIGN_OR_RETURN(Tensor g, be.alloc(x.shape(), "a dump"));
    KLEIN_RETURN_IF_ERROR(
        be.scale_shift(x.view().reshaped({C, HW}), g.view().reshaped({C, HW}), a.scale, a.shift, /*per_row=*/true));
    ctx.dump(dump_name, g);
  }
  return conv(be, x, c, with_prologue(same3(), a));
}

// Batch item `b` of x [B, C, H, W] as its own [1, C, H, W] tensor.
Result<Tensor> batch_item(Backend& be, const Tensor& x, int64_t b) {
  const int64_t n = x.numel() / x.dim(0);
  KLEIN_ASSIGN_OR_RETURN(Tensor t, be.alloc({1, x.dim(1), x.dim(2), x.dim(3)}, "a VAE batch item"));
  KLEIN_RETURN_IF_ERROR(be.copy(x.view().reshaped({x.dim(0), n}).row_range(b, b + 1), t.view().reshaped({1, n})));
  return t;
}

// Runs `one` on every batch item of x and stacks the results into [B, ...].
template <class F>
Result<Tensor> per_item(Backend& be, const Tensor& x, F&& one) {
  const int64_t B = x.dim(0);
  Tensor out;
  for (int64_t b = 0; b < B; ++b) {
    KLEIN_ASSIGN_OR_RETURN(Tensor item, batch_item(be, x, b));
    KLEIN_ASSIGN_OR_RETURN(Tensor y, one(std::move(item)));
    if (B == 1) return y;
    if (b == 0) {
      Shape s = y.shape();
      s[0] = B;
      KLEIN_ASSIGN_OR_RETURN(out, be.alloc(s, "the VAE batch output"));
    }
    const int64_t n = y.numel();
    KLEIN_RETURN_IF_ERROR(be.copy(y.view().reshaped({1, n}), out.view().reshaped({B, n}).row_range(b, b + 1)));
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Blocks
// ------------------------------------------------------------------------------------------
Result<Tensor> Flux2Vae::resnet(const Resnet& r, Tensor x, const RunContext& ctx, BufferPool* pool) const {
  Backend& be = ctx.be();
  const int64_t G = cfg_.norm_num_groups;
  const double eps = cfg_.norm_eps;
  KLEIN_ASSIGN_OR_RETURN(ChannelAffine a1, gn_affine(be, x, r.norm1, G, eps));
  KLEIN_ASSIGN_OR_RETURN(Tensor t, conv(be, x, r.conv1, with_prologue(same3(), a1), pool));
  KLEIN_ASSIGN_OR_RETURN(ChannelAffine a2, gn_affine(be, t, r.norm2, G, eps));
  Tensor out;
  if (!r.shortcut.w.empty()) {
    KLEIN_ASSIGN_OR_RETURN(out, conv(be, x, r.shortcut, ConvOptions{}, pool));
    x = Tensor();  // free the input before conv2
  } else {
    out = std::move(x);
  }
  ConvOptions p2 = with_prologue(same3(), a2);
  p2.accumulate = true;  // the residual add
  KLEIN_RETURN_IF_ERROR(be.conv2d(t, r.conv2.w, &r.conv2.b, out, p2));
  return out;
}

// Attention with one head of dim C, residual_connection, AttnProcessor2_0; tokens [HW, C].
Status Flux2Vae::attention(const Attn& at, Tensor& x, const RunContext& ctx) const {
  Backend& be = ctx.be();
  const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
  KLEIN_ASSIGN_OR_RETURN(ChannelAffine a, gn_affine(be, x, at.norm, cfg_.norm_num_groups, cfg_.norm_eps));
  KLEIN_ASSIGN_OR_RETURN(Tensor t, be.alloc({HW, C}, "VAE attention tokens"));
  KLEIN_RETURN_IF_ERROR(be.transpose(x.view().reshaped({C, HW}), t));
  KLEIN_RETURN_IF_ERROR(be.scale_shift(t, t, a.scale, a.shift, /*per_row=*/false));
  KLEIN_ASSIGN_OR_RETURN(Tensor q, be.alloc({HW, C}, "VAE attention"));
  KLEIN_ASSIGN_OR_RETURN(Tensor k, be.alloc({HW, C}, "VAE attention"));
  KLEIN_ASSIGN_OR_RETURN(Tensor v, be.alloc({HW, C}, "VAE attention"));
  KLEIN_RETURN_IF_ERROR(be.linear(t, at.q, &at.qb, q));
  KLEIN_RETURN_IF_ERROR(be.linear(t, at.k, &at.kb, k));
  KLEIN_RETURN_IF_ERROR(be.linear(t, at.v, &at.vb, v));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(C)));
  KLEIN_RETURN_IF_ERROR(be.attention(q, k, v, t, 1, 1, scale, AttnMask{}));
  k = Tensor();
  v = Tensor();
  KLEIN_RETURN_IF_ERROR(be.linear(t, at.o, &at.ob, q));
  return be.transpose(q, x.view().reshaped({C, HW}), /*accumulate=*/true);
}

Result<Tensor> Flux2Vae::mid_block(const Mid& m, Tensor x, const RunContext& ctx, BufferPool* pool) const {
  KLEIN_ASSIGN_OR_RETURN(x, resnet(m.r0, std::move(x), ctx, pool));
  if (m.has_attn) KLEIN_RETURN_IF_ERROR(attention(m.attn, x, ctx));
  return resnet(m.r1, std::move(x), ctx, pool);
}

Result<Tensor> Flux2Vae::up_block(const Block& b, Tensor x, const RunContext& ctx, BufferPool* pool) const {
  for (const Resnet& r : b.resnets) {
    KLEIN_ASSIGN_OR_RETURN(x, resnet(r, std::move(x), ctx, pool));
  }
  if (!b.has_sampler) return x;
  ConvOptions p = same3();  // Upsample2D: nearest ×2, then 3×3 conv (fused)
  p.upsample2x = true;
  return conv(ctx.be(), x, b.sampler, p, pool);
}

Result<Tensor> Flux2Vae::down_block(const Block& b, Tensor x, const RunContext& ctx, BufferPool* pool) const {
  for (const Resnet& r : b.resnets) {
    KLEIN_ASSIGN_OR_RETURN(x, resnet(r, std::move(x), ctx, pool));
  }
  if (!b.has_sampler) return x;
  ConvOptions p;  // Downsample2D(padding=0): zero-pad right 1, bottom 1; 3×3 stride 2
  p.stride = 2;
  p.pad_bottom = p.pad_right = 1;
  return conv(ctx.be(), x, b.sampler, p, pool);
}

// ------------------------------------------------------------------------------------------
// Decoder
// ------------------------------------------------------------------------------------------
Result<Tensor> Flux2Vae::decode(const Tensor& z, const RunContext& ctx, const VaeTiling& tiling) const {
  const auto& c = cfg_;
  if (z.ndim() != 4 || z.dim(1) != c.latent_channels || z.dim(0) < 1 || z.dim(2) < 1 || z.dim(3) < 1)
    return invalid_argument("vae decode: expected a latent [B, " + std::to_string(c.latent_channels) +
                            ", h, w], got " + shape_str(z.shape()));
  if (!ctx.backend) return invalid_argument("vae decode: RunContext without a backend");
  Tensor z_up;
  KLEIN_ASSIGN_OR_RETURN(const Tensor* zd, on_device(ctx.be(), z, z_up, "the latent"));
  KLEIN_ASSIGN_OR_RETURN(bool finite, ctx.be().all_finite(*zd));
  if (!finite) return invalid_argument("vae decode: the latent has NaN or Inf values");
  const int64_t f = c.scale_factor(), tile = tile_size(f * z.dim(2), f * z.dim(3), tiling, true);
  // One pool for every batch item: each page of the intermediate activations faults in once.
  BufferPool pool(ctx.be());
  return per_item(ctx.be(), *zd, [&](Tensor x) { return decode_one(std::move(x), ctx, tile, tiling, pool); });
}

Result<Tensor> Flux2Vae::decode_one(Tensor x, const RunContext& ctx, int64_t tile, const VaeTiling& tiling,
                                    BufferPool& pool) const {
  const auto& c = cfg_;
  Backend& be = ctx.be();
  const int total = static_cast<int>(dec_blocks_.size()) + 2;
  int done = 0;
  ctx.report("decode", done, total);
  if (c.use_post_quant_conv) {
    KLEIN_ASSIGN_OR_RETURN(x, conv(be, x, post_quant_conv_, ConvOptions{}, &pool));
    ctx.dump("vae.post_quant_conv", x);
  }
  KLEIN_ASSIGN_OR_RETURN(x, conv(be, x, dec_conv_in_, same3(), &pool));
  ctx.dump("vae.conv_in", x);
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE decoding"));
  KLEIN_ASSIGN_OR_RETURN(x, mid_block(dec_mid_, std::move(x), ctx, &pool));
  ctx.dump("vae.mid", x);
  if (tile > 0) {
    KLEIN_ASSIGN_OR_RETURN(Tensor img, decode_tiled(std::move(x), tile, tiling, ctx));
    ctx.dump("vae.conv_out", img);
    return img;
  }
  ctx.report("decode", ++done, total);
  for (size_t i = 0; i < dec_blocks_.size(); ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE decoding"));
    KLEIN_ASSIGN_OR_RETURN(x, up_block(dec_blocks_[i], std::move(x), ctx, &pool));
    ctx.dump("vae.up" + std::to_string(i), x);
    ctx.report("decode", ++done, total);
  }
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE decoding"));
  KLEIN_ASSIGN_OR_RETURN(Tensor img, norm_silu_conv(x, dec_norm_out_, dec_conv_out_, c.norm_num_groups, c.norm_eps,
                                                    ctx, "vae.conv_norm_out"));
  x = Tensor();
  ctx.dump("vae.conv_out", img);
  ctx.report("decode", ++done, total);
  return img;
}

// ------------------------------------------------------------------------------------------
// Encoder (posterior mean)
// ------------------------------------------------------------------------------------------
Result<Tensor> Flux2Vae::encode_mean(const Tensor& image, const RunContext& ctx, const VaeTiling& tiling) const {
  const auto& c = cfg_;
  const int64_t f = c.scale_factor();
  if (image.ndim() != 4 || image.dim(1) != c.in_channels || image.dim(0) < 1)
    return invalid_argument("vae encode: expected an image [B, " + std::to_string(c.in_channels) +
                            ", H, W], got " + shape_str(image.shape()));
  if (image.dim(2) < f || image.dim(3) < f || image.dim(2) % f != 0 || image.dim(3) % f != 0)
    return invalid_argument("vae encode: image height and width must be positive multiples of " +
                            std::to_string(f) + ", got " + shape_str(image.shape()));
  if (!ctx.backend) return invalid_argument("vae encode: RunContext without a backend");
  Tensor image_up;
  KLEIN_ASSIGN_OR_RETURN(const Tensor* xd, on_device(ctx.be(), image, image_up, "the image"));
  KLEIN_ASSIGN_OR_RETURN(bool finite, ctx.be().all_finite(*xd));
  if (!finite) return invalid_argument("vae encode: the image has NaN or Inf values");
  const int64_t tile = tile_size(image.dim(2), image.dim(3), tiling, false);
  BufferPool pool(ctx.be());  // as decode's
  return per_item(ctx.be(), *xd, [&](Tensor x) { return encode_one(std::move(x), ctx, tile, tiling, pool); });
}

Result<Tensor> Flux2Vae::encode_one(Tensor x, const RunContext& ctx, int64_t tile, const VaeTiling& tiling,
                                    BufferPool& pool) const {
  const auto& c = cfg_;
  Backend& be = ctx.be();
  const int64_t G = c.norm_num_groups, lat = c.latent_channels;
  const double eps = c.norm_eps;
  const int total = static_cast<int>(enc_blocks_.size()) + 2;
  int done = 0;
  ctx.report("vae_encode", done, total);
  if (tile > 0) {
    KLEIN_ASSIGN_OR_RETURN(x, encode_tiled(std::move(x), tile, tiling, ctx));
    done = total - 2;
  } else {
    KLEIN_ASSIGN_OR_RETURN(x, conv(be, x, enc_conv_in_, same3(), &pool));
    ctx.dump("vae_enc.conv_in", x);
    for (size_t i = 0; i < enc_blocks_.size(); ++i) {
      KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE encoding"));
      KLEIN_ASSIGN_OR_RETURN(x, down_block(enc_blocks_[i], std::move(x), ctx, &pool));
      ctx.dump("vae_enc.down" + std::to_string(i), x);
      ctx.report("vae_encode", ++done, total);
    }
  }
  KLEIN_RETURN_IF_ERROR(ctx.check_cancel("VAE encoding"));
  KLEIN_ASSIGN_OR_RETURN(x, mid_block(enc_mid_, std::move(x), ctx, &pool));
  ctx.dump("vae_enc.mid", x);
  ctx.report("vae_encode", ++done, total);
  Tensor mean;
  if (c.use_quant_conv) {
    KLEIN_ASSIGN_OR_RETURN(Tensor h,
                           norm_silu_conv(x, enc_norm_out_, enc_conv_out_, G, eps, ctx, "vae_enc.conv_norm_out"));
    x = Tensor();
    ctx.dump("vae_enc.conv_out", h);
    // Only the mean half of quant_conv's output is needed (logvar = channels [lat, 2·lat)).
    KLEIN_ASSIGN_OR_RETURN(Flux2Vae::Conv qc, first_outputs(quant_conv_, lat));
    KLEIN_ASSIGN_OR_RETURN(mean, conv(be, h, qc, ConvOptions{}));
  } else {
    KLEIN_ASSIGN_OR_RETURN(Flux2Vae::Conv co, first_outputs(enc_conv_out_, lat));
    KLEIN_ASSIGN_OR_RETURN(mean, norm_silu_conv(x, enc_norm_out_, co, G, eps, ctx, "vae_enc.conv_norm_out"));
  }
  ctx.dump("vae_enc.mean", mean);
  ctx.report("vae_encode", ++done, total);
  return mean;
}

}  // namespace klein
