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

  // With a memory budget: the weights' sizes (measured at open) and the running request's plan.
  std::optional<api::WeightSizes> sizes;
  std::optional<api::MemoryPlan> plan;

  // One request at a time: the thread pool and the models' scratch are not reentrant.
  std::mutex mu;

  Status require_full_model(const char* what) const;
  Result<std::shared_ptr<const Qwen3Encoder>> text_encoder();
  Result<std::shared_ptr<const Flux2Transformer>> transformer(const RunContext& ctx);
  Result<std::shared_ptr<const Flux2Vae>> vae_model();
  // With a budget: plans a request of this size (or fails with what it needs) before any work;
  // the plan is noted through `log`. Without one: clears the plan.
  // encode_only: a prompt encoded on its own (Model::encode_prompt), the text encoder's phase alone.
  Status plan_request(int width, int height, int64_t ref_tokens, const std::function<void(const std::string&)>& log,
                      bool encode_only = false);
  // The VAE's tiling from the load options (and the plan).
  VaeTiling vae_tiling() const;

  // Resolves the output size (0: the first reference's, else 1024; floored to multiples of 16
  // with a note through `log`) and the step count.
  struct Geometry {
    int width = 0, height = 0, steps = 0;
  };
  Result<Geometry> resolve(int width, int height, int steps, const std::pair<int, int>* first_ref,
                           const std::function<void(const std::string&)>& log) const;

  // The request steps on internal tensors (the caller holds `mu`).
  Result<PromptEncoding> encode_prompt(const std::string& prompt, int max_length, const RunContext& ctx);
  // With `preview` set, it is called after every step (a live preview, pipeline/preview.h).
  Result<Tensor> denoise(const Tensor& embeds, const std::vector<Tensor>& ref_latents, const Geometry& g,
                         Tensor noise, const RunContext& ctx,
                         const std::function<void(int, int, const Image&)>& preview = {});
};

// Copies between the public arrays and engine tensors.
FloatArray to_array(const Tensor& t);
Result<Tensor> to_tensor(const FloatArray& a, const std::string& what);

}  // namespace klein
