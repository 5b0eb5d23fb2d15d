#include "models/qwen3.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/json_file.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

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
  if (c.num_heads % c.num_kv_heads != 0)
    return format_error(where + ": num_attention_heads " + std::to_string(c.num_heads) +
                        " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  return c;
}

Result<Qwen3Encoder> Qwen3Encoder::load(const fs::path& dir, int num_layers_needed) {
  const fs::path cfg_path = dir / "config.json";
  KLEIN_ASSIGN_OR_RETURN(auto j, read_json_file(cfg_path));
  Qwen3Encoder m;
  KLEIN_ASSIGN_OR_RETURN(m.cfg_, Qwen3Config::from_json(j, cfg_path.string()));
  const auto& c = m.cfg_;
  if (num_layers_needed < 0 || num_layers_needed > c.num_layers)
    return format_error(cfg_path.string() + ": the text encoder has " + std::to_string(c.num_layers) +
                        " layers, but " + std::to_string(num_layers_needed) + " are needed");
  KLEIN_ASSIGN_OR_RETURN(auto store, WeightStore::open(dir));
  m.store_ = std::make_shared<WeightStore>(std::move(store));
  const WeightStore& s = *m.store_;
  const int64_t H = c.hidden_size, Dq = c.num_heads * c.head_dim, Dkv = c.num_kv_heads * c.head_dim;
  KLEIN_ASSIGN_OR_RETURN(m.embed_, s.get("model.embed_tokens.weight", {c.vocab_size, H}));
  for (int i = 0; i < num_layers_needed; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer L;
    KLEIN_ASSIGN_OR_RETURN(L.input_norm, s.get(p + "input_layernorm.weight", {H}));
    KLEIN_ASSIGN_OR_RETURN(L.q, s.get(p + "self_attn.q_proj.weight", {Dq, H}));
    KLEIN_ASSIGN_OR_RETURN(L.k, s.get(p + "self_attn.k_proj.weight", {Dkv, H}));
    KLEIN_ASSIGN_OR_RETURN(L.v, s.get(p + "self_attn.v_proj.weight", {Dkv, H}));
    KLEIN_ASSIGN_OR_RETURN(L.q_norm, s.get(p + "self_attn.q_norm.weight", {c.head_dim}));
    KLEIN_ASSIGN_OR_RETURN(L.k_norm, s.get(p + "self_attn.k_norm.weight", {c.head_dim}));
    KLEIN_ASSIGN_OR_RETURN(L.o, s.get(p + "self_attn.o_proj.weight", {H, Dq}));
    KLEIN_ASSIGN_OR_RETURN(L.post_norm, s.get(p + "post_attention_layernorm.weight", {H}));
    KLEIN_ASSIGN_OR_RETURN(L.gate, s.get(p + "mlp.gate_proj.weight", {c.intermediate_size, H}));
    KLEIN_ASSIGN_OR_RETURN(L.up, s.get(p + "mlp.up_proj.weight", {c.intermediate_size, H}));
    KLEIN_ASSIGN_OR_RETURN(L.down, s.get(p + "mlp.down_proj.weight", {H, c.intermediate_size}));
    if (c.attention_bias) {
      KLEIN_ASSIGN_OR_RETURN(L.q_bias, s.get(p + "self_attn.q_proj.bias", {Dq}));
      KLEIN_ASSIGN_OR_RETURN(L.k_bias, s.get(p + "self_attn.k_proj.bias", {Dkv}));
      KLEIN_ASSIGN_OR_RETURN(L.v_bias, s.get(p + "self_attn.v_proj.bias", {Dkv}));
    }
    m.layers_.push_back(std::move(L));
  }
  return m;
}

namespace {

// Half-split ("rotate_half") RoPE in place on x: [L, heads, D] at row stride ld.
// cos/sin: [L, D/2] (the two halves share the angle).
void apply_rope(float* x, int64_t L, int64_t heads, int64_t D, int64_t ld, const float* cosv,
                const float* sinv) {
  const int64_t half = D / 2;
  for (int64_t l = 0; l < L; ++l) {
    const float* c = cosv + l * half;
    const float* s = sinv + l * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + l * ld + h * D;
      for (int64_t d = 0; d < half; ++d) {
        const float a = v[d], b = v[d + half];
        v[d] = a * c[d] - b * s[d];
        v[d + half] = b * c[d] + a * s[d];
      }
    }
  }
}

}  // namespace

Result<Tensor> Qwen3Encoder::encode(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask,
                                    const std::vector<int>& taps, const RunContext& ctx) const {
  const auto& c = cfg_;
  const int64_t L = static_cast<int64_t>(ids.size());
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const int64_t I = c.intermediate_size;
  if (L == 0) return invalid_argument("text encoder: empty token sequence");
  if (mask.size() != ids.size()) return invalid_argument("text encoder: mask length differs from ids length");
  int max_tap = 0;
  for (int t : taps) {
    if (t < 0 || t > loaded_layers())
      return invalid_argument("text encoder: hidden-state index " + std::to_string(t) + " is outside 0.." +
                              std::to_string(loaded_layers()) + " (layers loaded)");
    max_tap = std::max(max_tap, t);
  }
  ThreadPool& pool = *ctx.pool;

  // x: [L, H] residual stream.
  Tensor x({L, H});
  for (int64_t l = 0; l < L; ++l) {
    if (ids[l] < 0 || ids[l] >= c.vocab_size)
      return invalid_argument("text encoder: token id " + std::to_string(ids[l]) + " outside the vocabulary (" +
                              std::to_string(c.vocab_size) + ")");
    weight_row_to_f32(embed_, ids[l], x.data() + l * H);
  }

  // RoPE tables [L, D/2]: inv_freq in float32 as transformers computes it; positions 0..L-1.
  const int64_t half = D / 2;
  Tensor cosv({L, half}), sinv({L, half});
  for (int64_t j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(D);
    const float inv_freq = static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(exponent)));
    for (int64_t l = 0; l < L; ++l) {
      const float ang = static_cast<float>(l) * inv_freq;
      cosv.data()[l * half + j] = std::cos(ang);
      sinv.data()[l * half + j] = std::sin(ang);
    }
  }

  std::vector<uint8_t> key_valid(L);
  for (int64_t l = 0; l < L; ++l) key_valid[l] = mask[l] != 0;
  kernels::AttnMask amask{true, key_valid.data()};

  Tensor out({L, static_cast<int64_t>(taps.size()) * H});
  auto store_tap = [&](int idx) {
    for (size_t t = 0; t < taps.size(); ++t) {
      if (taps[t] != idx) continue;
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(out.data() + l * out.dim(1) + t * H, x.data() + l * H, H * sizeof(float));
      ctx.dump("te.hidden_" + std::to_string(idx), x.data(), {1, L, H});
    }
  };
  store_tap(0);

  Tensor h({L, H}), q({L, Hq * D}), k({L, Hkv * D}), v({L, Hkv * D}), att({L, Hq * D});
  Tensor g({L, I}), u({L, I}), tmp({L, H});
  Tensor nw_in({H}), nw_post({H}), nw_q({D}), nw_k({D});
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int i = 0; i < max_tap; ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("text encoding"));
    const Layer& Ly = layers_[i];
    const std::string pfx = "te.layer" + std::to_string(i) + ".";
    weight_to_f32(Ly.input_norm, 0, H, nw_in.data());
    weight_to_f32(Ly.post_norm, 0, H, nw_post.data());
    weight_to_f32(Ly.q_norm, 0, D, nw_q.data());
    weight_to_f32(Ly.k_norm, 0, D, nw_k.data());

    // Attention sub-block.
    ops::rms_norm(x.data(), h.data(), nw_in.data(), L, H, eps, &pool);
    kernels::linear(h.data(), L, H, Ly.q, Ly.q_bias.empty() ? nullptr : &Ly.q_bias, q.data(), pool);
    kernels::linear(h.data(), L, H, Ly.k, Ly.k_bias.empty() ? nullptr : &Ly.k_bias, k.data(), pool);
    kernels::linear(h.data(), L, H, Ly.v, Ly.v_bias.empty() ? nullptr : &Ly.v_bias, v.data(), pool);
    ops::rms_norm(q.data(), q.data(), nw_q.data(), L * Hq, D, eps, &pool);  // per-head, before RoPE
    ops::rms_norm(k.data(), k.data(), nw_k.data(), L * Hkv, D, eps, &pool);
    apply_rope(q.data(), L, Hq, D, Hq * D, cosv.data(), sinv.data());
    apply_rope(k.data(), L, Hkv, D, Hkv * D, cosv.data(), sinv.data());
    if (ctx.wants_dump(pfx + "q")) {
      ctx.dump(pfx + "q", q.data(), {L, Hq, D});
      ctx.dump(pfx + "k", k.data(), {L, Hkv, D});
      ctx.dump(pfx + "v", v.data(), {L, Hkv, D});
    }
    kernels::attention(q.data(), k.data(), v.data(), att.data(), L, L, static_cast<int>(Hq),
                       static_cast<int>(Hkv), static_cast<int>(D), scale, amask, pool);
    kernels::linear(att.data(), L, Hq * D, Ly.o, nullptr, tmp.data(), pool);
    for (int64_t n = 0; n < L * H; ++n) x.data()[n] += tmp.data()[n];
    ctx.dump(pfx + "attn_out", tmp.data(), {1, L, H});

    // MLP sub-block: down(silu(gate(h)) * up(h)).
    ops::rms_norm(x.data(), h.data(), nw_post.data(), L, H, eps, &pool);
    kernels::linear(h.data(), L, H, Ly.gate, nullptr, g.data(), pool);
    kernels::linear(h.data(), L, H, Ly.up, nullptr, u.data(), pool);
    pool.parallel_for(L, [&](int64_t r0, int64_t r1) {
      ops::silu_mul(g.data() + r0 * I, u.data() + r0 * I, g.data() + r0 * I, (r1 - r0) * I);
    });
    kernels::linear(g.data(), L, I, Ly.down, nullptr, tmp.data(), pool);
    for (int64_t n = 0; n < L * H; ++n) x.data()[n] += tmp.data()[n];
    ctx.dump(pfx + "out", x.data(), {1, L, H});
    store_tap(i + 1);
    ctx.report("encode", i + 1, max_tap);
  }
  if (!all_finite(out.data(), out.numel()))
    return internal_error("text encoder produced non-finite hidden states (corrupt weights?)");
  return out;
}

}  // namespace klein
