// FLUX.2 VAE (diffusers AutoencoderKLFlux2): the decoder that turns the 32-channel latent into
// an image, the encoder's mean path (for reference images), and the latent batch-norm
// statistics the pipeline normalises the patchified latent with.
//
// Every dimension comes from vae/config.json; the weights stay memory-mapped in their stored
// dtype. Activations are float32 NCHW, batch items are processed one at a time. The VAE's
// GroupNorm (+ SiLU) steps are folded into the following conv (the conv op's prologue),
// nearest ×2 upsampling into the Upsample2D conv, and each ResNet block's residual add into its
// second conv, so a block needs its input, one hidden tensor and (with a 1×1 shortcut) the
// output — no full-size normalised copies.
#pragma once

#include <functional>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/run_context.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "io/tensor_source.h"
#include "models/latent_stats.h"

namespace klein {

class BufferPool;

struct Flux2VaeConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 32;
  std::vector<int64_t> block_out_channels;          // encoder, e.g. [128, 256, 512, 512]
  std::vector<int64_t> decoder_block_out_channels;  // null in the file → block_out_channels
  int64_t layers_per_block = 2;                     // encoder; the decoder uses +1
  int64_t norm_num_groups = 32;
  bool mid_block_add_attention = true;
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  double batch_norm_eps = 1e-4;
  // The picture size the VAE was made for (AutoencoderKL's `sample_size`): 1024 in every FLUX.2
  // file; klein's default output size when a request gives none (128 for the shapes demo model).
  int64_t sample_size = 1024;
  // GroupNorm eps of every ResNet / attention / output norm: fixed in diffusers' Encoder and
  // Decoder (resnet_eps=1e-6, conv_norm_out eps=1e-6), not a config key.
  double norm_eps = 1e-6;

  int64_t patch_channels() const { return 4 * latent_channels; }  // patch_size [2, 2]
  // Spatial factor between image and latent: 2^(number of down/up samplers).
  int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

  // Reads a diffusers vae/config.json. `where` names the file in messages.
  static Result<Flux2VaeConfig> from_json(const nlohmann::json& j, const std::string& where);
};

// Tiled (windowed) VAE decoding and encoding (flux2_vae_tiled.cpp): seamless — the result
// equals the whole-image pass to float rounding (GroupNorm statistics are global, tiles carry
// the halo their convs read) — at a fraction of the memory.
struct VaeTiling {
  // Tile size in image pixels (output pixels for decoding, input pixels for encoding), rounded
  // down to a multiple of the scale factor (8). 0: automatic; < 0: never tile.
  int64_t tile = 0;
  // Automatic: tile (with auto_tile) when the whole-image pass's largest activations would need
  // more than this. The memory budget will set it; until then a fixed default that keeps
  // today's whole-image pass up to about 1024² and tiles beyond.
  uint64_t auto_above_bytes = uint64_t{4} << 30;
  int64_t auto_tile = 512;
  // Whole activations up to this size (all kept ones together) are kept between the statistics
  // passes instead of recomputed from an earlier one: time for memory.
  uint64_t keep_bytes = uint64_t{256} << 20;
  // Activations beyond keep_bytes go to an unlinked temporary file in spill_dir (empty: $TMPDIR
  // or /tmp) instead of being recomputed: the tiled pass then costs about the whole-image pass.
  bool spill = true;
  std::string spill_dir;
};

class Flux2Vae {
 public:
  // Binds the VAE described by `config` (a diffusers vae/config.json; `config_where` names it in
  // messages) from `src`, checking every tensor's shape against the config; a tensor the config
  // does not account for is an error (bn.num_batches_tracked, a counter, is ignored).
  static Result<Flux2Vae> load(std::shared_ptr<const TensorSource> src, const nlohmann::json& config,
                               const std::string& config_where);
  // The same from vae/ (config.json + safetensors).
  static Result<Flux2Vae> load(const std::filesystem::path& dir);

  const Flux2VaeConfig& config() const { return cfg_; }
  // The tensor table: one row per tensor the VAE binds, in load order — its diffusers name, the
  // shape the config gives it, the part that reads it and where the model keeps it. Loading and
  // for_each_weight read it (and memory accounting, through for_each_weight): no other list of
  // the VAE's tensors exists. Rows point into this model.
  enum class Part { kEncoder, kDecoder, kLatentNorm };
  struct TensorRow {
    std::string name;
    Shape shape;
    Part part = Part::kEncoder;
    Weight* weight = nullptr;              // a conv / linear / norm parameter, kept as stored
    std::vector<float>* vector = nullptr;  // or a batch-norm statistic, converted to float32 at load
  };
  std::vector<TensorRow> tensor_table() const;
  // Calls fn on every weight of the table, stopping at the first error: weight preparation for
  // a backend, memory accounting, `klein info`.
  Status for_each_weight(const std::function<Status(Weight&)>& fn);
  // Where the weights are stored (for residency hints).
  const TensorSource& source() const { return *source_; }
  // Why an output of this VAE is non-finite: the file and tensor of the first non-finite weight.
  Status non_finite_status() const;
  // Makes every weight ready for `be` (Backend::prepare_weight): once, after load.
  Status prepare(Backend& be) {
    return for_each_weight([&](Weight& w) { return w.empty() ? Status::Ok() : be.prepare_weight(w); });
  }

  // z: [B, latent_channels, h, w] (the unpatchified, de-normalised latent) → image
  // [B, out_channels, 8h, 8w] in about [-1, 1], float32 (no clamping; the caller post-processes).
  // Dumps "vae.post_quant_conv", "vae.conv_in", "vae.mid", "vae.up<i>", "vae.conv_norm_out"
  // (only when asked for), "vae.conv_out" (= the output).
  // Tiled per `tiling` (only vae.post_quant_conv, vae.conv_in, vae.mid and vae.conv_out are
  // dumped then).
  Result<Tensor> decode(const Tensor& z, const RunContext& ctx, const VaeTiling& tiling = {}) const;

  // image: [B, in_channels, H, W] in [-1, 1], H and W multiples of scale_factor() →
  // the posterior mean [B, latent_channels, H/8, W/8] (= latent_dist.mode(); channels
  // [0, latent_channels) of quant_conv's output). Dumps "vae_enc.conv_in", "vae_enc.down<i>",
  // "vae_enc.mid", "vae_enc.conv_out" (all 2·latent channels), "vae_enc.mean".
  // Tiled per `tiling` (vae_enc.conv_in and vae_enc.down<i> are not dumped then).
  Result<Tensor> encode_mean(const Tensor& image, const RunContext& ctx, const VaeTiling& tiling = {}) const;
  // The tile size decode (decoder) or encode_mean uses for an H × W image; 0: untiled.
  int64_t tile_size(int64_t H, int64_t W, const VaeTiling& tiling, bool decoder) const;

  // Batch-norm statistics of the patchified latent (patch_channels() entries), computed as the
  // pipeline does: mean = bn.running_mean, std = sqrt(bn.running_var + batch_norm_eps), in
  // float32 (kF32) or with bf16 buffers and bf16-rounded add and sqrt (kBF16, a bf16 pipeline).
  LatentStats latent_stats(LatentArith arith = LatentArith::kF32) const;
  const std::vector<float>& bn_mean() const { return bn_mean_; }
  const std::vector<float>& bn_var() const { return bn_var_; }

  // Building blocks (public so later code — tiled decoding — can drive them directly).
  struct Conv {
    Weight w, b;  // [Cout, Cin, kh, kw], [Cout]
  };
  struct Norm {
    Weight w, b;  // GroupNorm affine [C], [C]
  };
  struct Resnet {
    Norm norm1, norm2;
    Conv conv1, conv2;
    Conv shortcut;  // 1×1, only when in != out channels (w empty otherwise)
    int64_t cin = 0, cout = 0;
  };
  struct Attn {
    Norm norm;
    Weight q, qb, k, kb, v, vb, o, ob;  // Linear [C, C] + bias [C]
    int64_t c = 0;
  };
  struct Mid {
    Resnet r0, r1;
    bool has_attn = false;
    Attn attn;
  };
  struct Block {
    std::vector<Resnet> resnets;
    bool has_sampler = false;  // Downsample2D (encoder) or Upsample2D (decoder)
    Conv sampler;
  };

  // The blocks, on one batch item [1, C, H, W] (the tiling and streaming granularity).
  // ResnetBlock2D: x → shortcut(x) + conv2(silu(gn2(conv1(silu(gn1(x)))))).
  // Tensors it allocates come from `pool` when one is given (see BufferPool), else from the backend.
  Result<Tensor> resnet(const Resnet& r, Tensor x, const RunContext& ctx, BufferPool* pool = nullptr) const;
  // Mid-block attention, in place: x += to_out(sdpa(qkv(gn(x)))) over the HW tokens.
  Status attention(const Attn& a, Tensor& x, const RunContext& ctx) const;
  Result<Tensor> mid_block(const Mid& m, Tensor x, const RunContext& ctx, BufferPool* pool = nullptr) const;
  // A decoder up block (resnets, then nearest ×2 + conv) / an encoder down block (resnets, then
  // the stride-2 conv).
  Result<Tensor> up_block(const Block& b, Tensor x, const RunContext& ctx, BufferPool* pool = nullptr) const;
  Result<Tensor> down_block(const Block& b, Tensor x, const RunContext& ctx, BufferPool* pool = nullptr) const;

 private:
  // The intermediate activations of one call (all its batch items) come from `pool`.
  Result<Tensor> decode_one(Tensor x, const RunContext& ctx, int64_t tile, const VaeTiling& tiling,
                            BufferPool& pool) const;
  Result<Tensor> encode_one(Tensor x, const RunContext& ctx, int64_t tile, const VaeTiling& tiling,
                            BufferPool& pool) const;
  // The full-resolution parts on tiles: decoder from the mid block's output to the image;
  // encoder from the image to the last down block's output.
  Result<Tensor> decode_tiled(Tensor mid, int64_t tile, const VaeTiling& tiling, const RunContext& ctx) const;
  Result<Tensor> encode_tiled(Tensor image, int64_t tile, const VaeTiling& tiling, const RunContext& ctx) const;

  Flux2VaeConfig cfg_;
  std::shared_ptr<const TensorSource> source_;  // keeps the weights' storage alive
  // Encoder.
  Conv enc_conv_in_;
  std::vector<Block> enc_blocks_;
  Mid enc_mid_;
  Norm enc_norm_out_;
  Conv enc_conv_out_;
  Conv quant_conv_;  // only with use_quant_conv
  // Decoder.
  Conv post_quant_conv_;  // only with use_post_quant_conv
  Conv dec_conv_in_;
  Mid dec_mid_;
  std::vector<Block> dec_blocks_;
  Norm dec_norm_out_;
  Conv dec_conv_out_;
  // Latent batch norm (running stats as float32, upcast from the stored dtype).
  std::vector<float> bn_mean_, bn_var_;
};

}  // namespace klein
