// AutoencoderKLFlux2 (diffusers models/autoencoders/autoencoder_kl_flux2.py, vae.py Encoder /
// Decoder, unet_2d_blocks.py UNetMidBlock2D / DownEncoderBlock2D / UpDecoderBlock2D,
// resnet.py ResnetBlock2D, downsampling.py Downsample2D, upsampling.py Upsample2D,
// attention_processor.py AttnProcessor2_0): config, loading, and the float32 forward passes.
#include "core/format.h"
#include "models/flux2_vae.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/json_file.h"
#include "kernels/conv2d.h"
#include "kernels/kernels.h"

namespace fs = std::filesystem;

namespace klein {

// ------------------------------------------------------------------------------------------
// Config
// ------------------------------------------------------------------------------------------
namespace {

Result<std::vector<int64_t>> json_int_list(const nlohmann::json& j, const std::string& key,
                                           const std::string& where) {
  if (!j.contains(key) || !j[key].is_array() || j[key].empty())
    return format_error(where + ": \"" + key + "\" must be a non-empty list of integers");
  std::vector<int64_t> v;
  for (const auto& e : j[key]) {
    if (!e.is_number_integer() || e.get<int64_t>() <= 0)
      return format_error(where + ": \"" + key + "\" has a non-positive or non-integer entry");
    v.push_back(e.get<int64_t>());
  }
  return v;
}

Status check_block_types(const nlohmann::json& j, const std::string& key, const std::string& type,
                         size_t n, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();  // class default: n of `type`
  if (!j[key].is_array() || j[key].size() != n)
    return format_error(where + ": \"" + key + "\" must list " + std::to_string(n) +
                        " blocks (one per block_out_channels entry)");
  for (const auto& e : j[key])
    if (!e.is_string() || e.get<std::string>() != type)
      return unsupported(where + ": \"" + key + "\" entry " + e.dump() + " (only " + type + ")");
  return Status::Ok();
}

}  // namespace

Result<Flux2VaeConfig> Flux2VaeConfig::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return format_error(where + ": not a JSON object");
  Flux2VaeConfig c;
  KLEIN_ASSIGN_OR_RETURN(c.in_channels, json_int(j, "in_channels", where, 3));
  KLEIN_ASSIGN_OR_RETURN(c.out_channels, json_int(j, "out_channels", where, 3));
  KLEIN_ASSIGN_OR_RETURN(c.latent_channels, json_int(j, "latent_channels", where, 32));
  KLEIN_ASSIGN_OR_RETURN(c.block_out_channels, json_int_list(j, "block_out_channels", where));
  if (j.contains("decoder_block_out_channels") && !j["decoder_block_out_channels"].is_null()) {
    KLEIN_ASSIGN_OR_RETURN(c.decoder_block_out_channels,
                           json_int_list(j, "decoder_block_out_channels", where));
  } else {
    c.decoder_block_out_channels = c.block_out_channels;
  }
  KLEIN_ASSIGN_OR_RETURN(c.layers_per_block, json_int(j, "layers_per_block", where, 2));
  KLEIN_ASSIGN_OR_RETURN(c.norm_num_groups, json_int(j, "norm_num_groups", where, 32));
  KLEIN_ASSIGN_OR_RETURN(c.mid_block_add_attention, json_bool(j, "mid_block_add_attention", where, true));
  KLEIN_ASSIGN_OR_RETURN(c.use_quant_conv, json_bool(j, "use_quant_conv", where, true));
  KLEIN_ASSIGN_OR_RETURN(c.use_post_quant_conv, json_bool(j, "use_post_quant_conv", where, true));
  KLEIN_ASSIGN_OR_RETURN(c.batch_norm_eps, json_number(j, "batch_norm_eps", where, 1e-4));
  KLEIN_ASSIGN_OR_RETURN(auto act, json_string(j, "act_fn", where, std::string("silu")));
  if (act != "silu") return unsupported(where + ": act_fn \"" + act + "\" (only silu)");
  if (j.contains("patch_size") && !j["patch_size"].is_null()) {
    const auto& ps = j["patch_size"];
    if (!ps.is_array() || ps.size() != 2 || !ps[0].is_number_integer() || !ps[1].is_number_integer() ||
        ps[0].get<int64_t>() != 2 || ps[1].get<int64_t>() != 2)
      return unsupported(where + ": patch_size " + ps.dump() + " (only [2, 2])");
  }
  KLEIN_RETURN_IF_ERROR(check_block_types(j, "down_block_types", "DownEncoderBlock2D",
                                          c.block_out_channels.size(), where));
  KLEIN_RETURN_IF_ERROR(check_block_types(j, "up_block_types", "UpDecoderBlock2D",
                                          c.decoder_block_out_channels.size(), where));
  if (c.in_channels <= 0 || c.out_channels <= 0 || c.latent_channels <= 0 || c.layers_per_block <= 0 ||
      c.norm_num_groups <= 0)
    return format_error(where + ": non-positive dimension in the VAE config");
  if (!(c.batch_norm_eps >= 0)) return format_error(where + ": negative batch_norm_eps");
  if (c.block_out_channels.size() > 8 || c.decoder_block_out_channels.size() > 8)
    return unsupported(where + ": more than 8 VAE blocks");
  if (c.decoder_block_out_channels.size() != c.block_out_channels.size())
    return unsupported(where + ": decoder_block_out_channels must have as many entries as "
                       "block_out_channels (the latent scale factor would differ)");
  for (const auto* list : {&c.block_out_channels, &c.decoder_block_out_channels})
    for (int64_t ch : *list)
      if (ch % c.norm_num_groups != 0)
        return format_error(where + ": block channel count " + std::to_string(ch) +
                            " is not a multiple of norm_num_groups " + std::to_string(c.norm_num_groups));
  return c;
}

// ------------------------------------------------------------------------------------------
// Loading
// ------------------------------------------------------------------------------------------
namespace {

struct Loader {
  const WeightStore& s;

  Result<Weight> get(const std::string& name, const Shape& shape) const {
    KLEIN_ASSIGN_OR_RETURN(Weight w, s.get(name, shape));
    switch (w.dtype) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
      case DType::kF8E4M3:
        return w;
      default:
        return unsupported(s.file_of(name) + ": tensor '" + name + "' has dtype " +
                           std::string(dtype_name(w.dtype)) + " (expected a float type)");
    }
  }
  Result<Flux2Vae::Conv> conv(const std::string& p, int64_t cout, int64_t cin, int64_t k) const {
    Flux2Vae::Conv c;
    KLEIN_ASSIGN_OR_RETURN(c.w, get(p + ".weight", {cout, cin, k, k}));
    KLEIN_ASSIGN_OR_RETURN(c.b, get(p + ".bias", {cout}));
    return c;
  }
  Result<Flux2Vae::Norm> norm(const std::string& p, int64_t c) const {
    Flux2Vae::Norm n;
    KLEIN_ASSIGN_OR_RETURN(n.w, get(p + ".weight", {c}));
    KLEIN_ASSIGN_OR_RETURN(n.b, get(p + ".bias", {c}));
    return n;
  }
  Result<Flux2Vae::Resnet> resnet(const std::string& p, int64_t cin, int64_t cout) const {
    Flux2Vae::Resnet r;
    r.cin = cin, r.cout = cout;
    KLEIN_ASSIGN_OR_RETURN(r.norm1, norm(p + ".norm1", cin));
    KLEIN_ASSIGN_OR_RETURN(r.conv1, conv(p + ".conv1", cout, cin, 3));
    KLEIN_ASSIGN_OR_RETURN(r.norm2, norm(p + ".norm2", cout));
    KLEIN_ASSIGN_OR_RETURN(r.conv2, conv(p + ".conv2", cout, cout, 3));
    if (cin != cout) {
      KLEIN_ASSIGN_OR_RETURN(r.shortcut, conv(p + ".conv_shortcut", cout, cin, 1));
    } else if (s.has(p + ".conv_shortcut.weight")) {
      return format_error(s.file_of(p + ".conv_shortcut.weight") + ": unexpected tensor '" + p +
                          ".conv_shortcut.weight' (the config gives this block equal in/out channels)");
    }
    return r;
  }
  Result<Flux2Vae::Mid> mid(const std::string& p, int64_t c, bool attn) const {
    Flux2Vae::Mid m;
    KLEIN_ASSIGN_OR_RETURN(m.r0, resnet(p + ".resnets.0", c, c));
    KLEIN_ASSIGN_OR_RETURN(m.r1, resnet(p + ".resnets.1", c, c));
    m.has_attn = attn;
    if (attn) {
      const std::string a = p + ".attentions.0";
      m.attn.c = c;
      KLEIN_ASSIGN_OR_RETURN(m.attn.norm, norm(a + ".group_norm", c));
      KLEIN_ASSIGN_OR_RETURN(m.attn.q, get(a + ".to_q.weight", {c, c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.qb, get(a + ".to_q.bias", {c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.k, get(a + ".to_k.weight", {c, c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.kb, get(a + ".to_k.bias", {c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.v, get(a + ".to_v.weight", {c, c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.vb, get(a + ".to_v.bias", {c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.o, get(a + ".to_out.0.weight", {c, c}));
      KLEIN_ASSIGN_OR_RETURN(m.attn.ob, get(a + ".to_out.0.bias", {c}));
    }
    return m;
  }
};

std::vector<float> weight_vec(const Weight& w) {
  std::vector<float> v(static_cast<size_t>(w.numel()));
  weight_to_f32(w, 0, w.numel(), v.data());
  return v;
}

}  // namespace

Result<Flux2Vae> Flux2Vae::load(const fs::path& dir) {
  const fs::path cfg_path = dir / "config.json";
  KLEIN_ASSIGN_OR_RETURN(auto j, read_json_file(cfg_path));
  Flux2Vae m;
  KLEIN_ASSIGN_OR_RETURN(m.cfg_, Flux2VaeConfig::from_json(j, cfg_path.string()));
  const auto& c = m.cfg_;
  KLEIN_ASSIGN_OR_RETURN(auto store, WeightStore::open(dir));
  m.store_ = std::make_shared<WeightStore>(std::move(store));
  const Loader L{*m.store_};
  const auto& enc = c.block_out_channels;
  const auto& dec = c.decoder_block_out_channels;
  const size_t nb = enc.size();
  const int64_t lat = c.latent_channels;

  // Encoder (vae.py Encoder): conv_in → down blocks (layers_per_block resnets each, a
  // Downsample2D except the last) → mid → conv_norm_out, SiLU, conv_out (2·latent channels).
  KLEIN_ASSIGN_OR_RETURN(m.enc_conv_in_, L.conv("encoder.conv_in", enc[0], c.in_channels, 3));
  int64_t ch = enc[0];
  for (size_t i = 0; i < nb; ++i) {
    Block b;
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    for (int64_t r = 0; r < c.layers_per_block; ++r) {
      KLEIN_ASSIGN_OR_RETURN(auto res, L.resnet(p + ".resnets." + std::to_string(r), ch, enc[i]));
      b.resnets.push_back(std::move(res));
      ch = enc[i];
    }
    b.has_sampler = i + 1 < nb;
    if (b.has_sampler) {
      KLEIN_ASSIGN_OR_RETURN(b.sampler, L.conv(p + ".downsamplers.0.conv", ch, ch, 3));
    }
    m.enc_blocks_.push_back(std::move(b));
  }
  KLEIN_ASSIGN_OR_RETURN(m.enc_mid_, L.mid("encoder.mid_block", ch, c.mid_block_add_attention));
  KLEIN_ASSIGN_OR_RETURN(m.enc_norm_out_, L.norm("encoder.conv_norm_out", ch));
  KLEIN_ASSIGN_OR_RETURN(m.enc_conv_out_, L.conv("encoder.conv_out", 2 * lat, ch, 3));
  if (c.use_quant_conv) {
    KLEIN_ASSIGN_OR_RETURN(m.quant_conv_, L.conv("quant_conv", 2 * lat, 2 * lat, 1));
  }

  // Decoder (vae.py Decoder): conv_in → mid → up blocks over the reversed channel list
  // (layers_per_block + 1 resnets each, an Upsample2D except the last) → norm, SiLU, conv_out.
  if (c.use_post_quant_conv) {
    KLEIN_ASSIGN_OR_RETURN(m.post_quant_conv_, L.conv("post_quant_conv", lat, lat, 1));
  }
  ch = dec.back();
  KLEIN_ASSIGN_OR_RETURN(m.dec_conv_in_, L.conv("decoder.conv_in", ch, lat, 3));
  KLEIN_ASSIGN_OR_RETURN(m.dec_mid_, L.mid("decoder.mid_block", ch, c.mid_block_add_attention));
  for (size_t i = 0; i < nb; ++i) {
    Block b;
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    const int64_t out = dec[nb - 1 - i];
    for (int64_t r = 0; r < c.layers_per_block + 1; ++r) {
      KLEIN_ASSIGN_OR_RETURN(auto res, L.resnet(p + ".resnets." + std::to_string(r), ch, out));
      b.resnets.push_back(std::move(res));
      ch = out;
    }
    b.has_sampler = i + 1 < nb;
    if (b.has_sampler) {
      KLEIN_ASSIGN_OR_RETURN(b.sampler, L.conv(p + ".upsamplers.0.conv", ch, ch, 3));
    }
    m.dec_blocks_.push_back(std::move(b));
  }
  KLEIN_ASSIGN_OR_RETURN(m.dec_norm_out_, L.norm("decoder.conv_norm_out", ch));
  KLEIN_ASSIGN_OR_RETURN(m.dec_conv_out_, L.conv("decoder.conv_out", c.out_channels, ch, 3));

  // Latent batch norm over the patchified channels (only the running stats are used).
  KLEIN_ASSIGN_OR_RETURN(auto bm, L.get("bn.running_mean", {c.patch_channels()}));
  KLEIN_ASSIGN_OR_RETURN(auto bv, L.get("bn.running_var", {c.patch_channels()}));
  m.bn_mean_ = weight_vec(bm);
  m.bn_var_ = weight_vec(bv);
  for (size_t i = 0; i < m.bn_var_.size(); ++i)
    if (!std::isfinite(m.bn_mean_[i]) || !(m.bn_var_[i] >= 0) || !std::isfinite(m.bn_var_[i]))
      return format_error(m.store_->file_of("bn.running_var") + ": bn.running_mean/var entry " +
                          std::to_string(i) + " is not finite or the variance is negative");
  return m;
}

// ------------------------------------------------------------------------------------------
// Latent statistics
// ------------------------------------------------------------------------------------------
LatentStats Flux2Vae::latent_stats(LatentArith arith) const {
  LatentStats s;
  s.mean = bn_mean_;
  s.std.resize(bn_var_.size());
  const float eps = static_cast<float>(cfg_.batch_norm_eps);
  for (size_t i = 0; i < bn_var_.size(); ++i) {
    if (arith == LatentArith::kF32) {
      s.std[i] = std::sqrt(bn_var_[i] + eps);
    } else {
      // torch.sqrt(running_var + eps) on bf16 buffers: each op computes in float, rounds to bf16.
      s.mean[i] = round_bf16(bn_mean_[i]);
      s.std[i] = round_bf16(std::sqrt(round_bf16(round_bf16(bn_var_[i]) + eps)));
    }
  }
  return s;
}

Status Flux2Vae::normalize_latents(Tensor& z, LatentArith arith) const {
  return klein::normalize_latents(z, latent_stats(arith), arith);
}

Status Flux2Vae::denormalize_latents(Tensor& z, LatentArith arith) const {
  return klein::denormalize_latents(z, latent_stats(arith), arith);
}

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
  const std::vector<float> gamma = weight_vec(n.w), beta = weight_vec(n.b);
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
