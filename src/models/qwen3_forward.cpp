// Qwen3 text encoder forward pass (see qwen3.h); config and loading are in qwen3.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "models/qwen3.h"

namespace klein {

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
