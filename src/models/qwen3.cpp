#include "models/qwen3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <tuple>

#include "core/checked.h"
#include "io/json_file.h"
#include "models/bind.h"

namespace fs = std::filesystem;

namespace klein {

Result<Qwen3Config> Qwen3Config::from_json(const nlohmann::json& j, const std::string& where) {
  Qwen3Config c;
  KLEIN_ASSIGN_OR_RETURN(c.vocab_size, json_int(j, "vocab_size", where));
  KLEIN_ASSIGN_OR_RETURN(c.hidden_size, json_int(j, "hidden_size", where));
  KLEIN_ASSIGN_OR_RETURN(c.intermediate_size, json_int(j, "intermediate_size", where));
  KLEIN_ASSIGN_OR_RETURN(c.num_layers, json_int(j, "num_hidden_layers", where));
  KLEIN_ASSIGN_OR_RETURN(c.num_heads, json_int(j, "num_attention_heads", where));
  KLEIN_ASSIGN_OR_RETURN(c.num_kv_heads, json_int(j, "num_key_value_heads", where, c.num_heads));
  KLEIN_ASSIGN_OR_RETURN(c.head_dim, json_int(j, "head_dim", where, c.num_heads ? c.hidden_size / c.num_heads : 0));
  KLEIN_ASSIGN_OR_RETURN(c.rms_norm_eps, json_number(j, "rms_norm_eps", where, 1e-6));
  KLEIN_ASSIGN_OR_RETURN(c.attention_bias, json_bool(j, "attention_bias", where, false));
  KLEIN_ASSIGN_OR_RETURN(auto act, json_string(j, "hidden_act", where, std::string("silu")));
  if (act != "silu") return unsupported(where + ": hidden_act \"" + act + "\" (only silu)");
  // transformers v5 keeps RoPE settings in rope_parameters; v4 in rope_theta / rope_scaling.
  const nlohmann::json* rope = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rope = &j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = &j["rope_scaling"];
  double theta = 1e4;
  if (j.contains("rope_theta")) {
    KLEIN_ASSIGN_OR_RETURN(theta, json_number(j, "rope_theta", where));
  }
  if (rope) {
    if (rope->contains("rope_theta")) {
      KLEIN_ASSIGN_OR_RETURN(theta, json_number(*rope, "rope_theta", where + " rope_parameters"));
    }
    KLEIN_ASSIGN_OR_RETURN(auto type, json_string(*rope, "rope_type", where + " rope_parameters", std::string("default")));
    if (type != "default") return unsupported(where + ": rope_type \"" + type + "\" (only default RoPE)");
  }
  c.rope_theta = theta;
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.head_dim % 2 != 0)
    return format_error(where + ": non-positive or odd dimension in the Qwen3 config");
  // Checked: a config may claim any head count (json_int bounds each factor, not the product).
  int64_t dq = 0, dkv = 0;
  if (!checked_mul(c.num_heads, c.head_dim, &dq) || !checked_mul(c.num_kv_heads, c.head_dim, &dkv) ||
      dq > kMaxConfigDim || dkv > kMaxConfigDim)
    return format_error(where + ": num_attention_heads x head_dim (" + std::to_string(c.num_heads) + " x " +
                        std::to_string(c.head_dim) + ") is too large");
  if (c.num_heads % c.num_kv_heads != 0)
    return format_error(where + ": num_attention_heads " + std::to_string(c.num_heads) +
                        " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  return c;
}

Result<Qwen3Encoder> Qwen3Encoder::load(std::shared_ptr<const TensorSource> src, const nlohmann::json& config,
                                        const std::string& config_where, int num_layers_needed) {
  Qwen3Encoder m;
  KLEIN_ASSIGN_OR_RETURN(m.cfg_, Qwen3Config::from_json(config, config_where));
  const auto& c = m.cfg_;
  if (num_layers_needed < 0 || num_layers_needed > c.num_layers)
    return format_error(config_where + ": the text encoder has " + std::to_string(c.num_layers) +
                        " layers, but " + std::to_string(num_layers_needed) + " are needed");
  m.source_ = std::move(src);
  // The layers the file holds: a config that names more is a wrong config for these weights
  // (and the ignore loop below must not run to a claimed billion) — unless the file holds
  // exactly the layers klein reads (a checkpoint trimmed after the deepest tap).
  int64_t file_layers = 0;
  for (const std::string& n : m.source_->names()) {
    if (!n.starts_with("model.layers.")) continue;
    int64_t i = 0;
    size_t p = 13;
    while (p < n.size() && n[p] >= '0' && n[p] <= '9' && i < kMaxConfigDim) i = i * 10 + (n[p++] - '0');
    if (p < n.size() && n[p] == '.') file_layers = std::max(file_layers, i + 1);
  }
  if (c.num_layers > file_layers && file_layers > num_layers_needed)
    return format_error(config_where + ": num_hidden_layers is " + std::to_string(c.num_layers) + " but " +
                        m.source_->origin() + " holds " + std::to_string(file_layers) + " layers");
  Binder b(*m.source_);
  const int64_t H = c.hidden_size;
  m.layers_.resize(static_cast<size_t>(num_layers_needed));
  for (const TensorRow& r : m.tensor_table(0, num_layers_needed))
    KLEIN_RETURN_IF_ERROR(b.required(r.name, r.shape, r.weight));
  for (Layer& L : m.layers_) {
    // Files written in name order (transformers', `klein quantize`'s) hold up_proj right after
    // gate_proj: then one GEMM reads both, its activations quantized once and the SwiGLU fused.
    if (auto gu = L.gate.stacked_with(L.up)) {
      L.gate_up = std::move(*gu);
      L.gate = Weight();
      L.up = Weight();
    }
    // Norm weights as float32 once here rather than on every encode() call.
    L.input_norm_f32 = weight_to_vector(L.input_norm);
    L.q_norm_f32 = weight_to_vector(L.q_norm);
    L.k_norm_f32 = weight_to_vector(L.k_norm);
    L.post_norm_f32 = weight_to_vector(L.post_norm);
  }
  // transformers returns the final-normed state as hidden_states[num_layers]: when the deepest
  // tap is the last layer (a 27-layer model), that tap gets model.norm applied.
  if (num_layers_needed == c.num_layers) {
    KLEIN_RETURN_IF_ERROR(b.vector_f32("model.norm.weight", H, &m.final_norm_f32_));
  }
  // Never read: the layers past the deepest tap, the final norm and the LM head (klein uses
  // hidden states, not logits). Checkpoints may or may not carry them.
  for (int64_t i = num_layers_needed; i < std::min(c.num_layers, file_layers); ++i)
    b.ignore_prefix("model.layers." + std::to_string(i) + ".");
  if (m.final_norm_f32_.empty()) b.ignore_prefix("model.norm.weight");
  b.ignore_prefix("lm_head.weight");
  KLEIN_RETURN_IF_ERROR(b.finish(config_where + " (num_hidden_layers " + std::to_string(c.num_layers) +
                                 ", attention_bias " + (c.attention_bias ? "true" : "false") + ")"));
  return m;
}

Result<Qwen3Encoder> Qwen3Encoder::load(const fs::path& dir, int num_layers_needed) {
  KLEIN_ASSIGN_OR_RETURN(auto f, open_component(dir));
  return load(std::move(f.source), f.config, f.config_where, num_layers_needed);
}

void Qwen3Encoder::unstack_mlp() {
  const int64_t I = cfg_.intermediate_size;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& L = layers_[i];
    if (L.gate_up.empty()) continue;
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
    // Rows [0, I) and [I, 2I) of a weight bound with those shapes: the views cannot fail.
    L.gate = L.gate_up.row_range(0, I).value();
    L.up = L.gate_up.row_range(I, 2 * I).value();
    L.gate.name = p + "gate_proj.weight";
    L.up.name = p + "up_proj.weight";
    L.gate_up = Weight();
  }
}

std::vector<Qwen3Encoder::TensorRow> Qwen3Encoder::tensor_table(int first, int last) const {
  const Qwen3Config& c = cfg_;
  const int64_t H = c.hidden_size, Dq = c.num_heads * c.head_dim, Dkv = c.num_kv_heads * c.head_dim;
  const int64_t I = c.intermediate_size;
  // The rows hand out writable pointers (load binds through them); the table itself changes nothing.
  auto* self = const_cast<Qwen3Encoder*>(this);
  std::vector<TensorRow> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, -1, &self->embed_});
  for (int i = std::max(first, 0); i < last && i < static_cast<int>(self->layers_.size()); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& L = self->layers_[i];
    for (auto [name, shape, w] : std::initializer_list<std::tuple<const char*, Shape, Weight*>>{
             {"input_layernorm.weight", {H}, &L.input_norm},
             {"self_attn.q_proj.weight", {Dq, H}, &L.q},
             {"self_attn.k_proj.weight", {Dkv, H}, &L.k},
             {"self_attn.v_proj.weight", {Dkv, H}, &L.v},
             {"self_attn.q_norm.weight", {c.head_dim}, &L.q_norm},
             {"self_attn.k_norm.weight", {c.head_dim}, &L.k_norm},
             {"self_attn.o_proj.weight", {H, Dq}, &L.o},
             {"post_attention_layernorm.weight", {H}, &L.post_norm},
             {"mlp.gate_proj.weight", {I, H}, &L.gate},
             {"mlp.up_proj.weight", {I, H}, &L.up},
             {"mlp.down_proj.weight", {H, I}, &L.down}})
      t.push_back({p + name, shape, i, w});
    if (c.attention_bias)  // transformers' Qwen3Attention gives q/k/v and o_proj a bias when set
      for (auto [name, n, w] : std::initializer_list<std::tuple<const char*, int64_t, Weight*>>{
               {"self_attn.q_proj.bias", Dq, &L.q_bias},
               {"self_attn.k_proj.bias", Dkv, &L.k_bias},
               {"self_attn.v_proj.bias", Dkv, &L.v_bias},
               {"self_attn.o_proj.bias", H, &L.o_bias}})
        t.push_back({p + name, {n}, i, w});
  }
  return t;
}

Status Qwen3Encoder::for_each_weight(const std::function<Status(Weight&)>& fn) {
  for (const TensorRow& r : tensor_table(0, loaded_layers())) KLEIN_RETURN_IF_ERROR(fn(*r.weight));
  for (Layer& L : layers_) KLEIN_RETURN_IF_ERROR(fn(L.gate_up));
  return Status::Ok();
}

int Qwen3Encoder::num_blocks() const { return loaded_layers(); }

void Qwen3Encoder::for_each_block_weight(int i, const std::function<void(const Weight&)>& fn) const {
  if (i < 0 || i >= num_blocks()) return;
  for (const TensorRow& r : tensor_table(i, i + 1))
    if (r.block == i) fn(*r.weight);
  fn(layers_[i].gate_up);
}

}  // namespace klein
