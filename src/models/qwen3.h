// Qwen3 decoder used as FLUX.2 [klein]'s text encoder: token ids -> the residual-stream hidden
// states after selected layers (klein taps 9/18/27, i.e. after 0-based layers 8, 17, 26).
// Only the layers up to the deepest tap are loaded and run; later layers, the final norm and the
// LM head are never touched.
#pragma once

#include <functional>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/run_context.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "io/tensor_source.h"

namespace klein {

struct Qwen3Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool attention_bias = false;

  // Reads a transformers Qwen3 config.json (v4 or v5 spelling of the RoPE settings).
  static Result<Qwen3Config> from_json(const nlohmann::json& j, const std::string& where);
};

class Qwen3Encoder {
 public:
  // Binds the text encoder's layers [0, num_layers_needed) from `src` (config: a transformers
  // config.json, `config_where` names it in messages). Tensors of later layers, model.norm and
  // lm_head are ignored; any other tensor the config does not account for is an error. Weights
  // stay in the source's storage and format.
  static Result<Qwen3Encoder> load(std::shared_ptr<const TensorSource> src, const nlohmann::json& config,
                                   const std::string& config_where, int num_layers_needed);
  // The same from a folder with config.json + safetensors.
  static Result<Qwen3Encoder> load(const std::filesystem::path& dir, int num_layers_needed);

  const Qwen3Config& config() const { return cfg_; }
  // The tensor table: one row per file tensor the encoder binds (the embedding, then each loaded
  // layer's), in load order — its transformers name, the shape the config gives it, its block
  // (the layer; -1 for the embedding) and where the model keeps it. Loading, for_each_weight and
  // the per-block walk of streaming read it; the only weight outside it is a layer's gate_up,
  // which load makes of two of its rows (gate and up, then left empty).
  struct TensorRow {
    std::string name;
    Shape shape;
    int block = -1;
    Weight* weight = nullptr;
  };
  // The embedding's row and those of layers [first, last) (load sizes layers_ first), pointing
  // into this model; the per-layer walk asks for one layer's rows only.
  std::vector<TensorRow> tensor_table(int first, int last) const;
  // Splits each [gate; up] stacked at load back into gate and up (row views, no copy), so that a
  // LoRA can change either (models/lora_apply.h); the MLP then runs two linears.
  void unstack_mlp();
  // Calls fn on every weight the model holds (empty optional ones included), stopping at the
  // first error: weight preparation for a backend, memory accounting, `klein info`.
  Status for_each_weight(const std::function<Status(Weight&)>& fn);
  // Blocks in run order (the loaded layers) and the weights of one of them: what a
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
  int loaded_layers() const { return static_cast<int>(layers_.size()); }

  // ids/mask: [L]. Returns [L, taps.size() * hidden]: per token, the hidden states
  // hidden_states[t] for t in `taps` (index 0 = embeddings, t = output of layer t-1) concatenated.
  // Dumps "te.hidden_<t>" for each tap and "te.layer<i>.*" intermediates when asked.
  Result<Tensor> encode(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask,
                        const std::vector<int>& taps, const RunContext& ctx) const;
  // Decoder layers [first, last) applied to a given residual stream x [L, hidden] — a reference's
  // hidden_states[first] — with the key-padding mask [L] (positions 0..L-1, as encode); returns
  // hidden_states[last] (raw: the final norm is not applied). The teacher-forced tests compare
  // single layers with it, so that a difference cannot come from the layers before.
  Result<Tensor> run_layers(const Tensor& x, const std::vector<int32_t>& mask, int first, int last,
                            const RunContext& ctx) const;

 private:
  struct Buffers;  // per-call activations shared by the layers (qwen3_forward.cpp)
  Status make_buffers(int64_t L, Backend& be, Buffers& b) const;
  // One decoder layer on the residual stream x [L, H], in place.
  Status layer(int i, const TensorView& x, Buffers& b, const AttnMask& mask, const RunContext& ctx) const;

  struct Layer {
    Weight input_norm, q, k, v, q_norm, k_norm, o, post_norm, gate, up, down;
    // [gate; up] as one weight when up's rows follow gate's in memory (Weight::stacked_with); gate
    // and up are then empty and the MLP's input is one linear with the SwiGLU in its epilogue.
    Weight gate_up;
    Weight q_bias, k_bias, v_bias, o_bias;  // only with attention_bias
    // The four norm weights above as float32, converted once at load.
    std::vector<float> input_norm_f32, q_norm_f32, k_norm_f32, post_norm_f32;
  };
  Qwen3Config cfg_;
  std::shared_ptr<const TensorSource> source_;  // keeps the weights' storage alive
  Weight embed_;
  std::vector<Layer> layers_;
  // model.norm as float32, loaded only when the last layer is tapped (see load()).
  std::vector<float> final_norm_f32_;
};

}  // namespace klein
