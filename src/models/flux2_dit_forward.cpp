// FLUX.2 transformer forward pass (see flux2_dit.h), written in the Backend's named ops only and
// split per block; config, loading and the pure helpers are in flux2_dit.cpp.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/buffer_pool.h"
#include "backend/transfer.h"
#include "models/bind.h"
#include "models/flux2_dit.h"

namespace klein {

namespace {

bool ids_in_range(const Flux2Ids& ids) {
  for (const auto& a : ids)
    for (int64_t v : a)
      if (v < -(int64_t{1} << 24) || v > (int64_t{1} << 24)) return false;
  return true;
}

// The modulation of one stream of a double block. Chunk k of a modulation vector is
// [k·D, (k+1)·D): shift, scale, gate (attention), shift, scale, gate (MLP); `onep_*` = 1 + scale,
// computed once per step as diffusers does (`1 + scale` is its own op).
// Token rows per MLP chunk: large enough for the GEMM kernels' blocking to stay efficient.
constexpr int64_t kRowChunk = 1024;

}  // namespace

struct Flux2Transformer::Step {
  // A nested type, not one in the anonymous namespace: Step has external linkage.
  struct StreamMod {
    TensorView shift_msa, gate_msa, shift_mlp, gate_mlp;
    Tensor onep_msa, onep_mlp;
  };
  int64_t T = 0, N = 0, S = 0;   // text, image and all tokens of this call
  int64_t n_out = 0;             // image tokens whose output is returned (≤ N), from row out0 of h
  int64_t out0 = 0;              // T, or T + R in a KV extract call
  // The KV-cached variant (Flux2KvStep). Extract: the first R image rows, h rows [T, T+R), are
  // references (own modulation, attending to themselves only), their keys and values stored per
  // block. Cached: the qkv buffer has C more rows on top, the cached references' keys and values,
  // so that one attention call sees [references, text, image] keys (a permutation of diffusers'
  // [text, references, image]: the same softmax, summed in another order).
  int64_t R = 0, C = 0;
  Flux2KvCache* cache = nullptr;
  StreamMod mr;                  // extract: the references' double-block image modulation
  TensorView ref_single_shift, ref_single_gate;
  Tensor ref_single_onep;
  Tensor h;                      // [S, D] residual stream, text rows first
  StreamMod mi, mt;              // double-block modulations (image, text)
  TensorView single_shift, single_gate;
  Tensor single_onep;
  TensorView rcos, rsin;         // [S, head_dim]: the given tables or `own_rope`'s
  Flux2Rope own_rope;
  // Work buffers: nrm, att, o [S, D]; qkv [S, 3D]. The MLPs run on chunks of at most kRowChunk
  // token rows (u [R, 2F], cat [R, D+F]), so their wide hidden activations never exist for all
  // S tokens at once (at 1024² that is 0.7 GiB less; more at larger sizes).
  Tensor nrm, qkv, att, o, u, cat;
  TensorView htxt() const { return h.view().row_range(0, T); }
  TensorView himg() const { return h.view().row_range(T, S); }
  // This call's tokens' Q, K, V [S, 3D] (below the cached references' rows).
  TensorView qkv_rows() const { return qkv.view().row_range(C, C + S); }

  // Rows [r0, r1) of h split where the modulation changes: text, references, image (a KV extract
  // call's references have their own; elsewhere one segment).
  struct Segment {
    int64_t a, b;
    bool ref;
  };
  std::vector<Segment> segments(int64_t r0, int64_t r1) const {
    std::vector<Segment> out;
    auto add = [&](int64_t a, int64_t b, bool ref) {
      a = std::max(a, r0), b = std::min(b, r1);
      if (a < b) out.push_back({a, b, ref});
    };
    if (R == 0) add(0, S, false);
    else add(0, T, false), add(T, T + R, true), add(T + R, S, false);
    return out;
  }

  // Attention of this call's query rows [r0, r1) into att rows [r0, r1), with every block's
  // K and V (after RoPE) in the qkv buffer. A KV extract call's reference queries attend to the
  // reference keys only (diffusers' _flux2_kv_causal_attention); everything else to all keys.
  Status attend(Backend& be, int64_t r0, int64_t r1, int H, int64_t D, float scale) const {
    const TensorView all = qkv.view(), a = att.view();
    const TensorView k = all.col_range(D, 2 * D), v = all.col_range(2 * D, 3 * D);
    auto q = [&](int64_t x, int64_t y) { return all.row_range(C + x, C + y).col_range(0, D); };
    for (const Segment& g : segments(r0, r1)) {
      const TensorView kk = g.ref ? k.row_range(T, T + R) : k, vv = g.ref ? v.row_range(T, T + R) : v;
      KLEIN_RETURN_IF_ERROR(be.attention(q(g.a, g.b), kk, vv, a.row_range(g.a, g.b), H, H, scale, AttnMask{}));
    }
    return Status::Ok();
  }

  // Block `layer`'s reference keys and values: stored after RoPE (extract), or put back on top of
  // the qkv buffer (cached).
  Status kv_cache_io(Backend& be, size_t layer, int64_t D) {
    if (!cache) return Status::Ok();
    const TensorView kv_cols = qkv.view().col_range(D, 3 * D), stored = cache->layers[layer].view();
    if (R > 0) {
      const TensorView refs = kv_cols.row_range(C + T, C + T + R);
      return cache->bf16 ? be.pack_bf16(refs, stored) : be.copy(refs, stored);
    }
    return cache->bf16 ? be.unpack_bf16(stored, kv_cols.row_range(0, C)) : be.copy(stored, kv_cols.row_range(0, C));
  }
};

Status Flux2Transformer::time_embedding(float t1000, std::optional<float> g1000, const TensorView& temb,
                                        const RunContext& ctx) const {
  Backend& be = ctx.be();
  const int64_t D = cfg_.inner_dim(), C = cfg_.timestep_guidance_channels;
  KLEIN_ASSIGN_OR_RETURN(Tensor hidden, be.alloc({1, D}, "the time embedding"));
  auto embed = [&](float v, const Weight& l1, const Weight& l2, const TensorView& out) -> Status {
    const std::vector<float> proj = flux2_timestep_sinusoid(v, C);
    KLEIN_ASSIGN_OR_RETURN(Tensor p, be.upload(proj.data(), {1, C}, "the timestep sinusoid"));
    KLEIN_RETURN_IF_ERROR(be.linear(p, l1, nullptr, hidden));
    KLEIN_RETURN_IF_ERROR(be.silu(hidden));
    return be.linear(hidden, l2, nullptr, out);
  };
  KLEIN_RETURN_IF_ERROR(embed(t1000, t_lin1_, t_lin2_, temb));
  if (g1000 && cfg_.guidance_embeds) {
    KLEIN_ASSIGN_OR_RETURN(Tensor g, be.alloc({1, D}, "the guidance embedding"));
    KLEIN_RETURN_IF_ERROR(embed(*g1000, g_lin1_, g_lin2_, g));
    KLEIN_RETURN_IF_ERROR(be.add(temb, g));
  }
  return Status::Ok();
}

Status Flux2Transformer::double_block(size_t bi, Step& st, const RunContext& ctx) const {
  Backend& be = ctx.be();
  const Flux2Config& c = cfg_;
  const int64_t D = c.inner_dim(), F = c.mlp_hidden_dim(), hd = c.attention_head_dim, T = st.T, S = st.S;
  const int H = static_cast<int>(c.num_attention_heads);
  const float eps = static_cast<float>(c.eps);
  const DoubleBlock& b = double_[bi];
  const std::string pfx = "dit.double" + std::to_string(bi) + ".";
  const TensorView htxt = st.htxt(), himg = st.himg();
  const TensorView ntxt = st.nrm.view().row_range(0, T), nimg = st.nrm.view().row_range(T, S);
  auto norm = [&](const std::vector<float>& w) { return be.upload(w.data(), {hd}, "a q/k norm weight"); };
  KLEIN_ASSIGN_OR_RETURN(Tensor nq_txt, norm(b.norm_added_q));
  KLEIN_ASSIGN_OR_RETURN(Tensor nk_txt, norm(b.norm_added_k));
  KLEIN_ASSIGN_OR_RETURN(Tensor nq_img, norm(b.norm_q));
  KLEIN_ASSIGN_OR_RETURN(Tensor nk_img, norm(b.norm_k));

  // The image stream's modulation per row: a KV extract call's reference rows (the first R) have
  // their own.
  const int64_t R = st.R, N = st.N;
  auto img_norm = [&](bool mlp) -> Status {
    auto one = [&](const Step::StreamMod& m, int64_t a, int64_t e) {
      return be.modulated_layer_norm(himg.row_range(a, e), nimg.row_range(a, e), mlp ? m.onep_mlp : m.onep_msa,
                                     mlp ? m.shift_mlp : m.shift_msa, eps);
    };
    if (R > 0) KLEIN_RETURN_IF_ERROR(one(st.mr, 0, R));
    return one(st.mi, R, N);
  };
  auto img_gated_add = [&](const TensorView& oimg, bool mlp) -> Status {
    auto one = [&](const Step::StreamMod& m, int64_t a, int64_t e) {
      return be.gated_add(himg.row_range(a, e), oimg.row_range(a, e), mlp ? m.gate_mlp : m.gate_msa);
    };
    if (R > 0) KLEIN_RETURN_IF_ERROR(one(st.mr, 0, R));
    return one(st.mi, R, N);
  };

  // Attention: QKV [S, 3D], text rows first.
  const TensorView qkv = st.qkv_rows();
  const TensorView q = qkv.col_range(0, D), k = qkv.col_range(D, 2 * D), v = qkv.col_range(2 * D, 3 * D);
  KLEIN_RETURN_IF_ERROR(be.modulated_layer_norm(htxt, ntxt, st.mt.onep_msa, st.mt.shift_msa, eps));
  KLEIN_RETURN_IF_ERROR(img_norm(false));
  KLEIN_RETURN_IF_ERROR(be.linear(ntxt, b.add_q, nullptr, q.row_range(0, T)));
  KLEIN_RETURN_IF_ERROR(be.linear(ntxt, b.add_k, nullptr, k.row_range(0, T)));
  KLEIN_RETURN_IF_ERROR(be.linear(ntxt, b.add_v, nullptr, v.row_range(0, T)));
  KLEIN_RETURN_IF_ERROR(be.linear(nimg, b.to_q, nullptr, q.row_range(T, S)));
  KLEIN_RETURN_IF_ERROR(be.linear(nimg, b.to_k, nullptr, k.row_range(T, S)));
  KLEIN_RETURN_IF_ERROR(be.linear(nimg, b.to_v, nullptr, v.row_range(T, S)));
  const TensorView cos_t = st.rcos.row_range(0, T), sin_t = st.rsin.row_range(0, T);
  const TensorView cos_i = st.rcos.row_range(T, S), sin_i = st.rsin.row_range(T, S);
  KLEIN_RETURN_IF_ERROR(be.qk_norm_rope(q.row_range(0, T), H, nq_txt, eps, cos_t, sin_t));
  KLEIN_RETURN_IF_ERROR(be.qk_norm_rope(k.row_range(0, T), H, nk_txt, eps, cos_t, sin_t));
  KLEIN_RETURN_IF_ERROR(be.qk_norm_rope(q.row_range(T, S), H, nq_img, eps, cos_i, sin_i));
  KLEIN_RETURN_IF_ERROR(be.qk_norm_rope(k.row_range(T, S), H, nk_img, eps, cos_i, sin_i));
  const TensorView att = st.att.view();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  KLEIN_RETURN_IF_ERROR(st.kv_cache_io(be, bi, D));
  KLEIN_RETURN_IF_ERROR(st.attend(be, 0, S, H, D, scale));
  const TensorView otxt = st.o.view().row_range(0, T), oimg = st.o.view().row_range(T, S);
  KLEIN_RETURN_IF_ERROR(be.linear(att.row_range(0, T), b.to_add_out, nullptr, otxt));
  KLEIN_RETURN_IF_ERROR(be.linear(att.row_range(T, S), b.to_out, nullptr, oimg));
  ctx.dump(pfx + "attn_img", oimg, {1, st.N, D});
  ctx.dump(pfx + "attn_txt", otxt, {1, T, D});
  KLEIN_RETURN_IF_ERROR(be.gated_add(htxt, otxt, st.mt.gate_msa));
  KLEIN_RETURN_IF_ERROR(img_gated_add(oimg, false));

  // Feed-forward (SwiGLU) per chunk of rows, text and image rows apart (their own weights):
  // hidden u [R, 2F] (gate | up; not written where the linear fuses the SwiGLU, and then never
  // resident: host tensors are calloc'ed), activation [R, F] in cat.
  KLEIN_RETURN_IF_ERROR(be.modulated_layer_norm(htxt, ntxt, st.mt.onep_mlp, st.mt.shift_mlp, eps));
  KLEIN_RETURN_IF_ERROR(img_norm(true));
  auto ff = [&](int64_t r0, int64_t r1, const Weight& w_in, const Weight& w_out) -> Status {
    for (int64_t a = r0; a < r1; a += kRowChunk) {
      const int64_t b2 = std::min(r1, a + kRowChunk), R = b2 - a;
      const TensorView u = st.u.view().row_range(0, R), act = st.cat.view().row_range(0, R).col_range(0, F);
      KLEIN_RETURN_IF_ERROR(be.linear_swiglu(st.nrm.view().row_range(a, b2), w_in, nullptr, u, act));
      KLEIN_RETURN_IF_ERROR(be.linear(act, w_out, nullptr, st.o.view().row_range(a, b2)));
    }
    return Status::Ok();
  };
  KLEIN_RETURN_IF_ERROR(ff(0, T, b.ffc_in, b.ffc_out));
  KLEIN_RETURN_IF_ERROR(ff(T, S, b.ff_in, b.ff_out));
  KLEIN_RETURN_IF_ERROR(be.gated_add(htxt, otxt, st.mt.gate_mlp));
  KLEIN_RETURN_IF_ERROR(img_gated_add(oimg, true));
  ctx.dump(pfx + "img", himg, {1, st.N, D});
  ctx.dump(pfx + "txt", htxt, {1, T, D});
  return Status::Ok();
}

Status Flux2Transformer::single_block(size_t bi, Step& st, const RunContext& ctx) const {
  Backend& be = ctx.be();
  const Flux2Config& c = cfg_;
  const int64_t D = c.inner_dim(), F = c.mlp_hidden_dim(), hd = c.attention_head_dim, S = st.S;
  const int H = static_cast<int>(c.num_attention_heads);
  const float eps = static_cast<float>(c.eps);
  const SingleBlock& b = single_[bi];
  const std::string name = "dit.single" + std::to_string(bi);
  // Rows [r0, r1) get the whole block. After the last block only the n_out leading image rows
  // are read (by norm_out), so there the text rows and any other image rows (an edit's reference
  // tokens) serve only as keys and values: their Q, attention output, MLP and to_out are skipped.
  // Each remaining row's arithmetic is unchanged (every op is row-wise but attention, whose keys
  // and values are all still there). At 256² the 512 text rows' part of this block is ~2 % of a
  // step's work. A dump of this block's full rows keeps the whole block.
  const bool trim = bi + 1 == single_.size() && !ctx.wants_dump(name) && !ctx.wants_dump(name + ".attn");
  const int64_t r0 = trim ? st.out0 : 0, r1 = trim ? st.out0 + st.n_out : S;
  KLEIN_ASSIGN_OR_RETURN(Tensor nq, be.upload(b.norm_q.data(), {hd}, "a q norm weight"));
  KLEIN_ASSIGN_OR_RETURN(Tensor nk, be.upload(b.norm_k.data(), {hd}, "a k norm weight"));
  for (const Step::Segment& g : st.segments(0, S))
    KLEIN_RETURN_IF_ERROR(be.modulated_layer_norm(st.h.view().row_range(g.a, g.b), st.nrm.view().row_range(g.a, g.b),
                                                  g.ref ? st.ref_single_onep : st.single_onep,
                                                  g.ref ? st.ref_single_shift : st.single_shift, eps));
  // The fused projection's rows are [Q | K | V | gate | up]: Q, K, V for all tokens first
  // (attention needs them all), then gate/up and to_out per chunk of rows.
  KLEIN_ASSIGN_OR_RETURN(const Weight w_qkv, b.qkv_mlp.row_range(0, 3 * D));
  KLEIN_ASSIGN_OR_RETURN(const Weight w_mlp, b.qkv_mlp.row_range(3 * D, 3 * D + 2 * F));
  const TensorView qkv = st.qkv_rows(), nrm = st.nrm.view();
  const TensorView q = qkv.col_range(0, D), k = qkv.col_range(D, 2 * D);
  KLEIN_RETURN_IF_ERROR(be.linear(nrm.row_range(r0, r1), w_qkv, nullptr, qkv.row_range(r0, r1)));
  if (trim) {  // K and V alone for the rows before and after
    KLEIN_ASSIGN_OR_RETURN(const Weight w_kv, b.qkv_mlp.row_range(D, 3 * D));
    for (auto [a, e] : {std::pair{int64_t{0}, r0}, std::pair{r1, S}})
      if (e > a)
        KLEIN_RETURN_IF_ERROR(be.linear(nrm.row_range(a, e), w_kv, nullptr, qkv.row_range(a, e).col_range(D, 3 * D)));
  }
  const TensorView cos = st.rcos, sin = st.rsin;
  KLEIN_RETURN_IF_ERROR(be.qk_norm_rope(q.row_range(r0, r1), H, nq, eps, cos.row_range(r0, r1), sin.row_range(r0, r1)));
  KLEIN_RETURN_IF_ERROR(be.qk_norm_rope(k, H, nk, eps, cos, sin));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const TensorView att = st.att.view();
  KLEIN_RETURN_IF_ERROR(st.kv_cache_io(be, double_.size() + bi, D));
  KLEIN_RETURN_IF_ERROR(st.attend(be, r0, r1, H, D, scale));
  // cat rows: [attention (D) | SiLU(gate) * up (F)], the input of the fused to_out.
  for (int64_t a = r0; a < r1; a += kRowChunk) {
    const int64_t b2 = std::min(r1, a + kRowChunk), R = b2 - a;
    const TensorView u = st.u.view().row_range(0, R), cat = st.cat.view().row_range(0, R);
    KLEIN_RETURN_IF_ERROR(be.copy(att.row_range(a, b2), cat.col_range(0, D)));
    KLEIN_RETURN_IF_ERROR(be.linear_swiglu(nrm.row_range(a, b2), w_mlp, nullptr, u, cat.col_range(D, D + F)));
    KLEIN_RETURN_IF_ERROR(be.linear(cat, b.to_out, nullptr, st.o.view().row_range(a, b2)));
  }
  ctx.dump(name + ".attn", st.o, {1, S, D});
  for (const Step::Segment& g : st.segments(r0, r1))
    KLEIN_RETURN_IF_ERROR(be.gated_add(st.h.view().row_range(g.a, g.b), st.o.view().row_range(g.a, g.b),
                                       g.ref ? st.ref_single_gate : st.single_gate));
  ctx.dump(name, st.h, {1, S, D});
  return Status::Ok();
}

Result<Flux2Rope> Flux2Transformer::rope(const Flux2Ids& img_ids, const Flux2Ids& txt_ids, Backend& be) const {
  const int64_t T = static_cast<int64_t>(txt_ids.size()), N = static_cast<int64_t>(img_ids.size()), S = T + N;
  const int64_t hd = cfg_.attention_head_dim;
  // Host math (float64 angles, as Flux2PosEmbed), then on the device.
  Tensor rcos({S, hd}), rsin({S, hd});
  flux2_rope_tables(txt_ids, cfg_.axes_dims_rope, cfg_.rope_theta, rcos.data(), rsin.data());
  flux2_rope_tables(img_ids, cfg_.axes_dims_rope, cfg_.rope_theta, rcos.data() + T * hd, rsin.data() + T * hd);
  Flux2Rope r;
  r.text_tokens = T;
  r.image_tokens = N;
  KLEIN_ASSIGN_OR_RETURN(r.cos, be.upload(rcos.data(), {S, hd}, "RoPE tables"));
  KLEIN_ASSIGN_OR_RETURN(r.sin, be.upload(rsin.data(), {S, hd}, "RoPE tables"));
  return r;
}

Result<Tensor> Flux2Transformer::forward(const Tensor& img, const Tensor& txt, float timestep,
                                         const Flux2Ids& img_ids, const Flux2Ids& txt_ids, const RunContext& ctx,
                                         std::optional<float> guidance, int64_t out_tokens, BufferPool* work,
                                         const Flux2Rope* rope, const Flux2KvStep* kv) const {
  const Flux2Config& c = cfg_;
  const int64_t D = c.inner_dim(), F = c.mlp_hidden_dim();
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
  // A KV call: its references (extract: the first R image tokens) or its cache (cached).
  const int64_t blocks = static_cast<int64_t>(double_.size() + single_.size());
  int64_t R = 0, C = 0;
  if (kv) {
    if (!kv->cache) return invalid_argument("transformer: a KV call without a cache");
    if (kv->mode == Flux2KvStep::Mode::kExtract) {
      R = kv->ref_tokens;
      if (R <= 0 || R >= N)
        return invalid_argument("transformer: KV extract with " + std::to_string(R) + " reference tokens of " +
                                std::to_string(N) + " image tokens (references first, then at least one noise token)");
      if (!std::isfinite(kv->ref_timestep)) return invalid_argument("transformer: reference timestep is not finite");
    } else {
      const Flux2KvCache& cc = *kv->cache;
      if (!cc.filled() || static_cast<int64_t>(cc.layers.size()) != blocks)
        return invalid_argument("transformer: KV cached call without a filled cache of " + std::to_string(blocks) +
                                " blocks");
      const int64_t width = cc.bf16 ? D : 2 * D;
      for (const Tensor& t : cc.layers)
        if (t.ndim() != 2 || t.dim(0) != cc.ref_tokens || t.dim(1) != width)
          return invalid_argument("transformer: a KV cache layer has shape " + shape_str(t.shape()) + ", expected [" +
                                  std::to_string(cc.ref_tokens) + ", " + std::to_string(width) + "]");
      C = cc.ref_tokens;
    }
  }
  if (out_tokens == 0 || out_tokens > N - R)
    return invalid_argument("transformer: " + std::to_string(out_tokens) + " output tokens asked of " +
                            std::to_string(N - R) + " image tokens");
  if (!std::isfinite(timestep)) return invalid_argument("transformer: timestep is not finite");
  if (guidance && !std::isfinite(*guidance)) return invalid_argument("transformer: guidance is not finite");
  if (!ctx.backend) return invalid_argument("transformer: RunContext without a backend");
  Backend& be = ctx.be();
  // Inputs from the host are uploaded once here (the pipeline passes them on the device already).
  Tensor img_up, txt_up;
  KLEIN_ASSIGN_OR_RETURN(const Tensor* img_d, on_device(be, img, img_up, "the image tokens"));
  KLEIN_ASSIGN_OR_RETURN(const Tensor* txt_d, on_device(be, txt, txt_up, "the text embeddings"));
  {
    KLEIN_ASSIGN_OR_RETURN(bool fi, be.all_finite(*img_d));
    KLEIN_ASSIGN_OR_RETURN(bool ft, be.all_finite(*txt_d));
    if (!fi) return invalid_argument("transformer: image tokens contain NaN/Inf");
    if (!ft) return invalid_argument("transformer: text embeddings contain NaN/Inf");
  }
  const TensorView img_m = img_d->view().reshaped({N, Cin}), txt_m = txt_d->view().reshaped({T, J});
  Step st;
  st.T = T, st.N = N, st.S = T + N;
  st.R = R, st.C = C;
  st.out0 = T + R;
  st.n_out = out_tokens < 0 ? N - R : out_tokens;
  const int64_t S = st.S;

  // ---- 1. timestep embedding: timestep.to(dtype) * 1000 in float32, as the model does.
  KLEIN_ASSIGN_OR_RETURN(Tensor temb, be.alloc({1, D}, "the time embedding"));
  std::optional<float> g1000;
  if (guidance) g1000 = *guidance * 1000.0f;
  KLEIN_RETURN_IF_ERROR(time_embedding(timestep * 1000.0f, g1000, temb, ctx));
  ctx.dump("dit.temb", temb);

  // ---- 2. shared modulations from SiLU(temb).
  KLEIN_RETURN_IF_ERROR(be.silu(temb));  // temb is not needed unactivated any more
  KLEIN_ASSIGN_OR_RETURN(Tensor mod_img, be.alloc({1, 6 * D}, "modulations"));
  KLEIN_ASSIGN_OR_RETURN(Tensor mod_txt, be.alloc({1, 6 * D}, "modulations"));
  KLEIN_ASSIGN_OR_RETURN(Tensor mod_single, be.alloc({1, 3 * D}, "modulations"));
  KLEIN_ASSIGN_OR_RETURN(Tensor mod_out, be.alloc({1, 2 * D}, "modulations"));
  KLEIN_RETURN_IF_ERROR(be.linear(temb, mod_img_, nullptr, mod_img));
  KLEIN_RETURN_IF_ERROR(be.linear(temb, mod_txt_, nullptr, mod_txt));
  KLEIN_RETURN_IF_ERROR(be.linear(temb, mod_single_, nullptr, mod_single));
  KLEIN_RETURN_IF_ERROR(be.linear(temb, norm_out_, nullptr, mod_out));
  ctx.dump("dit.mod_img", mod_img);
  ctx.dump("dit.mod_txt", mod_txt);
  ctx.dump("dit.mod_single", mod_single);
  auto chunk = [D](const Tensor& m, int64_t k) { return m.view().col_range(k * D, (k + 1) * D); };
  auto one_plus = [&](const Tensor& m, int64_t k) -> Result<Tensor> {
    KLEIN_ASSIGN_OR_RETURN(Tensor r, be.alloc({1, D}, "modulations"));
    KLEIN_RETURN_IF_ERROR(be.add_scalar(chunk(m, k), 1.0f, r));
    return r;
  };
  auto stream_mod = [&](const Tensor& m, Step::StreamMod& s) -> Status {
    s.shift_msa = chunk(m, 0), s.gate_msa = chunk(m, 2), s.shift_mlp = chunk(m, 3), s.gate_mlp = chunk(m, 5);
    KLEIN_ASSIGN_OR_RETURN(s.onep_msa, one_plus(m, 1));
    KLEIN_ASSIGN_OR_RETURN(s.onep_mlp, one_plus(m, 4));
    return Status::Ok();
  };
  KLEIN_RETURN_IF_ERROR(stream_mod(mod_img, st.mi));
  KLEIN_RETURN_IF_ERROR(stream_mod(mod_txt, st.mt));
  st.single_shift = chunk(mod_single, 0);
  st.single_gate = chunk(mod_single, 2);
  KLEIN_ASSIGN_OR_RETURN(st.single_onep, one_plus(mod_single, 1));

  // ---- 2b. a KV extract call: the references' modulations, from the embedding of their fixed
  // timestep (diffusers: time_guidance_embed(ref_fixed_timestep * 1000, guidance); the text stream
  // keeps the step's), and the cache's layers.
  Tensor ref_mod_img, ref_mod_single;
  if (R > 0) {
    KLEIN_ASSIGN_OR_RETURN(Tensor ref_temb, be.alloc({1, D}, "the references' time embedding"));
    KLEIN_RETURN_IF_ERROR(time_embedding(kv->ref_timestep * 1000.0f, g1000, ref_temb, ctx));
    KLEIN_RETURN_IF_ERROR(be.silu(ref_temb));
    KLEIN_ASSIGN_OR_RETURN(ref_mod_img, be.alloc({1, 6 * D}, "modulations"));
    KLEIN_ASSIGN_OR_RETURN(ref_mod_single, be.alloc({1, 3 * D}, "modulations"));
    KLEIN_RETURN_IF_ERROR(be.linear(ref_temb, mod_img_, nullptr, ref_mod_img));
    KLEIN_RETURN_IF_ERROR(be.linear(ref_temb, mod_single_, nullptr, ref_mod_single));
    KLEIN_RETURN_IF_ERROR(stream_mod(ref_mod_img, st.mr));
    st.ref_single_shift = chunk(ref_mod_single, 0);
    st.ref_single_gate = chunk(ref_mod_single, 2);
    KLEIN_ASSIGN_OR_RETURN(st.ref_single_onep, one_plus(ref_mod_single, 1));
    Flux2KvCache& cache = *kv->cache;
    cache.layers.clear();
    cache.ref_tokens = 0;
    cache.bf16 = kv->bf16;
    for (int64_t b = 0; b < blocks; ++b) {
      KLEIN_ASSIGN_OR_RETURN(Tensor layer, be.alloc({R, kv->bf16 ? D : 2 * D}, "the reference KV cache"));
      cache.layers.push_back(std::move(layer));
    }  // ref_tokens is set when the call succeeds: a failed extract leaves no usable cache
  }
  if (kv) st.cache = kv->cache;
  KLEIN_ASSIGN_OR_RETURN(Tensor out_onep, one_plus(mod_out, 0));  // norm_out: scale first, then shift
  const TensorView out_shift = chunk(mod_out, 1);

  // ---- 3. input projections into the residual stream (text rows first).
  // The residual stream and the work buffers: from `work` when given. Every value of h is
  // written (the two input projections) before it is read, and the blocks write each work
  // buffer's rows before they read them, so a recycled buffer's old values never show.
  auto buffer = [&](const Shape& shape, const std::string& what) { return BufferPool::take_from(work, be, shape, what); };
  KLEIN_ASSIGN_OR_RETURN(st.h, buffer({S, D}, "the transformer's residual stream"));
  KLEIN_RETURN_IF_ERROR(be.linear(txt_m, context_embedder_, nullptr, st.htxt()));
  KLEIN_RETURN_IF_ERROR(be.linear(img_m, x_embedder_, nullptr, st.himg()));
  ctx.dump("dit.x_embedder", st.himg(), {1, N, D});
  ctx.dump("dit.context_embedder", st.htxt(), {1, T, D});

  // ---- 4. RoPE tables for [text; image] tokens: the caller's (made once per request by
  // rope(), for these ids) or made here.
  if (rope) {
    if (rope->text_tokens != T || rope->image_tokens != N)
      return invalid_argument("transformer: RoPE tables for " + std::to_string(rope->text_tokens) + " + " +
                              std::to_string(rope->image_tokens) + " tokens given for " + std::to_string(T) + " + " +
                              std::to_string(N));
  } else {
    KLEIN_ASSIGN_OR_RETURN(st.own_rope, this->rope(img_ids, txt_ids, be));
    rope = &st.own_rope;
  }
  st.rcos = rope->cos.view();
  st.rsin = rope->sin.view();
  ctx.dump("dit.rope_cos", st.rcos);
  ctx.dump("dit.rope_sin", st.rsin);

  // ---- work buffers, shared by all blocks
  KLEIN_ASSIGN_OR_RETURN(st.nrm, buffer({S, D}, "transformer activations"));
  KLEIN_ASSIGN_OR_RETURN(st.qkv, buffer({C + S, 3 * D}, "transformer activations"));
  KLEIN_ASSIGN_OR_RETURN(st.att, buffer({S, D}, "transformer activations"));
  KLEIN_ASSIGN_OR_RETURN(st.u, buffer({std::min(S, kRowChunk), 2 * F}, "transformer activations"));
  KLEIN_ASSIGN_OR_RETURN(st.cat, buffer({std::min(S, kRowChunk), D + F}, "transformer activations"));
  KLEIN_ASSIGN_OR_RETURN(st.o, buffer({S, D}, "transformer activations"));

  // ---- 5./6. double-stream blocks, then single-stream blocks on h = [text; image]
  for (size_t bi = 0; bi < double_.size(); ++bi) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("the transformer"));
    ctx.enter_block(static_cast<int>(bi));
    KLEIN_RETURN_IF_ERROR(double_block(bi, st, ctx));
  }
  for (size_t bi = 0; bi < single_.size(); ++bi) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("the transformer"));
    ctx.enter_block(static_cast<int>(double_.size() + bi));
    KLEIN_RETURN_IF_ERROR(single_block(bi, st, ctx));
  }

  // ---- 7. output: AdaLayerNormContinuous on the n_out leading image rows after any references
  // (scale first, then shift), proj_out.
  const int64_t n_out = st.n_out, o0 = st.out0;
  const TensorView hout = st.h.view().row_range(o0, o0 + n_out), nout = st.nrm.view().row_range(o0, o0 + n_out);
  KLEIN_RETURN_IF_ERROR(be.modulated_layer_norm(hout, nout, out_onep, out_shift, static_cast<float>(c.eps)));
  ctx.dump("dit.norm_out", nout, {1, n_out, D});
  KLEIN_ASSIGN_OR_RETURN(Tensor out, be.alloc({n_out, Cout}, "the transformer output"));
  KLEIN_RETURN_IF_ERROR(be.linear(nout, proj_out_, nullptr, out));
  ctx.dump("dit.output", out, {1, n_out, Cout});
  KLEIN_ASSIGN_OR_RETURN(bool finite, be.all_finite(out));
  if (!finite) return non_finite_weight_status(*source_, "transformer");
  if (R > 0) kv->cache->ref_tokens = R;
  return out;
}

}  // namespace klein
