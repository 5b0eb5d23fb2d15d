// AutoencoderKLFlux2 (diffusers models/autoencoders/autoencoder_kl_flux2.py, vae.py Encoder /
// Decoder, unet_2d_blocks.py UNetMidBlock2D / DownEncoderBlock2D / UpDecoderBlock2D,
// resnet.py ResnetBlock2D, downsampling.py Downsample2D, upsampling.py Upsample2D,
// attention_processor.py AttnProcessor2_0): config, loading, and the float32 forward passes.
#include "core/format.h"
#include "models/flux2_vae.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

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
  if (j.contains("sample_size") && j["sample_size"].is_number_integer()) {  // may be a list: then ignored
    KLEIN_ASSIGN_OR_RETURN(c.sample_size, json_int(j, "sample_size", where, 1024));
  }
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
  if (c.sample_size < 16 || c.sample_size > 8192)
    return format_error(where + ": sample_size " + std::to_string(c.sample_size) + " is outside 16..8192");
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

// Sizes the building blocks the config implies (resnet counts and channels, samplers, the mid
// attention) so that tensor_table() can point into them.
void size_blocks(const Flux2VaeConfig& c, std::vector<Flux2Vae::Block>* enc_blocks, Flux2Vae::Mid* enc_mid,
                 std::vector<Flux2Vae::Block>* dec_blocks, Flux2Vae::Mid* dec_mid) {
  const auto& enc = c.block_out_channels;
  const auto& dec = c.decoder_block_out_channels;
  const size_t nb = enc.size();
  auto resnet = [](int64_t cin, int64_t cout) {
    Flux2Vae::Resnet r;
    r.cin = cin, r.cout = cout;
    return r;
  };
  auto mid = [&](Flux2Vae::Mid* m, int64_t ch) {
    m->r0 = resnet(ch, ch), m->r1 = resnet(ch, ch);
    m->has_attn = c.mid_block_add_attention;
    m->attn.c = ch;
  };
  enc_blocks->assign(nb, {});
  int64_t ch = enc[0];
  for (size_t i = 0; i < nb; ++i) {
    for (int64_t r = 0; r < c.layers_per_block; ++r, ch = enc[i]) (*enc_blocks)[i].resnets.push_back(resnet(ch, enc[i]));
    (*enc_blocks)[i].has_sampler = i + 1 < nb;
  }
  mid(enc_mid, ch);
  ch = dec.back();
  mid(dec_mid, ch);
  dec_blocks->assign(nb, {});
  for (size_t i = 0; i < nb; ++i) {
    const int64_t out = dec[nb - 1 - i];
    for (int64_t r = 0; r < c.layers_per_block + 1; ++r, ch = out) (*dec_blocks)[i].resnets.push_back(resnet(ch, out));
    (*dec_blocks)[i].has_sampler = i + 1 < nb;
  }
}

}  // namespace

std::vector<Flux2Vae::TensorRow> Flux2Vae::tensor_table() const {
  const auto& c = cfg_;
  // The rows hand out writable pointers (load binds through them); the table itself changes nothing.
  auto* self = const_cast<Flux2Vae*>(this);
  std::vector<TensorRow> t;
  Part part = Part::kEncoder;
  auto mat = [&](std::string name, Shape shape, Weight* w) {
    t.push_back({std::move(name), std::move(shape), part, w, nullptr});
  };
  auto conv = [&](const std::string& p, Conv* cv, int64_t cout, int64_t cin, int64_t k) {
    mat(p + ".weight", {cout, cin, k, k}, &cv->w);
    mat(p + ".bias", {cout}, &cv->b);
  };
  auto norm = [&](const std::string& p, Norm* n, int64_t ch) {
    mat(p + ".weight", {ch}, &n->w);
    mat(p + ".bias", {ch}, &n->b);
  };
  auto resnet = [&](const std::string& p, Resnet* r) {
    norm(p + ".norm1", &r->norm1, r->cin);
    conv(p + ".conv1", &r->conv1, r->cout, r->cin, 3);
    norm(p + ".norm2", &r->norm2, r->cout);
    conv(p + ".conv2", &r->conv2, r->cout, r->cout, 3);
    // With equal channels there is no row: a shortcut in the file is then left over (Binder::finish).
    if (r->cin != r->cout) conv(p + ".conv_shortcut", &r->shortcut, r->cout, r->cin, 1);
  };
  auto mid = [&](const std::string& p, Mid* m) {
    resnet(p + ".resnets.0", &m->r0);
    resnet(p + ".resnets.1", &m->r1);
    if (!m->has_attn) return;
    const std::string a = p + ".attentions.0";
    Attn& at = m->attn;
    norm(a + ".group_norm", &at.norm, at.c);
    for (auto [n, w, b] : {std::tuple{"to_q", &at.q, &at.qb}, std::tuple{"to_k", &at.k, &at.kb},
                           std::tuple{"to_v", &at.v, &at.vb}, std::tuple{"to_out.0", &at.o, &at.ob}}) {
      mat(a + "." + n + ".weight", {at.c, at.c}, w);
      mat(a + "." + n + ".bias", {at.c}, b);
    }
  };
  const int64_t lat = c.latent_channels;
  // Encoder (vae.py Encoder): conv_in → down blocks (layers_per_block resnets each, a
  // Downsample2D except the last) → mid → conv_norm_out, SiLU, conv_out (2·latent channels).
  conv("encoder.conv_in", &self->enc_conv_in_, c.block_out_channels[0], c.in_channels, 3);
  for (size_t i = 0; i < enc_blocks_.size(); ++i) {
    Block& b = self->enc_blocks_[i];
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    for (size_t r = 0; r < b.resnets.size(); ++r) resnet(p + ".resnets." + std::to_string(r), &b.resnets[r]);
    if (b.has_sampler) conv(p + ".downsamplers.0.conv", &b.sampler, b.resnets.back().cout, b.resnets.back().cout, 3);
  }
  const int64_t enc_ch = enc_mid_.r0.cin, dec_ch = dec_mid_.r0.cin;
  mid("encoder.mid_block", &self->enc_mid_);
  norm("encoder.conv_norm_out", &self->enc_norm_out_, enc_ch);
  conv("encoder.conv_out", &self->enc_conv_out_, 2 * lat, enc_ch, 3);
  if (c.use_quant_conv) conv("quant_conv", &self->quant_conv_, 2 * lat, 2 * lat, 1);

  // Decoder (vae.py Decoder): conv_in → mid → up blocks over the reversed channel list
  // (layers_per_block + 1 resnets each, an Upsample2D except the last) → norm, SiLU, conv_out.
  part = Part::kDecoder;
  if (c.use_post_quant_conv) conv("post_quant_conv", &self->post_quant_conv_, lat, lat, 1);
  conv("decoder.conv_in", &self->dec_conv_in_, dec_ch, lat, 3);
  mid("decoder.mid_block", &self->dec_mid_);
  for (size_t i = 0; i < dec_blocks_.size(); ++i) {
    Block& b = self->dec_blocks_[i];
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    for (size_t r = 0; r < b.resnets.size(); ++r) resnet(p + ".resnets." + std::to_string(r), &b.resnets[r]);
    if (b.has_sampler) conv(p + ".upsamplers.0.conv", &b.sampler, b.resnets.back().cout, b.resnets.back().cout, 3);
  }
  const int64_t out_ch = dec_blocks_.back().resnets.back().cout;
  norm("decoder.conv_norm_out", &self->dec_norm_out_, out_ch);
  conv("decoder.conv_out", &self->dec_conv_out_, c.out_channels, out_ch, 3);

  // Latent batch norm over the patchified channels (only the running stats are used).
  part = Part::kLatentNorm;
  t.push_back({"bn.running_mean", {c.patch_channels()}, part, nullptr, &self->bn_mean_});
  t.push_back({"bn.running_var", {c.patch_channels()}, part, nullptr, &self->bn_var_});
  return t;
}

Result<Flux2Vae> Flux2Vae::load(std::shared_ptr<const TensorSource> src, const nlohmann::json& config,
                                const std::string& config_where) {
  Flux2Vae m;
  KLEIN_ASSIGN_OR_RETURN(m.cfg_, Flux2VaeConfig::from_json(config, config_where));
  const auto& c = m.cfg_;
  m.source_ = std::move(src);
  size_blocks(c, &m.enc_blocks_, &m.enc_mid_, &m.dec_blocks_, &m.dec_mid_);
  Binder bind(*m.source_);
  for (const TensorRow& r : m.tensor_table()) {
    if (r.weight) KLEIN_RETURN_IF_ERROR(bind.required(r.name, r.shape, r.weight));
    else KLEIN_RETURN_IF_ERROR(bind.vector_f32(r.name, r.shape[0], r.vector));
  }
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
  for (const TensorRow& r : tensor_table())
    if (r.weight) KLEIN_RETURN_IF_ERROR(fn(*r.weight));
  return Status::Ok();
}

}  // namespace klein
