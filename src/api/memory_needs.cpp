#include "api/memory_needs.h"

#include <algorithm>
#include <cstdio>
#include <unistd.h>

#include "api/components.h"
#include "kernels/scratch.h"

namespace klein::api {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kF = sizeof(float);

bool plain(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

template <class M>
BlockedWeights blocks_of(const M& m, uint64_t all) {
  BlockedWeights b;
  uint64_t in_blocks = 0;
  for (int i = 0; i < m.num_blocks(); ++i) {
    uint64_t n = 0;
    m.for_each_block_weight(i, [&](const Weight& w) { n += w.nbytes; });
    in_blocks += n;
    b.largest_block = std::max(b.largest_block, n);
  }
  b.total = all;
  b.outside = all - std::min(all, in_blocks);
  return b;
}

}  // namespace

BlockedWeights blocked_weights(Flux2Transformer& m) {
  uint64_t all = 0;
  (void)m.for_each_weight([&](Weight& w) { all += w.nbytes; return Status::Ok(); });
  return blocks_of(m, all);
}

BlockedWeights blocked_weights(Qwen3Encoder& m, uint64_t* embed_row, uint64_t* embed_total) {
  uint64_t all = 0;
  *embed_row = *embed_total = 0;
  (void)m.for_each_weight([&](Weight& w) {
    // The embedding table is gathered, not read whole: it is accounted per prompt row.
    if (w.shape.size() == 2 && w.shape[0] == m.config().vocab_size && *embed_total == 0) {
      *embed_total = w.nbytes;
      *embed_row = w.shape[0] ? w.nbytes / static_cast<uint64_t>(w.shape[0]) : 0;
      return Status::Ok();
    }
    all += w.nbytes;
    return Status::Ok();
  });
  return blocks_of(m, all);
}

namespace {
// A LoRA's resident bytes, added to the weights outside the blocks.
template <class M>
Status add_lora_bytes(const M& m, const LoraSetup& loras, BlockedWeights* w) {
  if (loras.files.empty()) return Status::Ok();
  KLEIN_ASSIGN_OR_RETURN(auto uses, read_loras(m, loras));
  const uint64_t b = lora_memory(m, uses, lora_apply_mode(loras.mode), loras.merge_to_f32);
  w->outside += b;
  w->total += b;
  return Status::Ok();
}
}  // namespace

Result<WeightSizes> measure_weights(const ComponentSpec& te_spec, int te_layers, const ComponentSpec& dit_spec,
                                    const ComponentSpec& vae_spec, const LoraSetup& loras) {
  WeightSizes s;
  auto note_format = [&](Weight& w) {
    // Every GEMM reads f32 / bf16 / f16 rows in place (converting per K slice while packing);
    // the AMX GEMMs' aligned slab copies are counted whatever the format (kernels/scratch.cpp).
    if (!w.empty() && !plain(w.dtype)) s.converts = true;
    return Status::Ok();
  };
  {
    KLEIN_ASSIGN_OR_RETURN(auto te, bind_text_encoder(te_spec, te_layers));
    s.te = blocked_weights(te, &s.te_embed_row, &s.te_embed_total);
    KLEIN_RETURN_IF_ERROR(te.for_each_weight(note_format));
    KLEIN_RETURN_IF_ERROR(add_lora_bytes(te, loras, &s.te));
  }
  {
    KLEIN_ASSIGN_OR_RETURN(auto dit, bind_transformer(dit_spec));
    s.dit = blocked_weights(dit);
    KLEIN_RETURN_IF_ERROR(dit.for_each_weight(note_format));
    KLEIN_RETURN_IF_ERROR(add_lora_bytes(dit, loras, &s.dit));
  }
  KLEIN_ASSIGN_OR_RETURN(auto vae, bind_vae(vae_spec));
  KLEIN_RETURN_IF_ERROR(vae.for_each_weight([&](Weight& w) {
    s.vae += w.nbytes;
    return Status::Ok();
  }));
  return s;
}

MemoryNeeds estimate_needs(const WeightSizes& w, const Qwen3Config& te, const Flux2Config& dit,
                           const Flux2VaeConfig& vae, const RequestShape& r) {
  MemoryNeeds n;
  const uint64_t L = static_cast<uint64_t>(r.text_tokens);
  // Text encoder: the prompt's embedding rows (each may straddle a page) plus the layers.
  n.te = w.te;
  const uint64_t embed = std::min(w.te_embed_total, L * (w.te_embed_row + kPage));
  n.te.outside += embed;
  n.te.total += embed;
  const uint64_t H = te.hidden_size, Dq = te.num_heads * te.head_dim, Dkv = te.num_kv_heads * te.head_dim,
                 I = te.intermediate_size;
  // x, h, tmp [L, H]; q, att [L, Dq]; k, v [L, Dkv]; gate | up [L, 2I] and SiLU(gate) · up [L, I]
  // (with a fused SwiGLU the [L, 2I] is never touched: an upper bound); RoPE; the 3-tap output.
  n.te_activations = L * (3 * H + 2 * Dq + 2 * Dkv + 3 * I + te.head_dim + 3 * H) * kF;

  // Transformer: S = text + image (+ reference) tokens; the residual stream h, nrm, att and o
  // [S, D], qkv [S, 3D], RoPE [S, hd] x2, the MLP chunks u [R, 2F] and cat [R, D+F] (R = at most
  // 1024 rows, Flux2Transformer's kRowChunk); the prompt embeddings, latents, noise, velocity,
  // the preview and the pipeline's per-step tensors [N, 128] (a handful).
  n.dit = w.dit;
  const uint64_t N = static_cast<uint64_t>((r.width / 16) * (r.height / 16)), S = L + N + r.ref_tokens;
  const uint64_t D = dit.inner_dim(), Fm = dit.mlp_hidden_dim(), hd = dit.attention_head_dim;
  const uint64_t R = std::min<uint64_t>(S, 1024);
  n.dit_activations = S * (4 * D + 3 * D + 2 * hd) * kF + R * (2 * Fm + D + Fm) * kF +
                      L * dit.joint_attention_dim * kF + (8 * N + r.ref_tokens) * dit.in_channels * kF +
                      static_cast<uint64_t>(r.width * r.height) * 3 * kF;
  // Guidance: the negative prompt's embeddings (on the host and the device) and the second
  // velocity [N, 128] next to the first.
  if (r.cfg) n.dit_activations += 2 * L * dit.joint_attention_dim * kF + N * dit.in_channels * kF;
  // Inpainting: the source's packed latents, the packed noise and the re-noised source [N, 128]
  // each, and the mask's weights (its tokens are counted in ref_tokens as the first reference).
  if (r.inpaint) n.dit_activations += 3 * N * dit.in_channels * kF + N * kF;
  // The KV variant: its cache (Flux2KvCache::bytes_for) lives through the denoising; the first step
  // is the full-width call above, the later ones narrower.
  if (r.kv && r.ref_tokens > 0)
    n.dit_activations +=
        Flux2KvCache::bytes_for(r.ref_tokens, dit.num_layers + dit.num_single_layers, dit.inner_dim(), r.kv_bf16);

  // VAE decode: about three activations of the widest full-resolution block (Flux2Vae::tile_size),
  // the image, and the latent-level activations kept whole while tiling.
  n.vae_weights = w.vae;
  const auto& ch = vae.decoder_block_out_channels.empty() ? vae.block_out_channels : vae.decoder_block_out_channels;
  const int64_t nb = static_cast<int64_t>(ch.size());
  uint64_t widest = 0, c_max = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t k = nb - 1 - i;
    const uint64_t c = static_cast<uint64_t>(std::max(ch[k], ch[std::min(k + 1, nb - 1)]));
    const int64_t level = int64_t{1} << (nb - 1 - i);
    const uint64_t px = static_cast<uint64_t>((r.height / level) * (r.width / level));
    widest = std::max(widest, c * px);
    c_max = std::max(c_max, c);
  }
  const uint64_t image = static_cast<uint64_t>(r.width * r.height) * 3 * kF;
  const uint64_t f = static_cast<uint64_t>(vae.scale_factor());
  const uint64_t latent_level = 3 * c_max * static_cast<uint64_t>(r.width * r.height) / (f * f) * kF;
  n.vae_whole = 3 * widest * kF + image;
  const uint64_t W = static_cast<uint64_t>(r.width), Hh = static_cast<uint64_t>(r.height);
  n.vae_tiled = [=, ch = ch](int64_t tile) -> uint64_t {
    const uint64_t t = static_cast<uint64_t>(tile);
    if (t >= W && t >= Hh) return 3 * widest * kF + image;
    // A tile with its halo (a few pixels per level; 32 is generous) at the widest block's scale.
    const uint64_t tw = std::min(W, t) + 64, th = std::min(Hh, t) + 64;
    uint64_t tile_widest = 0;
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = nb - 1 - i;
      const uint64_t c = static_cast<uint64_t>(std::max(ch[k], ch[std::min(k + 1, nb - 1)]));
      const uint64_t level = uint64_t{1} << (nb - 1 - i);
      tile_widest = std::max(tile_widest, c * (tw / level) * (th / level));
    }
    return 3 * tile_widest * kF + image + latent_level;
  };

  // Kernel scratch: every thread's grow-only buffers for the widest shapes of the three models.
  kernels::ScratchShape sh;
  sh.max_k = static_cast<int64_t>(std::max({I, Dq, H, D + Fm, Fm, static_cast<uint64_t>(dit.joint_attention_dim)}));
  // The largest input of one Linear: the DiT's projections over all S tokens, its MLP chunks,
  // the text encoder's down projection, the VAE mid-block attention over the whole latent.
  const uint64_t vae_tokens = static_cast<uint64_t>(r.width * r.height) / (f * f);
  sh.max_x = static_cast<int64_t>(std::max({S * D, R * (D + Fm), L * static_cast<uint64_t>(dit.joint_attention_dim),
                                            L * std::max({I, Dq, H}), vae_tokens * c_max}));
  sh.converts_weights = w.converts;
  sh.attn_head_dim = static_cast<int64_t>(std::max<uint64_t>(hd, te.head_dim));
  sh.conv_cin = static_cast<int64_t>(c_max);
  sh.conv_width = std::max<int64_t>(r.width, 1);
  n.scratch = kernels::scratch_bound_bytes(sh, r.threads);
  n.vae_during_denoise = r.editing;
  return n;
}

uint64_t process_rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, rss = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &rss);
  std::fclose(f);
  return got == 2 ? rss * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace klein::api
