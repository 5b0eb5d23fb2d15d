// klein-make_random_model: writes a seeded random-weight model with the REAL FLUX.2 [klein] 4B or
// 9B architecture (--family), in the REAL diffusers folder layout of black-forest-labs/FLUX.2-klein-4B, for
// benchmarks (speed and memory, not image quality):
//
//   DIR/model_index.json                          Flux2KleinPipeline (9b-kv: Flux2KleinKVPipeline), is_distilled true
//   DIR/scheduler/scheduler_config.json           FlowMatchEulerDiscreteScheduler (FLUX.2 values)
//   DIR/text_encoder/config.json                  Qwen3-4B or Qwen3-8B (transformers-5 spelling; tied
//                                                 embeddings for both, so no lm_head is written)
//   DIR/text_encoder/generation_config.json
//   DIR/text_encoder/model-0000k-of-0000n.safetensors + model.safetensors.index.json
//   DIR/tokenizer/...                             copied from --tokenizer
//   DIR/transformer/config.json                   Flux2Transformer2DModel 4B or 9B
//   DIR/transformer/diffusion_pytorch_model-0000k-of-0000n.safetensors + ...index.json
//   DIR/vae/config.json                           AutoencoderKLFlux2
//   DIR/vae/diffusion_pytorch_model.safetensors   incl. bn.running_mean/var/num_batches_tracked
//
// Key names and shapes follow shared/docs/reference/flux2-klein-pipeline.md §9 and
// qwen3-text-encoder.md §2.2; scripts/reference/check_random_model.py loads the result with the
// real diffusers/transformers classes and checks there are no missing/unexpected keys.
//
// Weights: Linear ~ N(0, 1/fan_in), conv ~ N(0, 1/(cin*kh*kw)), norm weights 1 + N(0, 0.02²),
// biases N(0, 0.01²), embeddings N(0, 1), BN running_mean N(0, 0.05²), running_var 1 + N(0, 0.1²).
// The "normal" is a cheap Irwin-Hall approximation (sum of four 16-bit uniforms, bounded at
// ±3.46σ). Each tensor is cut into fixed chunks whose PRNG state depends only on (seed, tensor
// name, chunk index), so the files are byte-identical for a given seed whatever --threads is.
//
// Files are streamed (a few tens of MB of buffers, never a whole tensor or component in RAM),
// sharded (--max-shard-mb, default 2000) and written atomically (temp file + rename).
//
// Example (from the repository root):
//   klein-make_random_model --out /tmp/klein-random-4b --seed 0 --tokenizer tests/data/tiny/tokenizer
//       --dtype bf16 --text-layers 36        (one command line)
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/format.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/atomic_file.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;
using klein::DType;
using klein::Shape;
using klein::Status;

namespace {

// ------------------------------------------------------------------------------------------
// Random numbers
// ------------------------------------------------------------------------------------------

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t mix64(uint64_t x) {
  uint64_t s = x;
  return splitmix64(s);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Approximately standard normal: sum of four 16-bit uniforms (Irwin-Hall n=4), centred and
// scaled to unit variance. Bounded by ±2·sqrt(3) = ±3.46.
inline float approx_normal(uint64_t r) {
  const uint32_t s = static_cast<uint32_t>(r & 0xffff) + static_cast<uint32_t>((r >> 16) & 0xffff) +
                     static_cast<uint32_t>((r >> 32) & 0xffff) + static_cast<uint32_t>(r >> 48);
  // mean 4 * 32767.5; variance 4 * (65536² - 1) / 12 -> std ≈ 65536 / sqrt(3).
  constexpr float kScale = 1.7320508075688772f / 65536.0f;
  return (static_cast<float>(s) - 131070.0f) * kScale;
}

// ------------------------------------------------------------------------------------------
// Tensor specifications
// ------------------------------------------------------------------------------------------

struct Init {
  enum Kind { kNormal, kZeroI64 } kind = kNormal;
  float mean = 0.f;
  float std = 1.f;
  float min = -INFINITY;  // clamp (for BN running_var, which must stay positive)
};

struct Spec {
  std::string name;
  Shape shape;
  Init init;
  DType dtype;  // storage type
};

int64_t spec_bytes(const Spec& s) { return klein::shape_numel(s.shape) * static_cast<int64_t>(klein::dtype_size(s.dtype)); }

class SpecList {
 public:
  explicit SpecList(DType dt) : dt_(dt) {}
  void normal(const std::string& name, Shape shape, float std, float mean = 0.f, float min = -INFINITY) {
    Init i;
    i.mean = mean;
    i.std = std;
    i.min = min;
    v_.push_back({name, std::move(shape), i, dt_});
  }
  // nn.Linear [out, in] weight (no bias).
  void linear(const std::string& name, int64_t out, int64_t in) {
    normal(name + ".weight", {out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
  }
  // nn.Linear with bias.
  void linear_b(const std::string& name, int64_t out, int64_t in) {
    linear(name, out, in);
    bias(name + ".bias", out);
  }
  void conv(const std::string& name, int64_t out, int64_t in, int64_t k) {
    normal(name + ".weight", {out, in, k, k}, 1.0f / std::sqrt(static_cast<float>(in * k * k)));
    bias(name + ".bias", out);
  }
  void norm_weight(const std::string& name, int64_t n) { normal(name, {n}, 0.02f, 1.0f); }
  void bias(const std::string& name, int64_t n) { normal(name, {n}, 0.01f); }
  // GroupNorm / LayerNorm with affine weight and bias.
  void group_norm(const std::string& name, int64_t n) {
    norm_weight(name + ".weight", n);
    bias(name + ".bias", n);
  }
  void i64_scalar_zero(const std::string& name) {
    Init i;
    i.kind = Init::kZeroI64;
    v_.push_back({name, Shape{}, i, DType::kI64});
  }
  std::vector<Spec>& specs() { return v_; }

 private:
  DType dt_;
  std::vector<Spec> v_;
};

// --- the family's dimensions: klein 4B (Qwen3-4B encoder) or 9B (Qwen3-8B encoder) ---
// (flux2-klein-pipeline.md §1.2, §9.1; qwen3-text-encoder.md §2.2; BFL's Klein4BParams/Klein9BParams)
struct Dims {
  int64_t qw_vocab, qw_hidden, qw_inter, qw_heads, qw_kv_heads, qw_head_dim;
  int64_t tr_d, tr_f, tr_head_dim, tr_in, tr_ctx, tr_time;
  int tr_double, tr_single;
};
constexpr Dims k4B{151936, 2560, 9728, 32, 8, 128, 3072, 9216, 128, 128, 7680, 256, 5, 20};
constexpr Dims k9B{151936, 4096, 12288, 32, 8, 128, 4096, 12288, 128, 128, 12288, 256, 8, 24};
Dims g{k4B};  // set once from --family before anything is written

std::vector<Spec> text_encoder_specs(DType dt, int layers) {
  SpecList s(dt);
  s.normal("model.embed_tokens.weight", {g.qw_vocab, g.qw_hidden}, 1.0f);
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s.norm_weight(p + "input_layernorm.weight", g.qw_hidden);
    s.linear(p + "self_attn.q_proj", g.qw_heads * g.qw_head_dim, g.qw_hidden);
    s.linear(p + "self_attn.k_proj", g.qw_kv_heads * g.qw_head_dim, g.qw_hidden);
    s.linear(p + "self_attn.v_proj", g.qw_kv_heads * g.qw_head_dim, g.qw_hidden);
    s.norm_weight(p + "self_attn.q_norm.weight", g.qw_head_dim);
    s.norm_weight(p + "self_attn.k_norm.weight", g.qw_head_dim);
    s.linear(p + "self_attn.o_proj", g.qw_hidden, g.qw_heads * g.qw_head_dim);
    s.norm_weight(p + "post_attention_layernorm.weight", g.qw_hidden);
    s.linear(p + "mlp.gate_proj", g.qw_inter, g.qw_hidden);
    s.linear(p + "mlp.up_proj", g.qw_inter, g.qw_hidden);
    s.linear(p + "mlp.down_proj", g.qw_hidden, g.qw_inter);
  }
  s.norm_weight("model.norm.weight", g.qw_hidden);
  return std::move(s.specs());
}

// --- Flux2Transformer2DModel ---
std::vector<Spec> transformer_specs(DType dt) {
  SpecList s(dt);
  s.linear("x_embedder", g.tr_d, g.tr_in);
  s.linear("context_embedder", g.tr_d, g.tr_ctx);
  s.linear("time_guidance_embed.timestep_embedder.linear_1", g.tr_d, g.tr_time);
  s.linear("time_guidance_embed.timestep_embedder.linear_2", g.tr_d, g.tr_d);
  s.linear("double_stream_modulation_img.linear", 6 * g.tr_d, g.tr_d);
  s.linear("double_stream_modulation_txt.linear", 6 * g.tr_d, g.tr_d);
  s.linear("single_stream_modulation.linear", 3 * g.tr_d, g.tr_d);
  for (int i = 0; i < g.tr_double; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    s.linear(p + "attn.to_q", g.tr_d, g.tr_d);
    s.linear(p + "attn.to_k", g.tr_d, g.tr_d);
    s.linear(p + "attn.to_v", g.tr_d, g.tr_d);
    s.norm_weight(p + "attn.norm_q.weight", g.tr_head_dim);
    s.norm_weight(p + "attn.norm_k.weight", g.tr_head_dim);
    s.linear(p + "attn.to_out.0", g.tr_d, g.tr_d);
    s.linear(p + "attn.add_q_proj", g.tr_d, g.tr_d);
    s.linear(p + "attn.add_k_proj", g.tr_d, g.tr_d);
    s.linear(p + "attn.add_v_proj", g.tr_d, g.tr_d);
    s.norm_weight(p + "attn.norm_added_q.weight", g.tr_head_dim);
    s.norm_weight(p + "attn.norm_added_k.weight", g.tr_head_dim);
    s.linear(p + "attn.to_add_out", g.tr_d, g.tr_d);
    s.linear(p + "ff.linear_in", 2 * g.tr_f, g.tr_d);
    s.linear(p + "ff.linear_out", g.tr_d, g.tr_f);
    s.linear(p + "ff_context.linear_in", 2 * g.tr_f, g.tr_d);
    s.linear(p + "ff_context.linear_out", g.tr_d, g.tr_f);
  }
  for (int i = 0; i < g.tr_single; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
    s.linear(p + "attn.to_qkv_mlp_proj", 3 * g.tr_d + 2 * g.tr_f, g.tr_d);
    s.norm_weight(p + "attn.norm_q.weight", g.tr_head_dim);
    s.norm_weight(p + "attn.norm_k.weight", g.tr_head_dim);
    s.linear(p + "attn.to_out", g.tr_d, g.tr_d + g.tr_f);
  }
  s.linear("norm_out.linear", 2 * g.tr_d, g.tr_d);
  s.linear("proj_out", g.tr_in, g.tr_d);
  return std::move(s.specs());
}

// --- AutoencoderKLFlux2 (flux2-klein-pipeline.md §1.3, §9.2, Appendix A) ---
constexpr int64_t kVaeCh[4] = {128, 256, 512, 512};
constexpr int64_t kVaeLatent = 32;
constexpr int kVaeLayers = 2;

void vae_resnet(SpecList& s, const std::string& p, int64_t in, int64_t out) {
  s.group_norm(p + "norm1", in);
  s.conv(p + "conv1", out, in, 3);
  s.group_norm(p + "norm2", out);
  s.conv(p + "conv2", out, out, 3);
  if (in != out) s.conv(p + "conv_shortcut", out, in, 1);
}

void vae_mid(SpecList& s, const std::string& p, int64_t c) {
  vae_resnet(s, p + "resnets.0.", c, c);
  s.group_norm(p + "attentions.0.group_norm", c);
  s.linear_b(p + "attentions.0.to_q", c, c);
  s.linear_b(p + "attentions.0.to_k", c, c);
  s.linear_b(p + "attentions.0.to_v", c, c);
  s.linear_b(p + "attentions.0.to_out.0", c, c);
  vae_resnet(s, p + "resnets.1.", c, c);
}

std::vector<Spec> vae_specs(DType dt) {
  SpecList s(dt);
  // Encoder.
  s.conv("encoder.conv_in", kVaeCh[0], 3, 3);
  int64_t prev = kVaeCh[0];
  for (int i = 0; i < 4; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i) + ".";
    for (int j = 0; j < kVaeLayers; ++j) {
      vae_resnet(s, p + "resnets." + std::to_string(j) + ".", j == 0 ? prev : kVaeCh[i], kVaeCh[i]);
    }
    if (i < 3) s.conv(p + "downsamplers.0.conv", kVaeCh[i], kVaeCh[i], 3);
    prev = kVaeCh[i];
  }
  vae_mid(s, "encoder.mid_block.", kVaeCh[3]);
  s.group_norm("encoder.conv_norm_out", kVaeCh[3]);
  s.conv("encoder.conv_out", 2 * kVaeLatent, kVaeCh[3], 3);
  s.conv("quant_conv", 2 * kVaeLatent, 2 * kVaeLatent, 1);
  s.conv("post_quant_conv", kVaeLatent, kVaeLatent, 1);
  // Decoder (reversed channels).
  s.conv("decoder.conv_in", kVaeCh[3], kVaeLatent, 3);
  vae_mid(s, "decoder.mid_block.", kVaeCh[3]);
  prev = kVaeCh[3];
  for (int i = 0; i < 4; ++i) {
    const int64_t out = kVaeCh[3 - i];
    const std::string p = "decoder.up_blocks." + std::to_string(i) + ".";
    for (int j = 0; j < kVaeLayers + 1; ++j) {
      vae_resnet(s, p + "resnets." + std::to_string(j) + ".", j == 0 ? prev : out, out);
    }
    if (i < 3) s.conv(p + "upsamplers.0.conv", out, out, 3);
    prev = out;
  }
  s.group_norm("decoder.conv_norm_out", kVaeCh[0]);
  s.conv("decoder.conv_out", 3, kVaeCh[0], 3);
  // Latent BatchNorm (affine=False): 4 * latent_channels (patch 2x2).
  s.normal("bn.running_mean", {4 * kVaeLatent}, 0.05f);
  s.normal("bn.running_var", {4 * kVaeLatent}, 0.1f, 1.0f, 0.05f);
  s.i64_scalar_zero("bn.num_batches_tracked");
  return std::move(s.specs());
}

// ------------------------------------------------------------------------------------------
// Streaming safetensors writer
// ------------------------------------------------------------------------------------------

constexpr int64_t kChunk = 1 << 16;         // elements per PRNG stream (fixed: determinism)
constexpr int64_t kBatchElems = 1 << 24;    // elements per write buffer (16M)

void fill_chunk(const Spec& s, uint64_t tensor_seed, int64_t chunk, int64_t begin, int64_t end, void* out) {
  uint64_t st = mix64(tensor_seed ^ mix64(static_cast<uint64_t>(chunk) + 0x632BE59BD9B4E019ull));
  const float mean = s.init.mean, sd = s.init.std, mn = s.init.min;
  const int64_t n = end - begin;
  if (s.dtype == DType::kBF16) {
    auto* o = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) {
      float v = mean + sd * approx_normal(splitmix64(st));
      if (v < mn) v = mn;
      o[i] = klein::f32_to_bf16(v);
    }
  } else {
    auto* o = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) {
      float v = mean + sd * approx_normal(splitmix64(st));
      if (v < mn) v = mn;
      o[i] = v;
    }
  }
}

struct Writer {
  uint64_t seed;
  klein::ThreadPool* pool;
  std::atomic<int64_t>* bytes_done;

  // Writes `specs` into one safetensors file at `path` (atomically).
  Status write_file(const fs::path& path, const std::vector<Spec>& specs) {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (const auto& s : specs) {
      const uint64_t n = static_cast<uint64_t>(spec_bytes(s));
      h[s.name] = {{"dtype", std::string(klein::dtype_name(s.dtype))}, {"shape", s.shape}, {"data_offsets", {off, off + n}}};
      off += n;
    }
    std::string hs = h.dump();
    klein::pad_safetensors_header(hs);

    return klein::write_file_atomic(path, [&](std::FILE* f) {
      uint8_t len[8];
      const uint64_t L = hs.size();
      for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(L >> (8 * i));
      if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(hs.data(), 1, hs.size(), f) != hs.size()) return false;
      // Double buffering: fill one buffer with the pool while the other is being written.
      std::vector<uint8_t> buf[2];
      buf[0].resize(kBatchElems * 4);
      buf[1].resize(kBatchElems * 4);
      int cur = 0;
      std::future<bool> pending;
      bool ok = true;
      auto wait_pending = [&]() {
        if (pending.valid()) ok = pending.get() && ok;
      };
      for (const auto& s : specs) {
        const int64_t numel = klein::shape_numel(s.shape);
        const size_t es = klein::dtype_size(s.dtype);
        if (s.init.kind == Init::kZeroI64) {
          wait_pending();
          const int64_t zero = 0;
          ok = ok && std::fwrite(&zero, 1, 8, f) == 8;
          *bytes_done += 8;
          continue;
        }
        const uint64_t tseed = mix64(seed * 0x9E3779B97F4A7C15ull ^ fnv1a(s.name));
        for (int64_t b = 0; b < numel && ok; b += kBatchElems) {
          const int64_t e = std::min(numel, b + kBatchElems);
          uint8_t* dst = buf[cur].data();
          // kBatchElems is a multiple of kChunk, so chunks never straddle batches.
          const int64_t c0 = b / kChunk, c1 = (e + kChunk - 1) / kChunk;
          pool->parallel_for(c1 - c0, [&](int64_t lo, int64_t hi) {
            for (int64_t c = c0 + lo; c < c0 + hi; ++c) {
              const int64_t cb = c * kChunk, ce = std::min(e, cb + kChunk);
              fill_chunk(s, tseed, c, cb, ce, dst + (cb - b) * es);
            }
          });
          wait_pending();
          const size_t nbytes = static_cast<size_t>(e - b) * es;
          pending = std::async(std::launch::async, [f, dst, nbytes, this]() {
            const bool w = std::fwrite(dst, 1, nbytes, f) == nbytes;
            *bytes_done += static_cast<int64_t>(nbytes);
            return w;
          });
          cur ^= 1;
        }
      }
      wait_pending();
      return ok;
    });
  }
};

Status write_text_atomic(const fs::path& path, const std::string& text) {
  return klein::write_file_atomic(path, [&](std::FILE* f) {
    return std::fwrite(text.data(), 1, text.size(), f) == text.size();
  });
}

Status write_json(const fs::path& path, const nlohmann::json& j) { return write_text_atomic(path, j.dump(2) + "\n"); }

// Writes a component's weights: one file `<stem>.safetensors` when it fits in one shard,
// otherwise `<stem>-0000k-of-0000n.safetensors` + `<stem>.safetensors.index.json`. Stale
// weight files from an earlier run (another shard count, or an interrupted one) are removed
// afterwards.
Status write_component(Writer& w, const fs::path& dir, const std::string& stem, const std::vector<Spec>& specs,
                       int64_t max_shard_bytes, bool index_total_parameters) {
  std::vector<std::vector<Spec>> shards(1);
  int64_t cur = 0, total = 0, params = 0;
  for (const auto& s : specs) {
    const int64_t b = spec_bytes(s);
    if (!shards.back().empty() && cur + b > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(s);
    cur += b;
    total += b;
    params += klein::shape_numel(s.shape);
  }
  std::set<std::string> written;
  if (shards.size() == 1) {
    const std::string name = stem + ".safetensors";
    KLEIN_RETURN_IF_ERROR(w.write_file(dir / name, shards[0]));
    written.insert(name);
  } else {
    nlohmann::json wm = nlohmann::json::object();
    const int n = static_cast<int>(shards.size());
    for (int k = 0; k < n; ++k) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "-%05d-of-%05d.safetensors", k + 1, n);
      const std::string name = stem + buf;
      std::fprintf(stderr, "  %s (%d tensors)\n", (dir.filename() / name).string().c_str(),
                   static_cast<int>(shards[k].size()));
      KLEIN_RETURN_IF_ERROR(w.write_file(dir / name, shards[k]));
      written.insert(name);
      for (const auto& s : shards[k]) wm[s.name] = name;
    }
    nlohmann::json meta = {{"total_size", total}};
    if (index_total_parameters) meta["total_parameters"] = params;
    const std::string idx = stem + ".safetensors.index.json";
    KLEIN_RETURN_IF_ERROR(write_json(dir / idx, {{"metadata", meta}, {"weight_map", wm}}));
    written.insert(idx);
  }
  for (const auto& de : fs::directory_iterator(dir)) {
    const std::string fn = de.path().filename().string();
    // Weight files of an earlier run with another shard count, and temp files of an interrupted run.
    const bool weights = fn.ends_with(".safetensors") || fn.ends_with(".safetensors.index.json") ||
                         fn.find(".safetensors.tmp.") != std::string::npos;
    if (weights && !written.count(fn)) {
      std::error_code ec;
      fs::remove(de.path(), ec);
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------
// Configs
// ------------------------------------------------------------------------------------------

const char* kDiffusersVersion = "0.42.1";
const char* kTransformersVersion = "5.23.0";

nlohmann::json model_index(bool kv) {
  return {{"_class_name", kv ? "Flux2KleinKVPipeline" : "Flux2KleinPipeline"},
          {"_diffusers_version", kDiffusersVersion},
          {"is_distilled", true},
          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
          {"text_encoder", {"transformers", "Qwen3ForCausalLM"}},
          {"tokenizer", {"transformers", "Qwen2TokenizerFast"}},
          {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
          {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
}

nlohmann::json scheduler_config() {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"_diffusers_version", kDiffusersVersion},
          {"base_image_seq_len", 256},
          {"base_shift", 0.5},
          {"invert_sigmas", false},
          {"max_image_seq_len", 4096},
          {"max_shift", 1.15},
          {"num_train_timesteps", 1000},
          {"shift", 3.0},
          {"shift_terminal", nullptr},
          {"stochastic_sampling", false},
          {"time_shift_type", "exponential"},
          {"use_beta_sigmas", false},
          {"use_dynamic_shifting", true},
          {"use_exponential_sigmas", false},
          {"use_karras_sigmas", false}};
}

// As transformers 5.23 writes Qwen3Config(...).save_pretrained for Qwen/Qwen3-4B.
nlohmann::json text_encoder_config(int layers, DType dt) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int i = 0; i < layers; ++i) layer_types.push_back("full_attention");
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", 151643},
          {"dtype", dt == DType::kBF16 ? "bfloat16" : "float32"},
          {"eos_token_id", 151645},
          {"head_dim", g.qw_head_dim},
          {"hidden_act", "silu"},
          {"hidden_size", g.qw_hidden},
          {"initializer_range", 0.02},
          {"intermediate_size", g.qw_inter},
          {"layer_types", layer_types},
          {"max_position_embeddings", 40960},
          {"max_window_layers", layers},
          {"model_type", "qwen3"},
          {"num_attention_heads", g.qw_heads},
          {"num_hidden_layers", layers},
          {"num_key_value_heads", g.qw_kv_heads},
          {"pad_token_id", nullptr},
          {"rms_norm_eps", 1e-06},
          {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", true},
          {"transformers_version", kTransformersVersion},
          {"use_cache", true},
          {"use_sliding_window", false},
          {"vocab_size", g.qw_vocab}};
}

nlohmann::json generation_config() {
  return {{"_from_model_config", true},
          {"bos_token_id", 151643},
          {"eos_token_id", 151645},
          {"output_attentions", false},
          {"output_hidden_states", false},
          {"transformers_version", kTransformersVersion},
          {"use_cache", true}};
}

nlohmann::json transformer_config() {
  return {{"_class_name", "Flux2Transformer2DModel"},
          {"_diffusers_version", kDiffusersVersion},
          {"attention_head_dim", g.tr_head_dim},
          {"axes_dims_rope", {32, 32, 32, 32}},
          {"eps", 1e-06},
          {"guidance_embeds", false},
          {"in_channels", g.tr_in},
          {"joint_attention_dim", g.tr_ctx},
          {"mlp_ratio", 3.0},
          {"num_attention_heads", g.tr_d / g.tr_head_dim},
          {"num_layers", g.tr_double},
          {"num_single_layers", g.tr_single},
          {"out_channels", nullptr},
          {"patch_size", 1},
          {"rope_theta", 2000},
          {"timestep_guidance_channels", g.tr_time}};
}

// The real klein-4B vae/config.json (it carries force_upcast, which diffusers 0.42 ignores).
nlohmann::json vae_config() {
  const std::vector<std::string> down(4, "DownEncoderBlock2D"), up(4, "UpDecoderBlock2D");
  return {{"_class_name", "AutoencoderKLFlux2"},
          {"_diffusers_version", kDiffusersVersion},
          {"act_fn", "silu"},
          {"batch_norm_eps", 0.0001},
          {"batch_norm_momentum", 0.1},
          {"block_out_channels", {kVaeCh[0], kVaeCh[1], kVaeCh[2], kVaeCh[3]}},
          {"down_block_types", down},
          {"force_upcast", true},
          {"in_channels", 3},
          {"latent_channels", kVaeLatent},
          {"layers_per_block", kVaeLayers},
          {"mid_block_add_attention", true},
          {"norm_num_groups", 32},
          {"out_channels", 3},
          {"patch_size", {2, 2}},
          {"sample_size", 1024},
          {"up_block_types", up},
          {"use_post_quant_conv", true},
          {"use_quant_conv", true}};
}

Status copy_tokenizer(const fs::path& src, const fs::path& dst) {
  std::error_code ec;
  if (!fs::is_directory(src, ec))
    return klein::not_found(src.string() + ": tokenizer folder not found (pass --tokenizer DIR, e.g. tests/data/tiny/tokenizer)");
  if (!fs::exists(src / "tokenizer.json", ec))
    return klein::not_found((src / "tokenizer.json").string() + ": missing; --tokenizer must name a folder with tokenizer.json");
  for (const auto& de : fs::recursive_directory_iterator(src)) {
    const fs::path rel = fs::relative(de.path(), src);
    if (de.is_directory()) {
      fs::create_directories(dst / rel, ec);
      continue;
    }
    if (!de.is_regular_file()) continue;
    const fs::path tmp = (dst / rel).string() + ".tmp." + std::to_string(::getpid());
    fs::copy_file(de.path(), tmp, fs::copy_options::overwrite_existing, ec);
    if (ec) return klein::io_error(tmp.string() + ": cannot copy from " + de.path().string() + " (" + ec.message() + ")");
    fs::rename(tmp, dst / rel, ec);
    if (ec) return klein::io_error((dst / rel).string() + ": cannot rename into place (" + ec.message() + ")");
  }
  return Status::Ok();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int fail(const Status& s) {
  std::fprintf(stderr, "klein-make_random_model: %s\n", s.to_string().c_str());
  return s.code() == klein::Code::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a seeded random-weight FLUX.2 [klein] 4B or 9B model (real architecture and diffusers layout) for "
               "benchmarks",
               "klein-make_random_model"};
  std::string out, tokenizer, dtype_s = "bf16", family = "4b";
  uint64_t seed = 0;
  int text_layers = 36;
  int threads = 0;
  int64_t max_shard_mb = 2000;
  const fs::path default_tok = fs::path(__FILE__).parent_path().parent_path() / "tests" / "data" / "tiny" / "tokenizer";
  app.add_option("--out", out, "Output folder (created; existing files are overwritten)")->required();
  app.add_option("--seed", seed, "PRNG seed")->capture_default_str();
  app.add_option("--tokenizer", tokenizer,
                 "Folder whose files are copied into tokenizer/ (default: " + default_tok.string() + ")");
  app.add_option("--dtype", dtype_s, "Weight storage type")->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  app.add_option("--text-layers", text_layers, "Qwen3 decoder layers to write (real: 36; klein uses 0..26)")
      ->check(CLI::Range(1, 36))
      ->capture_default_str();
  app.add_option("--family", family,
                 "4b (Qwen3-4B encoder), 9b (Qwen3-8B encoder) or 9b-kv (9B under Flux2KleinKVPipeline)")
      ->check(CLI::IsMember({"4b", "9b", "9b-kv"}))
      ->capture_default_str();
  app.add_option("--threads", threads, "Fill threads (0 = all cores)")->capture_default_str();
  app.add_option("--max-shard-mb", max_shard_mb, "Largest shard size in MB (1e6 bytes)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  const DType dt = dtype_s == "f32" ? DType::kF32 : DType::kBF16;
  g = family == "4b" ? k4B : k9B;
  const fs::path root(out);
  const fs::path tok_src = tokenizer.empty() ? default_tok : fs::path(tokenizer);
  const int64_t max_shard = max_shard_mb * 1000 * 1000;

  std::error_code ec;
  for (const char* sub : {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"}) {
    fs::create_directories(root / sub, ec);
    if (ec) return fail(klein::io_error((root / sub).string() + ": cannot create (" + ec.message() + ")"));
  }

  const auto t0 = std::chrono::steady_clock::now();
  klein::ThreadPool pool(threads);
  std::atomic<int64_t> bytes_done{0};
  Writer w{seed, &pool, &bytes_done};

  Status st = copy_tokenizer(tok_src, root / "tokenizer");
  if (!st.ok()) return fail(st);
  st = write_json(root / "scheduler" / "scheduler_config.json", scheduler_config());
  if (!st.ok()) return fail(st);

  struct Comp {
    const char* name;
    std::vector<Spec> specs;
    std::string stem;
    bool total_params;
  };
  std::vector<Comp> comps;
  comps.push_back({"vae", vae_specs(dt), "diffusion_pytorch_model", false});
  comps.push_back({"transformer", transformer_specs(dt), "diffusion_pytorch_model", false});
  comps.push_back({"text_encoder", text_encoder_specs(dt, text_layers), "model", true});

  for (auto& c : comps) {
    const auto tc = std::chrono::steady_clock::now();
    int64_t bytes = 0, params = 0;
    for (const auto& s : c.specs) {
      bytes += spec_bytes(s);
      params += klein::shape_numel(s.shape);
    }
    std::fprintf(stderr, "%s: %zu tensors, %lld parameters, %.2f GB\n", c.name, c.specs.size(),
                 static_cast<long long>(params), bytes / 1e9);
    const fs::path dir = root / c.name;
    const std::string cname = c.name;
    if (cname == "vae") st = write_json(dir / "config.json", vae_config());
    if (cname == "transformer") st = write_json(dir / "config.json", transformer_config());
    if (cname == "text_encoder") {
      st = write_json(dir / "config.json", text_encoder_config(text_layers, dt));
      if (st.ok()) st = write_json(dir / "generation_config.json", generation_config());
    }
    if (!st.ok()) return fail(st);
    // A single VAE file, as in the real repo.
    const int64_t limit = cname == "vae" ? INT64_MAX : max_shard;
    st = write_component(w, dir, c.stem, c.specs, limit, c.total_params);
    if (!st.ok()) return fail(st);
    const double dtc = seconds_since(tc);
    std::fprintf(stderr, "%s: written in %.1f s (%.0f MB/s)\n", c.name, dtc, bytes / 1e6 / std::max(dtc, 1e-9));
  }

  st = write_json(root / "model_index.json", model_index(family == "9b-kv"));
  if (!st.ok()) return fail(st);
  const double dt_all = seconds_since(t0);
  std::fprintf(stderr, "done: %s, %.2f GB of weights in %.1f s (%d threads, seed %llu, %s)\n", root.string().c_str(),
               bytes_done.load() / 1e9, dt_all, pool.size(), static_cast<unsigned long long>(seed), dtype_s.c_str());
  return 0;
}
