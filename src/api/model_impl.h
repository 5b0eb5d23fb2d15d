// Model's private state and the request steps shared by its public phases and generate().
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/components.h"
#include "api/layout.h"
#include "api/memory_needs.h"
#include "io/model_folder.h"
#include "klein/klein.h"
#include "pipeline/prompt_encoder.h"
#include "pipeline/references.h"
#include "pipeline/scheduler.h"
#include "pipeline/tokenizer.h"

namespace klein {

// Hidden even though Model is exported: the Impl is private to libklein.
struct [[gnu::visibility("hidden")]] Model::Impl {
  std::string path;
  LoadOptions options;
  bool tokenizer_only = false;
  std::optional<Tokenizer> tokenizer;
  std::unique_ptr<api::Engine> engine;

  // Parsed once at open (the full model only).
  api::Layout layout;
  api::ComponentSpec te_spec, dit_spec, vae_spec;
  Qwen3Config te_cfg;
  Flux2Config dit_cfg;
  Flux2VaeConfig vae_cfg;
  FlowMatchConfig sched_cfg;

  // Kept with MemoryPolicy::kResident; null with kLow (loaded per phase).
  std::shared_ptr<const Qwen3Encoder> te;
  std::shared_ptr<const Flux2Transformer> dit;
  std::shared_ptr<const Flux2Vae> vae;

  // The variant (layout.distilled, or --variant base): base models run classifier-free
  // guidance and default to 50 steps, distilled ones to 4 with no guidance.
  bool distilled = true;
  // The KV-cached editing distill (layout.kv): an edit's first step runs the references and caches
  // their keys and values (KvPredictor).
  bool kv = false;

  // With a memory budget: the weights' sizes (measured at open) and the running phase's plan
  // (scratch of the phase that holds `mu`; the Model is otherwise immutable after open).
  std::optional<api::WeightSizes> sizes;
  mutable std::optional<api::MemoryPlan> plan;

  // One phase at a time: the thread pool and the models' scratch are not reentrant.
  mutable std::mutex mu;
  // The running request's own LoRAs (GenerateRequest::loras; set under `mu` for one request):
  // text_encoder() and transformer() hand out a copy of the model with them at run time.
  mutable const std::vector<LoraSpec>* request_loras = nullptr;

  Status require_full_model(const char* what) const;
  Result<std::shared_ptr<const Qwen3Encoder>> text_encoder() const;
  Result<std::shared_ptr<const Flux2Transformer>> transformer(const RunContext& ctx) const;
  Result<std::shared_ptr<const Flux2Vae>> vae_model() const;
  // With a budget: plans a request of this size (or fails with what it needs) before any work;
  // the plan is noted through `log`. Without one: clears the plan.
  // encode_only: a prompt encoded on its own (Model::encode_prompt), the text encoder's phase alone.
  // cfg: the request runs classifier-free guidance (a second prediction, negative embeddings).
  Status plan_request(int width, int height, int64_t ref_tokens, const std::function<void(const std::string&)>& log,
                      bool encode_only = false, bool cfg = false, bool inpaint = false) const;
  // What such a request needs (the process as it is now included), from the weights' sizes `w`.
  api::MemoryNeeds needs_for(const api::WeightSizes& w, int width, int height, int64_t ref_tokens, bool encode_only,
                             bool cfg, bool inpaint) const;
  // The VAE's tiling from the load options (and the plan).
  VaeTiling vae_tiling() const;

  // Resolves the output size (0: the first reference's, else 1024; floored to multiples of 16
  // with a note through `log`) and the step count (0: 4 distilled, 50 base).
  struct Geometry {
    int width = 0, height = 0, steps = 0;
    std::vector<double> sigmas;  // custom sigmas (steps == their count); empty: the linspace
    double shift = 0;            // > 0: a static shift in place of the dynamic one
  };
  Result<Geometry> resolve(int width, int height, int steps, const std::pair<int, int>* first_ref,
                           const std::function<void(const std::string&)>& log) const;
  // The schedule overrides of DenoiseParams (checked; `steps` the steps asked for, 0: none).
  static Status set_schedule(Geometry& g, int steps, const std::vector<double>& sigmas, double shift);
  // The guidance scale a request runs with: `requested` (< 0: the model's default, 4.0) and
  // whether CFG is on (base models at a scale > 1, as diffusers' do_classifier_free_guidance).
  struct Guidance {
    float scale = 1.0f;
    bool cfg = false;
  };
  Result<Guidance> guidance(double requested, const std::function<void(const std::string&)>& log) const;

  // The request steps on internal tensors (the caller holds `mu`).
  // Encodes each prompt in turn with one load of the text encoder.
  Result<std::vector<PromptEncoding>> encode_prompts(const std::vector<std::string>& prompts, int max_length,
                                                     const RunContext& ctx) const;
  Result<PromptEncoding> encode_prompt(const std::string& prompt, int max_length, const RunContext& ctx) const;
  // Checks prompt embeddings [1, L, joint_attention_dim] against the transformer.
  Status check_embeds(const Tensor& embeds) const;
  // uncond: the negative prompt's embeddings when classifier-free guidance runs (scale > 1),
  // else null. With `preview` set, it is called after every step (a live preview, pipeline/preview.h).
  // `held`: the transformer, already loaded by the caller (a batch keeps it for all its seeds);
  // null: loaded here (kLow: released on return).
  // Inpainting / image-to-image (pipeline/inpaint.h): the source's normalised latents
  // [1, 128, th, tw] (also ref_latents[0]), one mask weight per token, the strength in (0, 1].
  struct Inpaint {
    const Tensor* image_latents = nullptr;
    const std::vector<float>* mask = nullptr;
    double strength = 1.0;
  };
  // `inpaint`: the schedule cut by the strength, the start noised from the source latents and
  // the mask's blend after every step (null: text-to-image / editing).
  Result<Tensor> denoise(const Tensor& embeds, const Tensor* uncond, float guidance_scale,
                         const std::vector<Tensor>& ref_latents, const Geometry& g, Tensor noise,
                         const RunContext& ctx, const std::function<void(int, int, const Image&)>& preview = {},
                         std::shared_ptr<const Flux2Transformer> held = nullptr, const Inpaint* inpaint = nullptr) const;
};

// The noise for a request: `given` (checked against the size; `name` names it in errors) or
// torch's seeded draw.
Result<Tensor> make_noise(const FloatArray* given, const std::string& name, int width, int height, uint64_t seed,
                          bool bf16);
// A path's last component ("dir/" gives "dir"): what an image's metadata names (privacy).
std::string last_path_component(const std::string& p);
// A guidance scale as a message shows it ("4", "7.5").
std::string format_scale(double g);

// Copies between the public arrays and engine tensors.
FloatArray to_array(const Tensor& t);
Result<Tensor> to_tensor(const FloatArray& a, const std::string& what);

}  // namespace klein
