// FLUX.2 transformer: config, weight loading and the pure helpers (ids, RoPE, timestep sinusoid).
// The forward pass is in flux2_dit_forward.cpp.
#include <cmath>

#include "core/checked.h"
#include "io/json_file.h"
#include "models/bind.h"
#include "models/flux2_dit.h"

namespace fs = std::filesystem;

namespace klein {

Flux2Ids flux2_image_ids(int h, int w, int t_offset) {
  Flux2Ids ids;
  if (h <= 0 || w <= 0) return ids;
  ids.reserve(static_cast<size_t>(h) * w);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) ids.push_back({t_offset, y, x, 0});
  return ids;
}

Flux2Ids flux2_text_ids(int L) {
  Flux2Ids ids;
  if (L <= 0) return ids;
  ids.reserve(L);
  for (int l = 0; l < L; ++l) ids.push_back({0, 0, 0, l});
  return ids;
}

std::vector<float> flux2_timestep_sinusoid(float t, int64_t channels) {
  std::vector<float> emb(channels > 0 ? channels : 0, 0.0f);
  const int64_t half = channels / 2;
  if (half <= 0) return emb;
  // exponent = fp32(-ln(max_period)) * arange(half) (fp32), / (half - 0) (fp32); exp in fp32.
  const float neg_log = static_cast<float>(-std::log(10000.0));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = (neg_log * static_cast<float>(i)) / static_cast<float>(half);
    // exp correctly rounded to float (via double). PyTorch's x86 CPU exp (MKL) is one ulp high
    // for 2 of the 128 frequencies (i = 12, 106); we do not copy that platform quirk: it moves the
    // fp32 reference by ~6e-6 relative at most, and CUDA's exp differs again.
    const float freq = static_cast<float>(std::exp(static_cast<double>(exponent)));
    const float arg = t * freq;  // fp32 product, as timesteps[:, None].float() * emb
    // flip_sin_to_cos: cos half first. Evaluate in double and round: the correctly rounded value.
    emb[i] = static_cast<float>(std::cos(static_cast<double>(arg)));
    emb[half + i] = static_cast<float>(std::sin(static_cast<double>(arg)));
  }
  return emb;  // odd channel count: the last entry stays 0 (diffusers zero-pads)
}

void flux2_rope_tables(const Flux2Ids& ids, const std::vector<int64_t>& axes, double theta, float* cos,
                       float* sin) {
  int64_t width = 0;
  for (int64_t a : axes) width += a;
  // freqs per axis: 1 / theta^(arange(0, dim, 2, float64) / dim), float64.
  std::vector<double> freqs;
  for (int64_t a : axes)
    for (int64_t j = 0; j < a / 2; ++j)
      freqs.push_back(1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(a)));
  for (size_t s = 0; s < ids.size(); ++s) {
    float* c = cos + s * width;
    float* sn = sin + s * width;
    int64_t off = 0, fi = 0;
    for (size_t a = 0; a < axes.size(); ++a) {
      // pos = ids.float(): the id is rounded to float32 first, then promoted to float64.
      const double pos = static_cast<double>(static_cast<float>(ids[s][a]));
      for (int64_t j = 0; j < axes[a] / 2; ++j, ++fi) {
        const double ang = pos * freqs[fi];
        const float cv = static_cast<float>(std::cos(ang)), sv = static_cast<float>(std::sin(ang));
        c[off + 2 * j] = c[off + 2 * j + 1] = cv;
        sn[off + 2 * j] = sn[off + 2 * j + 1] = sv;
      }
      off += axes[a];
    }
  }
}

Result<Flux2Config> Flux2Config::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return format_error(where + ": not a JSON object");
  if (j.contains("_class_name") && j["_class_name"].is_string() &&
      j["_class_name"].get<std::string>() != "Flux2Transformer2DModel")
    return unsupported(where + ": _class_name \"" + j["_class_name"].get<std::string>() +
                       "\" (expected Flux2Transformer2DModel)");
  Flux2Config c;
  KLEIN_ASSIGN_OR_RETURN(c.num_layers, json_int(j, "num_layers", where));
  KLEIN_ASSIGN_OR_RETURN(c.num_single_layers, json_int(j, "num_single_layers", where));
  KLEIN_ASSIGN_OR_RETURN(c.attention_head_dim, json_int(j, "attention_head_dim", where));
  KLEIN_ASSIGN_OR_RETURN(c.num_attention_heads, json_int(j, "num_attention_heads", where));
  KLEIN_ASSIGN_OR_RETURN(c.in_channels, json_int(j, "in_channels", where));
  KLEIN_ASSIGN_OR_RETURN(c.out_channels, json_int(j, "out_channels", where, c.in_channels));  // null -> in
  KLEIN_ASSIGN_OR_RETURN(c.joint_attention_dim, json_int(j, "joint_attention_dim", where));
  KLEIN_ASSIGN_OR_RETURN(c.mlp_ratio, json_number(j, "mlp_ratio", where, 3.0));
  KLEIN_ASSIGN_OR_RETURN(c.rope_theta, json_number(j, "rope_theta", where, 2000.0));
  KLEIN_ASSIGN_OR_RETURN(c.timestep_guidance_channels, json_int(j, "timestep_guidance_channels", where, 256));
  KLEIN_ASSIGN_OR_RETURN(c.guidance_embeds, json_bool(j, "guidance_embeds", where, true));
  KLEIN_ASSIGN_OR_RETURN(c.eps, json_number(j, "eps", where, 1e-6));
  KLEIN_ASSIGN_OR_RETURN(int64_t patch, json_int(j, "patch_size", where, 1));
  if (patch != 1)
    return unsupported(where + ": patch_size " + std::to_string(patch) + " (only 1, as FLUX.2 uses)");
  // out_channels 0 behaves like null in diffusers (`out_channels or in_channels`).
  if (c.out_channels == 0) c.out_channels = c.in_channels;

  if (!j.contains("axes_dims_rope") || j["axes_dims_rope"].is_null()) {
    c.axes_dims_rope = {32, 32, 32, 32};
  } else {
    const auto& a = j["axes_dims_rope"];
    if (!a.is_array()) return format_error(where + ": \"axes_dims_rope\" is not an array");
    for (const auto& v : a) {
      if (!v.is_number_integer()) return format_error(where + ": \"axes_dims_rope\" has a non-integer entry");
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMaxConfigDim)) ||
          std::llabs(v.get<int64_t>()) > kMaxConfigDim)
        return format_error(where + ": \"axes_dims_rope\" entry " + v.dump() + " is out of range");
      c.axes_dims_rope.push_back(v.get<int64_t>());
    }
  }

  auto positive = [&](const char* key, int64_t v) -> Status {
    if (v <= 0) return format_error(where + ": \"" + key + "\" must be positive, got " + std::to_string(v));
    return Status::Ok();
  };
  if (c.num_layers < 0) return format_error(where + ": \"num_layers\" is negative");
  if (c.num_single_layers < 0) return format_error(where + ": \"num_single_layers\" is negative");
  KLEIN_RETURN_IF_ERROR(positive("attention_head_dim", c.attention_head_dim));
  KLEIN_RETURN_IF_ERROR(positive("num_attention_heads", c.num_attention_heads));
  KLEIN_RETURN_IF_ERROR(positive("in_channels", c.in_channels));
  KLEIN_RETURN_IF_ERROR(positive("out_channels", c.out_channels));
  KLEIN_RETURN_IF_ERROR(positive("joint_attention_dim", c.joint_attention_dim));
  KLEIN_RETURN_IF_ERROR(positive("timestep_guidance_channels", c.timestep_guidance_channels));
  if (c.attention_head_dim % 2 != 0)
    return format_error(where + ": \"attention_head_dim\" " + std::to_string(c.attention_head_dim) +
                        " is odd (RoPE rotates pairs)");
  KLEIN_ASSIGN_OR_RETURN(c.inner_dim_, checked_mul(c.num_attention_heads, c.attention_head_dim, where,
                                                   "num_attention_heads x attention_head_dim"));
  if (!(c.mlp_ratio > 0.0) || !checked_trunc(static_cast<double>(c.inner_dim_) * c.mlp_ratio, &c.mlp_hidden_dim_) ||
      c.mlp_hidden_dim_ <= 0 || c.mlp_hidden_dim_ > kMaxConfigDim)
    return format_error(where + ": \"mlp_ratio\" " + std::to_string(c.mlp_ratio) +
                        " must give an MLP width between 1 and " + std::to_string(kMaxConfigDim));
  if (!(c.rope_theta > 0.0)) return format_error(where + ": \"rope_theta\" must be positive");
  if (!(c.eps >= 0.0)) return format_error(where + ": \"eps\" must be non-negative");
  if (c.axes_dims_rope.empty() || c.axes_dims_rope.size() > 4)
    return format_error(where + ": \"axes_dims_rope\" must have 1 to 4 entries (ids have 4 axes), got " +
                        std::to_string(c.axes_dims_rope.size()));
  int64_t sum = 0;
  for (int64_t a : c.axes_dims_rope) {
    if (a <= 0 || a % 2 != 0)
      return format_error(where + ": \"axes_dims_rope\" entries must be positive and even, got " +
                          std::to_string(a));
    sum += a;  // at most 4 entries of at most kMaxConfigDim each (json_int's bound): no overflow
  }
  if (sum != c.attention_head_dim)
    return format_error(where + ": \"axes_dims_rope\" sums to " + std::to_string(sum) +
                        " but attention_head_dim is " + std::to_string(c.attention_head_dim));
  return c;
}

Result<Flux2Transformer> Flux2Transformer::load(std::shared_ptr<const TensorSource> src,
                                                const nlohmann::json& config, const std::string& config_where) {
  Flux2Transformer m;
  KLEIN_ASSIGN_OR_RETURN(m.cfg_, Flux2Config::from_json(config, config_where));
  const Flux2Config& c = m.cfg_;
  m.source_ = std::move(src);
  Binder bind(*m.source_);
  auto get = [&](const std::string& name, const Shape& shape, Weight* out) {
    return bind.required(name, shape, out);
  };
  auto get_vec = [&](const std::string& name, int64_t n, std::vector<float>* out) {
    return bind.vector_f32(name, n, out);
  };

  // The config's block counts size the model before its tensors are bound: the last block of each
  // kind must be in the file first, so that a corrupt count fails here rather than allocating.
  const int64_t D = c.inner_dim(), F = c.mlp_hidden_dim();
  auto last_block_there = [&](const std::string& name, const Shape& shape) -> Status {
    Weight probe;  // the binder's own message for a missing tensor; a present one is bound in order below
    return m.source_->has(name) ? Status::Ok() : get(name, shape, &probe);
  };
  if (c.num_layers > 0)
    KLEIN_RETURN_IF_ERROR(last_block_there(
        "transformer_blocks." + std::to_string(c.num_layers - 1) + ".attn.to_q.weight", {D, D}));
  if (c.num_single_layers > 0)
    KLEIN_RETURN_IF_ERROR(last_block_there(
        "single_transformer_blocks." + std::to_string(c.num_single_layers - 1) + ".attn.to_qkv_mlp_proj.weight",
        {3 * D + 2 * F, D}));
  m.double_.resize(static_cast<size_t>(c.num_layers));
  m.single_.resize(static_cast<size_t>(c.num_single_layers));
  for (const TensorRow& r : m.tensor_table()) {
    if (r.weight) KLEIN_RETURN_IF_ERROR(get(r.name, r.shape, r.weight));
    else KLEIN_RETURN_IF_ERROR(get_vec(r.name, r.shape[0], r.vector));
  }

  // Anything left over means the file and config.json disagree (more blocks, biases, a guidance
  // embedder the config turned off, or another architecture).
  KLEIN_RETURN_IF_ERROR(bind.finish(config_where + " (num_layers " + std::to_string(c.num_layers) +
                                    ", num_single_layers " + std::to_string(c.num_single_layers) +
                                    ", guidance_embeds " + (c.guidance_embeds ? "true" : "false") + ")"));
  return m;
}

Result<Flux2Transformer> Flux2Transformer::load(const fs::path& dir) {
  KLEIN_ASSIGN_OR_RETURN(auto f, open_component(dir));
  return load(std::move(f.source), f.config, f.config_where);
}

std::vector<Flux2Transformer::TensorRow> Flux2Transformer::tensor_table() const {
  const Flux2Config& c = cfg_;
  const int64_t D = c.inner_dim(), F = c.mlp_hidden_dim(), hd = c.attention_head_dim, C = c.timestep_guidance_channels;
  // The rows hand out writable pointers (load binds through them); the table itself changes nothing.
  auto* self = const_cast<Flux2Transformer*>(this);
  std::vector<TensorRow> t;
  auto mat = [&](std::string name, Shape shape, Weight* w, int block = -1) {
    t.push_back({std::move(name), std::move(shape), block, w, nullptr});
  };
  auto vec = [&](std::string name, int64_t n, std::vector<float>* v, int block) {
    t.push_back({std::move(name), {n}, block, nullptr, v});
  };
  mat("x_embedder.weight", {D, c.in_channels}, &self->x_embedder_);
  mat("context_embedder.weight", {D, c.joint_attention_dim}, &self->context_embedder_);
  mat("time_guidance_embed.timestep_embedder.linear_1.weight", {D, C}, &self->t_lin1_);
  mat("time_guidance_embed.timestep_embedder.linear_2.weight", {D, D}, &self->t_lin2_);
  if (c.guidance_embeds) {
    mat("time_guidance_embed.guidance_embedder.linear_1.weight", {D, C}, &self->g_lin1_);
    mat("time_guidance_embed.guidance_embedder.linear_2.weight", {D, D}, &self->g_lin2_);
  }
  mat("double_stream_modulation_img.linear.weight", {6 * D, D}, &self->mod_img_);
  mat("double_stream_modulation_txt.linear.weight", {6 * D, D}, &self->mod_txt_);
  mat("single_stream_modulation.linear.weight", {3 * D, D}, &self->mod_single_);
  int block = 0;
  for (size_t i = 0; i < self->double_.size(); ++i, ++block) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    DoubleBlock& b = self->double_[i];
    mat(p + "attn.to_q.weight", {D, D}, &b.to_q, block);
    mat(p + "attn.to_k.weight", {D, D}, &b.to_k, block);
    mat(p + "attn.to_v.weight", {D, D}, &b.to_v, block);
    vec(p + "attn.norm_q.weight", hd, &b.norm_q, block);
    vec(p + "attn.norm_k.weight", hd, &b.norm_k, block);
    mat(p + "attn.to_out.0.weight", {D, D}, &b.to_out, block);
    mat(p + "attn.add_q_proj.weight", {D, D}, &b.add_q, block);
    mat(p + "attn.add_k_proj.weight", {D, D}, &b.add_k, block);
    mat(p + "attn.add_v_proj.weight", {D, D}, &b.add_v, block);
    vec(p + "attn.norm_added_q.weight", hd, &b.norm_added_q, block);
    vec(p + "attn.norm_added_k.weight", hd, &b.norm_added_k, block);
    mat(p + "attn.to_add_out.weight", {D, D}, &b.to_add_out, block);
    mat(p + "ff.linear_in.weight", {2 * F, D}, &b.ff_in, block);
    mat(p + "ff.linear_out.weight", {D, F}, &b.ff_out, block);
    mat(p + "ff_context.linear_in.weight", {2 * F, D}, &b.ffc_in, block);
    mat(p + "ff_context.linear_out.weight", {D, F}, &b.ffc_out, block);
  }
  for (size_t i = 0; i < self->single_.size(); ++i, ++block) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
    SingleBlock& b = self->single_[i];
    mat(p + "attn.to_qkv_mlp_proj.weight", {3 * D + 2 * F, D}, &b.qkv_mlp, block);
    vec(p + "attn.norm_q.weight", hd, &b.norm_q, block);
    vec(p + "attn.norm_k.weight", hd, &b.norm_k, block);
    mat(p + "attn.to_out.weight", {D, D + F}, &b.to_out, block);
  }
  mat("norm_out.linear.weight", {2 * D, D}, &self->norm_out_);
  mat("proj_out.weight", {c.out_channels, D}, &self->proj_out_);
  return t;
}

Status Flux2Transformer::for_each_weight(const std::function<Status(Weight&)>& fn) {
  for (const TensorRow& r : tensor_table())
    if (r.weight) KLEIN_RETURN_IF_ERROR(fn(*r.weight));
  return Status::Ok();
}

int Flux2Transformer::num_blocks() const { return static_cast<int>(double_.size() + single_.size()); }

void Flux2Transformer::for_each_block_weight(int i, const std::function<void(const Weight&)>& fn) const {
  if (i < 0 || i >= num_blocks()) return;
  for (const TensorRow& r : tensor_table())
    if (r.block == i && r.weight) fn(*r.weight);
}

uint64_t Flux2KvCache::bytes() const {
  uint64_t n = 0;
  for (const Tensor& t : layers) n += static_cast<uint64_t>(t.numel()) * sizeof(float);  // packed or not
  return n;
}

}  // namespace klein
