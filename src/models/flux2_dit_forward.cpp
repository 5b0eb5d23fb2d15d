// FLUX.2 transformer forward pass (float32). See flux2_dit.h for the structure and dump names.
//
// Memory plan (S = T + N tokens, D = inner dim, F = MLP width), all allocated once per call and
// reused by every block:
//   h   [S, D]        residual stream, text rows first: the double blocks work on its two row
//                     ranges, so the concatenation before the single blocks is free
//   nrm [S, D]        modulated LayerNorm output
//   P   [S, 3D + 2F]  projections: double blocks use it as QKV [S, 3D] and as the FF hidden
//                     [S, 2F]; single blocks as the fused QKV|gate|up output
//   cat [S, D + F]    attention output (double: [S, D]); single blocks: [attention | SiLU(g)*u],
//                     the input of the fused to_out; double blocks: the SwiGLU output [S, F]
//   o   [S, D]        output projections before the gated residual
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "models/flux2_dit.h"

namespace klein {

namespace {

constexpr int64_t kRowGrain = 4;  // rows per parallel_for chunk lower bound for D-wide row ops

// y[r] = LN(x[r]) * onep + shift for rows [0, rows), width D (LayerNorm without affine, biased
// variance). onep = 1 + scale, precomputed once as diffusers does (`1 + scale` is its own op).
void modulated_layer_norm(const float* x, float* y, int64_t rows, int64_t D, float eps, const float* onep,
                          const float* shift, ThreadPool& pool) {
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * D;
      float* yr = y + r * D;
      double s = 0.0;
      for (int64_t i = 0; i < D; ++i) s += xr[i];
      const double mean = s / static_cast<double>(D);
      double v = 0.0;
      for (int64_t i = 0; i < D; ++i) {
        const double d = xr[i] - mean;
        v += d * d;
      }
      const float rstd = static_cast<float>(1.0 / std::sqrt(v / static_cast<double>(D) + eps));
      const float m = static_cast<float>(mean);
      for (int64_t i = 0; i < D; ++i) {
        const float n = (xr[i] - m) * rstd;
        yr[i] = onep[i] * n + shift[i];
      }
    }
  }, kRowGrain);
}

// h[r] += gate * o[r] for rows [0, rows), width D.
void gated_residual(float* h, const float* o, int64_t rows, int64_t D, const float* gate, ThreadPool& pool) {
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* hr = h + r * D;
      const float* orow = o + r * D;
      for (int64_t i = 0; i < D; ++i) hr[i] += gate[i] * orow[i];
    }
  }, kRowGrain);
}

// out[r, 0:F] = SiLU(in[r, 0:F]) * in[r, F:2F] for rows [0, rows); row strides ld_in / ld_out.
void swiglu(const float* in, int64_t ld_in, float* out, int64_t ld_out, int64_t rows, int64_t F,
            ThreadPool& pool) {
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) ops::silu_mul(in + r * ld_in, in + r * ld_in + F, out + r * ld_out, F);
  }, kRowGrain);
}

// Per token s and head: RMSNorm (weight w, over head_dim) then RoPE, in place, for Q at column
// 0 and K at column D of each row of P (row stride ld). Rows [0, T) use the text weights.
struct QkNorm {
  const float* q_txt;
  const float* k_txt;
  const float* q_img;
  const float* k_img;
};
void qk_norm_rope(float* P, int64_t ld, int64_t S, int64_t T, int64_t H, int64_t hd, int64_t D,
                  const QkNorm& w, float eps, const float* cos, const float* sin, ThreadPool& pool) {
  auto norm_rope = [&](float* v, const float* wt, const float* c, const float* s) {
    double ssd = 0.0;
    for (int64_t i = 0; i < hd; ++i) ssd += static_cast<double>(v[i]) * v[i];
    const float ss = static_cast<float>(ssd / static_cast<double>(hd));
    const float inv = 1.0f / std::sqrt(ss + eps);
    for (int64_t i = 0; i < hd; ++i) v[i] = (v[i] * inv) * wt[i];
    // out = x * cos + rotate(x) * sin with rotate(x)[2j] = -x[2j+1], rotate(x)[2j+1] = x[2j].
    for (int64_t j = 0; j < hd; j += 2) {
      const float a = v[j], b = v[j + 1];
      v[j] = a * c[j] + (-b) * s[j];
      v[j + 1] = b * c[j + 1] + a * s[j + 1];
    }
  };
  pool.parallel_for(S, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const bool txt = s < T;
      const float* wq = txt ? w.q_txt : w.q_img;
      const float* wk = txt ? w.k_txt : w.k_img;
      const float* c = cos + s * hd;
      const float* sn = sin + s * hd;
      float* row = P + s * ld;
      for (int64_t h = 0; h < H; ++h) {
        norm_rope(row + h * hd, wq, c, sn);
        norm_rope(row + D + h * hd, wk, c, sn);
      }
    }
  }, kRowGrain);
}

bool ids_in_range(const Flux2Ids& ids) {
  for (const auto& a : ids)
    for (int64_t v : a)
      if (v < -(int64_t{1} << 24) || v > (int64_t{1} << 24)) return false;
  return true;
}

}  // namespace

void Flux2Transformer::time_embedding(float t1000, std::optional<float> g1000, float* temb, ThreadPool& pool) const {
  const int64_t D = cfg_.inner_dim(), C = cfg_.timestep_guidance_channels;
  Tensor hidden({1, D}), tmp({1, D});
  auto embed = [&](float v, const Weight& l1, const Weight& l2, float* out) {
    const std::vector<float> proj = flux2_timestep_sinusoid(v, C);
    kernels::linear(proj.data(), 1, C, l1, nullptr, hidden.data(), pool);
    ops::silu(hidden.data(), D);
    kernels::linear(hidden.data(), 1, D, l2, nullptr, out, pool);
  };
  embed(t1000, t_lin1_, t_lin2_, temb);
  if (g1000 && cfg_.guidance_embeds) {
    embed(*g1000, g_lin1_, g_lin2_, tmp.data());
    for (int64_t i = 0; i < D; ++i) temb[i] += tmp.data()[i];
  }
}

Result<Tensor> Flux2Transformer::forward(const Tensor& img, const Tensor& txt, float timestep,
                                         const Flux2Ids& img_ids, const Flux2Ids& txt_ids, const RunContext& ctx,
                                         std::optional<float> guidance) const {
  const Flux2Config& c = cfg_;
  const int64_t D = c.inner_dim(), F = c.mlp_hidden_dim(), hd = c.attention_head_dim;
  const int64_t H = c.num_attention_heads;
  const int64_t Cin = c.in_channels, J = c.joint_attention_dim, Cout = c.out_channels;

  // ---- input checks (caller errors, never aborts)
  auto tokens_of = [](const Tensor& t, int64_t width, const char* what, int64_t* n) -> Status {
    const bool ok2 = t.ndim() == 2 && t.dim(1) == width;
    const bool ok3 = t.ndim() == 3 && t.dim(0) == 1 && t.dim(2) == width;
    if (!ok2 && !ok3)
      return invalid_argument(std::string("transformer: ") + what + " has shape " + shape_str(t.shape()) +
                              ", expected [tokens, " + std::to_string(width) + "] (batch 1)");
    *n = t.dim(-2);
    return Status::Ok();
  };
  int64_t N = 0, T = 0;
  KLEIN_RETURN_IF_ERROR(tokens_of(img, Cin, "image tokens", &N));
  KLEIN_RETURN_IF_ERROR(tokens_of(txt, J, "text embeddings", &T));
  if (N == 0) return invalid_argument("transformer: no image tokens");
  if (static_cast<int64_t>(img_ids.size()) != N)
    return invalid_argument("transformer: " + std::to_string(img_ids.size()) + " image ids for " +
                            std::to_string(N) + " image tokens");
  if (static_cast<int64_t>(txt_ids.size()) != T)
    return invalid_argument("transformer: " + std::to_string(txt_ids.size()) + " text ids for " +
                            std::to_string(T) + " text tokens");
  if (!ids_in_range(img_ids) || !ids_in_range(txt_ids))
    return invalid_argument("transformer: a position id is outside +-2^24");
  if (!std::isfinite(timestep)) return invalid_argument("transformer: timestep is not finite");
  if (guidance && !std::isfinite(*guidance)) return invalid_argument("transformer: guidance is not finite");
  if (!all_finite(img.data(), img.numel())) return invalid_argument("transformer: image tokens contain NaN/Inf");
  if (!all_finite(txt.data(), txt.numel())) return invalid_argument("transformer: text embeddings contain NaN/Inf");

  ThreadPool local_pool(1);
  ThreadPool& pool = ctx.pool ? *ctx.pool : local_pool;
  const int64_t S = T + N;
  const float eps = static_cast<float>(c.eps);

  // ---- 1. timestep embedding: timestep.to(dtype) * 1000 in float32, as the model does.
  Tensor temb({1, D});
  const float t1000 = timestep * 1000.0f;
  std::optional<float> g1000;
  if (guidance) g1000 = *guidance * 1000.0f;
  time_embedding(t1000, g1000, temb.data(), pool);
  ctx.dump("dit.temb", temb);

  // ---- 2. shared modulations from SiLU(temb); 1 + scale precomputed once per vector.
  Tensor stemb = temb.clone();
  ops::silu(stemb.data(), D);
  Tensor mod_img({1, 6 * D}), mod_txt({1, 6 * D}), mod_single({1, 3 * D}), mod_out({1, 2 * D});
  kernels::linear(stemb.data(), 1, D, mod_img_, nullptr, mod_img.data(), pool);
  kernels::linear(stemb.data(), 1, D, mod_txt_, nullptr, mod_txt.data(), pool);
  kernels::linear(stemb.data(), 1, D, mod_single_, nullptr, mod_single.data(), pool);
  kernels::linear(stemb.data(), 1, D, norm_out_, nullptr, mod_out.data(), pool);
  ctx.dump("dit.mod_img", mod_img);
  ctx.dump("dit.mod_txt", mod_txt);
  ctx.dump("dit.mod_single", mod_single);
  // Chunk k of a modulation vector is [k*D, (k+1)*D). Double: shift, scale, gate (attention),
  // shift, scale, gate (MLP). Single: shift, scale, gate. norm_out: scale, shift.
  auto one_plus = [D](const Tensor& m, int64_t chunk) {
    std::vector<float> r(D);
    for (int64_t i = 0; i < D; ++i) r[i] = 1.0f + m.data()[chunk * D + i];
    return r;
  };
  struct StreamMod {
    const float *shift_msa, *gate_msa, *shift_mlp, *gate_mlp;
    std::vector<float> onep_msa, onep_mlp;
  };
  auto stream_mod = [&](const Tensor& m) {
    StreamMod s;
    s.shift_msa = m.data();
    s.onep_msa = one_plus(m, 1);
    s.gate_msa = m.data() + 2 * D;
    s.shift_mlp = m.data() + 3 * D;
    s.onep_mlp = one_plus(m, 4);
    s.gate_mlp = m.data() + 5 * D;
    return s;
  };
  const StreamMod mi = stream_mod(mod_img), mt = stream_mod(mod_txt);
  const float* single_shift = mod_single.data();
  const std::vector<float> single_onep = one_plus(mod_single, 1);
  const float* single_gate = mod_single.data() + 2 * D;
  const std::vector<float> out_onep = one_plus(mod_out, 0);
  const float* out_shift = mod_out.data() + D;

  // ---- 3. input projections into the residual stream (text rows first).
  Tensor h({S, D});
  float* htxt = h.data();
  float* himg = h.data() + T * D;
  kernels::linear(txt.data(), T, J, context_embedder_, nullptr, htxt, pool);
  kernels::linear(img.data(), N, Cin, x_embedder_, nullptr, himg, pool);
  ctx.dump("dit.x_embedder", himg, {1, N, D});
  ctx.dump("dit.context_embedder", htxt, {1, T, D});

  // ---- 4. RoPE tables for [text; image] tokens.
  Tensor rcos({S, hd}), rsin({S, hd});
  flux2_rope_tables(txt_ids, c.axes_dims_rope, c.rope_theta, rcos.data(), rsin.data());
  flux2_rope_tables(img_ids, c.axes_dims_rope, c.rope_theta, rcos.data() + T * hd, rsin.data() + T * hd);
  ctx.dump("dit.rope_cos", rcos);
  ctx.dump("dit.rope_sin", rsin);

  // ---- work buffers, shared by all blocks
  const int64_t ldp = 3 * D + 2 * F, ldcat = D + F;
  Tensor nrm({S, D}), P({S, ldp}), cat({S, ldcat}), o({S, D});
  const float attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const kernels::AttnMask no_mask{};
  const int Hi = static_cast<int>(H), hdi = static_cast<int>(hd);

  // ---- 5. double-stream blocks
  for (size_t bi = 0; bi < double_.size(); ++bi) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("the transformer"));
    const DoubleBlock& b = double_[bi];
    const std::string pfx = "dit.double" + std::to_string(bi) + ".";
    float* ntxt = nrm.data();
    float* nimg = nrm.data() + T * D;
    // Attention: QKV [S, 3D] at row stride 3D in P, text rows first.
    const int64_t ldq = 3 * D;
    float* qkv = P.data();
    modulated_layer_norm(htxt, ntxt, T, D, eps, mt.onep_msa.data(), mt.shift_msa, pool);
    modulated_layer_norm(himg, nimg, N, D, eps, mi.onep_msa.data(), mi.shift_msa, pool);
    kernels::linear(ntxt, T, D, b.add_q, nullptr, qkv, pool, D, ldq);
    kernels::linear(ntxt, T, D, b.add_k, nullptr, qkv + D, pool, D, ldq);
    kernels::linear(ntxt, T, D, b.add_v, nullptr, qkv + 2 * D, pool, D, ldq);
    float* qkv_img = qkv + T * ldq;
    kernels::linear(nimg, N, D, b.to_q, nullptr, qkv_img, pool, D, ldq);
    kernels::linear(nimg, N, D, b.to_k, nullptr, qkv_img + D, pool, D, ldq);
    kernels::linear(nimg, N, D, b.to_v, nullptr, qkv_img + 2 * D, pool, D, ldq);
    qk_norm_rope(qkv, ldq, S, T, H, hd, D,
                 QkNorm{b.norm_added_q.data(), b.norm_added_k.data(), b.norm_q.data(), b.norm_k.data()}, eps,
                 rcos.data(), rsin.data(), pool);
    float* att = cat.data();  // [S, D]
    kernels::attention(qkv, qkv + D, qkv + 2 * D, att, S, S, Hi, Hi, hdi, attn_scale, no_mask, pool, ldq, ldq,
                       ldq, D);
    float* otxt = o.data();
    float* oimg = o.data() + T * D;
    kernels::linear(att, T, D, b.to_add_out, nullptr, otxt, pool);
    kernels::linear(att + T * D, N, D, b.to_out, nullptr, oimg, pool);
    ctx.dump(pfx + "attn_img", oimg, {1, N, D});
    ctx.dump(pfx + "attn_txt", otxt, {1, T, D});
    gated_residual(htxt, otxt, T, D, mt.gate_msa, pool);
    gated_residual(himg, oimg, N, D, mi.gate_msa, pool);

    // Feed-forward (SwiGLU): hidden [S, 2F] in P, activation [S, F] in cat.
    modulated_layer_norm(htxt, ntxt, T, D, eps, mt.onep_mlp.data(), mt.shift_mlp, pool);
    modulated_layer_norm(himg, nimg, N, D, eps, mi.onep_mlp.data(), mi.shift_mlp, pool);
    float* u = P.data();
    float* act = cat.data();
    kernels::linear(ntxt, T, D, b.ffc_in, nullptr, u, pool);
    kernels::linear(nimg, N, D, b.ff_in, nullptr, u + T * 2 * F, pool);
    swiglu(u, 2 * F, act, F, S, F, pool);
    kernels::linear(act, T, F, b.ffc_out, nullptr, otxt, pool);
    kernels::linear(act + T * F, N, F, b.ff_out, nullptr, oimg, pool);
    gated_residual(htxt, otxt, T, D, mt.gate_mlp, pool);
    gated_residual(himg, oimg, N, D, mi.gate_mlp, pool);
    ctx.dump(pfx + "img", himg, {1, N, D});
    ctx.dump(pfx + "txt", htxt, {1, T, D});
  }

  // ---- 6. single-stream blocks on h = [text; image]
  for (size_t bi = 0; bi < single_.size(); ++bi) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("the transformer"));
    const SingleBlock& b = single_[bi];
    const std::string name = "dit.single" + std::to_string(bi);
    modulated_layer_norm(h.data(), nrm.data(), S, D, eps, single_onep.data(), single_shift, pool);
    // P rows: [Q | K | V | gate | up].
    kernels::linear(nrm.data(), S, D, b.qkv_mlp, nullptr, P.data(), pool);
    qk_norm_rope(P.data(), ldp, S, T, H, hd, D, QkNorm{b.norm_q.data(), b.norm_k.data(), b.norm_q.data(), b.norm_k.data()},
                 eps, rcos.data(), rsin.data(), pool);
    // cat rows: [attention (D) | SiLU(gate) * up (F)], the input of the fused to_out.
    kernels::attention(P.data(), P.data() + D, P.data() + 2 * D, cat.data(), S, S, Hi, Hi, hdi, attn_scale, no_mask,
                       pool, ldp, ldp, ldp, ldcat);
    swiglu(P.data() + 3 * D, ldp, cat.data() + D, ldcat, S, F, pool);
    kernels::linear(cat.data(), S, D + F, b.to_out, nullptr, o.data(), pool);
    ctx.dump(name + ".attn", o.data(), {1, S, D});
    gated_residual(h.data(), o.data(), S, D, single_gate, pool);
    ctx.dump(name, h.data(), {1, S, D});
  }

  // ---- 7. output: AdaLayerNormContinuous on the image rows (scale first, then shift), proj_out.
  float* nimg = nrm.data() + T * D;
  modulated_layer_norm(himg, nimg, N, D, eps, out_onep.data(), out_shift, pool);
  ctx.dump("dit.norm_out", nimg, {1, N, D});
  Tensor out({N, Cout});
  kernels::linear(nimg, N, D, proj_out_, nullptr, out.data(), pool);
  ctx.dump("dit.output", out.data(), {1, N, Cout});
  if (!all_finite(out.data(), out.numel()))
    return internal_error("transformer produced non-finite values (corrupt weights or overflow)");
  return out;
}

}  // namespace klein
