// FLUX.2 diffusion transformer (diffusers `Flux2Transformer2DModel`), the denoiser of
// FLUX.2 [klein]: packed latent tokens + text embeddings + timestep -> velocity prediction.
//
// Computes in float32 throughout and matches the float32 diffusers model (the bf16 pipeline's
// intermediate roundings are not emulated here). Weights stay memory-mapped in their stored dtype.
//
// Layout of the forward pass (diffusers transformer_flux2.py):
//   temb = timestep_embedder(sinusoid(1000 t))            [+ guidance_embedder(sinusoid(1000 g))]
//   three shared modulations from SiLU(temb): double img (6D), double txt (6D), single (3D)
//   residual stream h = [context_embedder(txt) ; x_embedder(img)]   (text rows first)
//   num_layers double-stream blocks (separate weights per stream, joint attention text-first)
//   num_single_layers single-stream blocks (fused QKV+MLP projection, parallel attention/MLP)
//   norm_out (AdaLayerNormContinuous: scale first, then shift) on the image rows, proj_out.
#pragma once

#include <functional>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/run_context.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "io/tensor_source.h"

namespace klein {

class BufferPool;

// Position ids (T, H, W, L) per token, as the pipeline builds them.
using Flux2Ids = std::vector<std::array<int64_t, 4>>;

// Image tokens of an h x w latent grid, row-major (token n = y*w + x): (t_offset, y, x, 0).
// t_offset is 0 for the generated image and 10 + 10*i for reference image i.
Flux2Ids flux2_image_ids(int h, int w, int t_offset = 0);
// Text tokens 0..L-1: (0, 0, 0, l).
Flux2Ids flux2_text_ids(int L);

struct Flux2Config {
  int64_t num_layers = 0;         // double-stream blocks
  int64_t num_single_layers = 0;  // single-stream blocks
  int64_t attention_head_dim = 0;
  int64_t num_attention_heads = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;       // config null -> in_channels
  int64_t joint_attention_dim = 0;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope;  // 1..4 even entries summing to attention_head_dim
  double rope_theta = 2000.0;
  int64_t timestep_guidance_channels = 256;
  bool guidance_embeds = false;
  double eps = 1e-6;

  // Both are computed once by from_json, with overflow checks (the config may claim anything).
  int64_t inner_dim() const { return inner_dim_; }
  // int(inner_dim * mlp_ratio), as Python truncates it.
  int64_t mlp_hidden_dim() const { return mlp_hidden_dim_; }

  // Reads a diffusers transformer/config.json. Missing optional keys take diffusers' defaults
  // (note: guidance_embeds defaults to true there). `where` names the file in messages.
  static Result<Flux2Config> from_json(const nlohmann::json& j, const std::string& where);

  int64_t inner_dim_ = 0, mlp_hidden_dim_ = 0;
};

// The reference keys and values of the KV-cached editing variant (diffusers' Flux2KVCache, for
// Flux2KleinKVPipeline): per block in run order (double blocks, then single blocks), the
// references' post-RoPE keys and values (K | V, 2D values per token), stored by an "extract" call
// and read by "cached" calls: float32 [R, 2D], or rounded to bf16 and packed two to a float slot
// [R, D] (Backend::pack_bf16: half the memory; the `fast` precision's choice). They depend on the
// references alone (reference queries attend to reference keys only, under their own
// fixed-timestep modulation), so one cache serves every step, seed and prompt of a request.
struct Flux2KvCache {
  int64_t ref_tokens = 0;
  bool bf16 = false;
  std::vector<Tensor> layers;
  bool filled() const { return ref_tokens > 0 && !layers.empty(); }
  uint64_t bytes() const;
  // Bytes of a cache of `ref_tokens` for this many blocks of width D.
  static uint64_t bytes_for(int64_t ref_tokens, int64_t blocks, int64_t D, bool bf16 = false) {
    return static_cast<uint64_t>(ref_tokens) * static_cast<uint64_t>(2 * D) * (bf16 ? 2u : 4u) *
           static_cast<uint64_t>(blocks);
  }
};

// How a forward call uses a Flux2KvCache.
//   kExtract: the image tokens are [R reference tokens; the noise tokens] (references FIRST, their
//     ids likewise); the references are modulated at `ref_timestep` (diffusers' ref_fixed_timestep,
//     0: clean) and attend to themselves only; every block stores their keys and values in `cache`.
//     The output is the noise tokens' (out_tokens counts those).
//   kCached: the image tokens are the noise tokens alone; every block's keys and values are
//     [text, cached references, image].
struct Flux2KvStep {
  enum class Mode { kExtract, kCached } mode = Mode::kExtract;
  int64_t ref_tokens = 0;  // kExtract: R
  float ref_timestep = 0.0f;
  Flux2KvCache* cache = nullptr;
  bool bf16 = false;  // kExtract: store the cache as packed bf16
};

// RoPE cos/sin tables [T + N, head_dim] for a forward's [text; image] tokens (Flux2Transformer::rope).
struct Flux2Rope {
  Tensor cos, sin;
  int64_t text_tokens = 0, image_tokens = 0;  // what they were made for (forward checks it)
};

class Flux2Transformer {
 public:
  // Binds the transformer described by `config` (a diffusers transformer/config.json; `where`
  // names it in messages) from `src`. Every tensor's shape is checked against the config; a tensor
  // the config does not account for is an error too (e.g. more blocks than num_layers says).
  static Result<Flux2Transformer> load(std::shared_ptr<const TensorSource> src, const nlohmann::json& config,
                                       const std::string& config_where);
  // The same from <dir>/config.json and the safetensors weights in <dir> (single file or sharded).
  static Result<Flux2Transformer> load(const std::filesystem::path& dir);

  const Flux2Config& config() const { return cfg_; }
  // The tensor table: one row per tensor the transformer binds, in load order — its diffusers
  // name, the shape the config gives it, its block (run order; -1 outside the blocks) and where
  // the model keeps it. Loading, for_each_weight, the per-block walk of streaming and memory
  // accounting all read it (and LoRA will): no other list of the transformer's tensors exists.
  struct TensorRow {
    std::string name;
    Shape shape;
    int block = -1;
    Weight* weight = nullptr;              // a matrix, kept in its stored format
    std::vector<float>* vector = nullptr;  // or a norm vector, converted to float32 at load
  };
  // Rows point into this model (double_ / single_ must already have the config's sizes).
  std::vector<TensorRow> tensor_table() const;
  // Calls fn on every weight the model holds, stopping at the first error: weight preparation
  // for a backend, memory accounting, `klein info`.
  Status for_each_weight(const std::function<Status(Weight&)>& fn);
  // Blocks in run order (the double blocks, then the single blocks) and the weights of one of them: what a
  // caller streams between RunContext::on_block calls. Weights outside every block (embeddings,
  // modulations, projections) stay resident.
  int num_blocks() const;
  void for_each_block_weight(int i, const std::function<void(const Weight&)>& fn) const;
  // Where the weights are stored (for residency hints).
  const TensorSource& source() const { return *source_; }
  // Makes every weight ready for `be` (Backend::prepare_weight): once, after load.
  Status prepare(Backend& be) {
    return for_each_weight([&](Weight& w) { return w.empty() ? Status::Ok() : be.prepare_weight(w); });
  }

  // One denoiser evaluation (batch 1).
  //   img:  [N, in_channels] (or [1, N, in_channels]) packed latent tokens
  //   txt:  [T, joint_attention_dim] (or [1, T, joint_attention_dim]) prompt embeddings
  //   timestep: the value the pipeline passes, i.e. t / 1000 (sigma); scaled by 1000 inside
  //   img_ids / txt_ids: N and T position ids (see flux2_image_ids / flux2_text_ids)
  //   guidance: only used by models with guidance_embeds (ignored otherwise, as diffusers does)
  //   out_tokens: how many leading image tokens' outputs are wanted (< 0: all N; 0 or more than
  //     N is an invalid argument; an edit's reference tokens follow the noise tokens and need
  //     none). The last block then computes only those rows: the same bits as in the whole output
  //     (at ≤ 4 rows the float32 GEMMs' GEMV path sums in another order: float32 rounding apart).
  // Returns [out_tokens, out_channels]. Named dumps (ctx.dump): dit.temb [1,D], dit.mod_img / dit.mod_txt
  // [1,6D], dit.mod_single [1,3D], dit.rope_cos / dit.rope_sin [T+N, head_dim],
  // dit.x_embedder [1,N,D], dit.context_embedder [1,T,D], dit.double<i>.attn_img [1,N,D] /
  // dit.double<i>.attn_txt [1,T,D] (attention output after to_out / to_add_out),
  // dit.double<i>.img [1,N,D], dit.double<i>.txt [1,T,D], dit.single<i>.attn [1,T+N,D]
  // (to_out output before gating), dit.single<i> [1,T+N,D], dit.norm_out [1,out_tokens,D],
  // dit.output [1,out_tokens,out_channels].
  // `work`: where the residual stream and the blocks' work buffers come from (see BufferPool; a
  // denoising loop passes one pool to every step, so their pages fault in once per image, not
  // once per step: 1-4 % of a 256² q8 step here); null: fresh from the backend.
  // `rope`: the RoPE tables of these ids, made once by rope() (a denoising loop makes them once
  // per request: they depend on the position ids only); null: made here. Either way the same bits.
  // `kv`: the KV-cached editing variant's extract or cached call (Flux2KvStep); null: the plain forward.
  Result<Tensor> forward(const Tensor& img, const Tensor& txt, float timestep, const Flux2Ids& img_ids,
                         const Flux2Ids& txt_ids, const RunContext& ctx,
                         std::optional<float> guidance = std::nullopt, int64_t out_tokens = -1,
                         BufferPool* work = nullptr, const Flux2Rope* rope = nullptr,
                         const Flux2KvStep* kv = nullptr) const;
  // The RoPE tables forward uses for [text; image] tokens with these ids, on `be`'s device.
  Result<Flux2Rope> rope(const Flux2Ids& img_ids, const Flux2Ids& txt_ids, Backend& be) const;

 private:
  struct DoubleBlock {
    Weight to_q, to_k, to_v, to_out, add_q, add_k, add_v, to_add_out;
    Weight ff_in, ff_out, ffc_in, ffc_out;
    std::vector<float> norm_q, norm_k, norm_added_q, norm_added_k;  // [head_dim]
  };
  struct SingleBlock {
    Weight qkv_mlp, to_out;
    std::vector<float> norm_q, norm_k;
  };
  struct Step;  // per-call state shared by the blocks (modulations, RoPE tables, buffers)
  // temb [1, D] for the (already x1000) timestep value, plus the guidance embedding when present.
  Status time_embedding(float t1000, std::optional<float> g1000, const TensorView& temb, const RunContext& ctx) const;
  // Block i of each kind on the residual stream of `st` (text rows first), in place.
  Status double_block(size_t i, Step& st, const RunContext& ctx) const;
  Status single_block(size_t i, Step& st, const RunContext& ctx) const;

  Flux2Config cfg_;
  std::shared_ptr<const TensorSource> source_;  // keeps the weights' storage alive
  Weight x_embedder_, context_embedder_;
  Weight t_lin1_, t_lin2_, g_lin1_, g_lin2_;  // g_* only with guidance_embeds
  Weight mod_img_, mod_txt_, mod_single_, norm_out_, proj_out_;
  std::vector<DoubleBlock> double_;
  std::vector<SingleBlock> single_;
};

// Pure helpers, exposed for tests.

// diffusers get_timestep_embedding(t, channels, flip_sin_to_cos=True, downscale_freq_shift=0),
// float32: [cos(t*f_0..), sin(t*f_0..)] with f_i = exp(fp32(-ln 10000) * i / (channels/2)).
std::vector<float> flux2_timestep_sinusoid(float t, int64_t channels);

// RoPE tables as Flux2PosEmbed builds them: per token and axis a, for j < axes[a]/2 the angle
// id[a] * theta^(-2j/axes[a]) in float64, cos/sin rounded to float and written to the pair
// (off_a + 2j, off_a + 2j + 1). cos/sin: [ids.size(), sum(axes)] row-major.
void flux2_rope_tables(const Flux2Ids& ids, const std::vector<int64_t>& axes, double theta, float* cos,
                       float* sin);

}  // namespace klein
