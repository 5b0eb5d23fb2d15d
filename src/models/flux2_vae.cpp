// AutoencoderKLFlux2 (diffusers models/autoencoders/autoencoder_kl_flux2.py, vae.py Encoder /
// Decoder, unet_2d_blocks.py UNetMidBlock2D / DownEncoderBlock2D / UpDecoderBlock2D,
// resnet.py ResnetBlock2D, downsampling.py Downsample2D, upsampling.py Upsample2D,
// attention_processor.py AttnProcessor2_0): config, loading, and the float32 forward passes.
#include "core/format.h"
#include "models/flux2_vae.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/checked.h"
#include "io/json_file.h"
#include "models/bind.h"

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
    if (e.get<int64_t>() > kMaxConfigDim)  // bounded like json_int: products stay in int64
      return format_error(where + ": \"" + key + "\" entry " + e.dump() + " is out of range (at most " +
                          std::to_string(kMaxConfigDim) + ")");
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

// Binds the VAE's building blocks; shapes come from the config, checks from the Binder.
struct Loader {
  Binder& b;

  Result<Weight> get(const std::string& name, const Shape& shape) const {
    Weight w;
    KLEIN_RETURN_IF_ERROR(b.required(name, shape, &w));
    return w;
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
    // With equal channels a shortcut in the file is left unbound: Binder::finish reports it.
    if (cin != cout) {
      KLEIN_ASSIGN_OR_RETURN(r.shortcut, conv(p + ".conv_shortcut", cout, cin, 1));
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


}  // namespace

Result<Flux2Vae> Flux2Vae::load(std::shared_ptr<const TensorSource> src, const nlohmann::json& config,
                                const std::string& config_where) {
  Flux2Vae m;
  KLEIN_ASSIGN_OR_RETURN(m.cfg_, Flux2VaeConfig::from_json(config, config_where));
  const auto& c = m.cfg_;
  m.source_ = std::move(src);
  Binder bind(*m.source_);
  const Loader L{bind};
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
  KLEIN_RETURN_IF_ERROR(bind.vector_f32("bn.running_mean", c.patch_channels(), &m.bn_mean_));
  KLEIN_RETURN_IF_ERROR(bind.vector_f32("bn.running_var", c.patch_channels(), &m.bn_var_));
  for (size_t i = 0; i < m.bn_var_.size(); ++i)
    if (!std::isfinite(m.bn_mean_[i]) || !(m.bn_var_[i] >= 0) || !std::isfinite(m.bn_var_[i]))
      return format_error(m.source_->file_of("bn.running_var") + ": bn.running_mean/var entry " +
                          std::to_string(i) + " is not finite or the variance is negative");
  // BatchNorm2d's step counter (I64): training state, never computed with.
  bind.ignore_prefix("bn.num_batches_tracked");
  KLEIN_RETURN_IF_ERROR(bind.finish(config_where));
  return m;
}

Result<Flux2Vae> Flux2Vae::load(const fs::path& dir) {
  KLEIN_ASSIGN_OR_RETURN(auto f, open_component(dir));
  return load(std::move(f.source), f.config, f.config_where);
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


Status Flux2Vae::non_finite_status() const { return non_finite_weight_status(*source_, "VAE"); }

Status Flux2Vae::for_each_weight(const std::function<Status(Weight&)>& fn) {
  auto conv = [&](Conv& c) -> Status {
    KLEIN_RETURN_IF_ERROR(fn(c.w));
    return fn(c.b);
  };
  auto norm = [&](Norm& n) -> Status {
    KLEIN_RETURN_IF_ERROR(fn(n.w));
    return fn(n.b);
  };
  auto resnet = [&](Resnet& r) -> Status {
    KLEIN_RETURN_IF_ERROR(norm(r.norm1));
    KLEIN_RETURN_IF_ERROR(norm(r.norm2));
    KLEIN_RETURN_IF_ERROR(conv(r.conv1));
    KLEIN_RETURN_IF_ERROR(conv(r.conv2));
    return conv(r.shortcut);
  };
  auto mid = [&](Mid& m) -> Status {
    KLEIN_RETURN_IF_ERROR(resnet(m.r0));
    KLEIN_RETURN_IF_ERROR(resnet(m.r1));
    KLEIN_RETURN_IF_ERROR(norm(m.attn.norm));
    for (Weight* w : {&m.attn.q, &m.attn.qb, &m.attn.k, &m.attn.kb, &m.attn.v, &m.attn.vb, &m.attn.o, &m.attn.ob})
      KLEIN_RETURN_IF_ERROR(fn(*w));
    return Status::Ok();
  };
  auto blocks = [&](std::vector<Block>& bs) -> Status {
    for (Block& b : bs) {
      for (Resnet& r : b.resnets) KLEIN_RETURN_IF_ERROR(resnet(r));
      KLEIN_RETURN_IF_ERROR(conv(b.sampler));
    }
    return Status::Ok();
  };
  for (Conv* c : {&enc_conv_in_, &enc_conv_out_, &quant_conv_, &post_quant_conv_, &dec_conv_in_, &dec_conv_out_})
    KLEIN_RETURN_IF_ERROR(conv(*c));
  KLEIN_RETURN_IF_ERROR(norm(enc_norm_out_));
  KLEIN_RETURN_IF_ERROR(norm(dec_norm_out_));
  KLEIN_RETURN_IF_ERROR(mid(enc_mid_));
  KLEIN_RETURN_IF_ERROR(mid(dec_mid_));
  KLEIN_RETURN_IF_ERROR(blocks(enc_blocks_));
  return blocks(dec_blocks_);
}

}  // namespace klein
