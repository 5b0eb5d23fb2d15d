// Qwen3 text encoder forward pass (see qwen3.h), written in the Backend's named ops only; config
// and loading are in qwen3.cpp.
#include <algorithm>
#include <cmath>

#include "models/bind.h"
#include "models/qwen3.h"

namespace klein {

struct Qwen3Encoder::Buffers {
  Tensor h, q, k, v, att, g, tmp;     // activations [L, ·]
  Tensor gu;                          // [L, 2I]: the MLP's gate | up (untouched where the SwiGLU is fused)
  Tensor cos, sin;                    // RoPE tables [L, D/2]
  Tensor nw_in, nw_post, nw_q, nw_k;  // the layer's norm weights as f32 on the device
};

Status Qwen3Encoder::layer(int i, const TensorView& x, Buffers& b, const AttnMask& mask,
                           const RunContext& ctx) const {
  const auto& c = cfg_;
  Backend& be = ctx.be();
  const int64_t L = x.rows(), H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const Layer& Ly = layers_[i];
  const std::string pfx = "te.layer" + std::to_string(i) + ".";
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto bias = [](const Weight& w) { return w.empty() ? nullptr : &w; };
  // Norm weights (f32 since load) onto the device: a few KB per layer.
  auto norm_weight = [&](const std::vector<float>& v, Tensor& dst) -> Status {
    KLEIN_ASSIGN_OR_RETURN(dst, be.upload(v.data(), {static_cast<int64_t>(v.size())}, "a norm weight"));
    return Status::Ok();
  };
  KLEIN_RETURN_IF_ERROR(norm_weight(Ly.input_norm_f32, b.nw_in));
  KLEIN_RETURN_IF_ERROR(norm_weight(Ly.post_norm_f32, b.nw_post));
  KLEIN_RETURN_IF_ERROR(norm_weight(Ly.q_norm_f32, b.nw_q));
  KLEIN_RETURN_IF_ERROR(norm_weight(Ly.k_norm_f32, b.nw_k));

  // Attention sub-block; q/k RMSNorm per head (rows of D), then RoPE.
  KLEIN_RETURN_IF_ERROR(be.rms_norm(x, b.h, b.nw_in, eps));
  KLEIN_RETURN_IF_ERROR(be.linear(b.h, Ly.q, bias(Ly.q_bias), b.q));
  KLEIN_RETURN_IF_ERROR(be.linear(b.h, Ly.k, bias(Ly.k_bias), b.k));
  KLEIN_RETURN_IF_ERROR(be.linear(b.h, Ly.v, bias(Ly.v_bias), b.v));
  KLEIN_RETURN_IF_ERROR(be.rms_norm(b.q.view().reshaped({L * Hq, D}), b.q.view().reshaped({L * Hq, D}), b.nw_q, eps));
  KLEIN_RETURN_IF_ERROR(be.rms_norm(b.k.view().reshaped({L * Hkv, D}), b.k.view().reshaped({L * Hkv, D}), b.nw_k, eps));
  KLEIN_RETURN_IF_ERROR(be.rope_half(b.q, static_cast<int>(Hq), b.cos, b.sin));
  KLEIN_RETURN_IF_ERROR(be.rope_half(b.k, static_cast<int>(Hkv), b.cos, b.sin));
  if (ctx.wants_dump(pfx + "q")) {
    ctx.dump(pfx + "q", b.q, {L, Hq, D});
    ctx.dump(pfx + "k", b.k, {L, Hkv, D});
    ctx.dump(pfx + "v", b.v, {L, Hkv, D});
  }
  KLEIN_RETURN_IF_ERROR(be.attention(b.q, b.k, b.v, b.att, static_cast<int>(Hq), static_cast<int>(Hkv), scale, mask));
  KLEIN_RETURN_IF_ERROR(be.linear(b.att, Ly.o, bias(Ly.o_bias), b.tmp));
  KLEIN_RETURN_IF_ERROR(be.add(x, b.tmp));
  ctx.dump(pfx + "attn_out", b.tmp, {1, L, H});

  // MLP sub-block: down(silu(gate(h)) * up(h)).
  KLEIN_RETURN_IF_ERROR(be.rms_norm(x, b.h, b.nw_post, eps));
  if (!Ly.gate_up.empty()) {
    KLEIN_RETURN_IF_ERROR(be.linear_swiglu(b.h, Ly.gate_up, nullptr, b.gu, b.g));
  } else {
    const int64_t I = c.intermediate_size;
    KLEIN_RETURN_IF_ERROR(be.linear(b.h, Ly.gate, nullptr, b.gu.view().col_range(0, I)));
    KLEIN_RETURN_IF_ERROR(be.linear(b.h, Ly.up, nullptr, b.gu.view().col_range(I, 2 * I)));
    KLEIN_RETURN_IF_ERROR(be.swiglu(b.gu.view().col_range(0, I), b.gu.view().col_range(I, 2 * I), b.g));
  }
  KLEIN_RETURN_IF_ERROR(be.linear(b.g, Ly.down, nullptr, b.tmp));
  KLEIN_RETURN_IF_ERROR(be.add(x, b.tmp));
  ctx.dump(pfx + "out", x, {1, L, H});
  return Status::Ok();
}

// The activations of a forward over L tokens and the RoPE tables [L, D/2] (inv_freq in float32 as
// transformers computes it; positions 0..L-1).
Status Qwen3Encoder::make_buffers(int64_t L, Backend& be, Buffers& b) const {
  const auto& c = cfg_;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const int64_t I = c.intermediate_size;
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

  const std::pair<Tensor*, Shape> bufs[] = {{&b.h, {L, H}},        {&b.q, {L, Hq * D}},   {&b.k, {L, Hkv * D}},
                                            {&b.v, {L, Hkv * D}},  {&b.att, {L, Hq * D}}, {&b.g, {L, I}},
                                            {&b.gu, {L, 2 * I}},   {&b.tmp, {L, H}}};
  for (const auto& [t, shape] : bufs) {
    KLEIN_ASSIGN_OR_RETURN(*t, be.alloc(shape, "text encoder activations"));
  }
  KLEIN_ASSIGN_OR_RETURN(b.cos, be.upload(cosv.data(), {L, half}, "RoPE cos"));
  KLEIN_ASSIGN_OR_RETURN(b.sin, be.upload(sinv.data(), {L, half}, "RoPE sin"));
  return Status::Ok();
}

Result<Tensor> Qwen3Encoder::encode(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask,
                                    const std::vector<int>& taps, const RunContext& ctx) const {
  const auto& c = cfg_;
  const int64_t L = static_cast<int64_t>(ids.size());
  const int64_t H = c.hidden_size;
  if (L == 0) return invalid_argument("text encoder: empty token sequence");
  if (mask.size() != ids.size()) return invalid_argument("text encoder: mask length differs from ids length");
  if (!ctx.backend) return invalid_argument("text encoder: RunContext without a backend");
  int max_tap = 0;
  for (int t : taps) {
    if (t < 0 || t > loaded_layers())
      return invalid_argument("text encoder: hidden-state index " + std::to_string(t) + " is outside 0.." +
                              std::to_string(loaded_layers()) + " (layers loaded)");
    max_tap = std::max(max_tap, t);
  }
  for (int64_t l = 0; l < L; ++l)
    if (ids[l] < 0 || ids[l] >= c.vocab_size)
      return invalid_argument("text encoder: token id " + std::to_string(ids[l]) + " outside the vocabulary (" +
                              std::to_string(c.vocab_size) + ")");
  Backend& be = ctx.be();

  // x: [L, H] residual stream.
  KLEIN_ASSIGN_OR_RETURN(Tensor x, be.alloc({L, H}, "the text encoder's residual stream"));
  KLEIN_RETURN_IF_ERROR(be.gather_rows(embed_, ids, x));

  std::vector<uint8_t> key_valid(L);
  for (int64_t l = 0; l < L; ++l) key_valid[l] = mask[l] != 0;
  const AttnMask amask{true, key_valid.data()};

  // out [L, taps·H]: tap t's hidden state in columns [t·H, (t+1)·H).
  KLEIN_ASSIGN_OR_RETURN(Tensor out, be.alloc({L, static_cast<int64_t>(taps.size()) * H}, "the prompt embeddings"));
  auto store_tap = [&](int idx) -> Status {
    for (size_t t = 0; t < taps.size(); ++t) {
      if (taps[t] != idx) continue;
      KLEIN_RETURN_IF_ERROR(be.copy(x, out.view().col_range(t * H, (t + 1) * H)));
      ctx.dump("te.hidden_" + std::to_string(idx), x, {1, L, H});
    }
    return Status::Ok();
  };
  KLEIN_RETURN_IF_ERROR(store_tap(0));

  Buffers b;
  KLEIN_RETURN_IF_ERROR(make_buffers(L, be, b));
  for (int i = 0; i < max_tap; ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("text encoding"));
    ctx.enter_block(i);
    KLEIN_RETURN_IF_ERROR(layer(i, x, b, amask, ctx));
    if (i + 1 == c.num_layers && !final_norm_f32_.empty()) {
      // hidden_states[num_layers] is the final-normed state in transformers.
      KLEIN_ASSIGN_OR_RETURN(Tensor nw, be.upload(final_norm_f32_.data(), {H}, "the final norm weight"));
      KLEIN_RETURN_IF_ERROR(be.rms_norm(x, x, nw, static_cast<float>(c.rms_norm_eps)));
    }
    KLEIN_RETURN_IF_ERROR(store_tap(i + 1));
    ctx.report("encode", i + 1, max_tap);
  }
  KLEIN_ASSIGN_OR_RETURN(bool finite, be.all_finite(out));
  if (!finite) {
    // Only the tensors encode() read: not the layers past the deepest tap nor lm_head.
    const int n = loaded_layers();
    return non_finite_weight_status(*source_, "text encoder", [&](const std::string& name) {
      if (name == "model.embed_tokens.weight") return true;
      if (name == "model.norm.weight") return !final_norm_f32_.empty();
      if (!name.starts_with("model.layers.")) return false;
      const size_t dot = name.find('.', 13);
      const std::string idx = name.substr(13, dot == std::string::npos ? std::string::npos : dot - 13);
      return !idx.empty() && idx.size() < 9 && idx.find_first_not_of("0123456789") == std::string::npos &&
             std::stoi(idx) < n;
    });
  }
  return out;
}

// x_in: a host tensor [L, H].
Result<Tensor> Qwen3Encoder::run_layers(const Tensor& x_in, const std::vector<int32_t>& mask, int first, int last,
                                        const RunContext& ctx) const {
  const int64_t L = static_cast<int64_t>(mask.size()), H = cfg_.hidden_size;
  if (first < 0 || first > last || last > loaded_layers())
    return invalid_argument("text encoder: layers [" + std::to_string(first) + ", " + std::to_string(last) +
                            ") are not within the " + std::to_string(loaded_layers()) + " loaded");
  if (x_in.shape() != Shape{L, H})
    return invalid_argument("text encoder: hidden state " + shape_str(x_in.shape()) + ", expected [" +
                            std::to_string(L) + ", " + std::to_string(H) + "]");
  if (!ctx.backend) return invalid_argument("text encoder: RunContext without a backend");
  Backend& be = ctx.be();
  KLEIN_ASSIGN_OR_RETURN(Tensor x, be.upload(x_in.data(), {L, H}, "the text encoder's residual stream"));
  Buffers b;
  KLEIN_RETURN_IF_ERROR(make_buffers(L, be, b));
  std::vector<uint8_t> key_valid(L);  // [L]
  for (int64_t l = 0; l < L; ++l) key_valid[l] = mask[l] != 0;
  const AttnMask amask{true, key_valid.data()};
  for (int i = first; i < last; ++i) KLEIN_RETURN_IF_ERROR(layer(i, x, b, amask, ctx));
  return x;
}

}  // namespace klein
