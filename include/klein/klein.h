// klein.cpp public C++ API: FLUX.2 [klein] text-to-image and reference-image editing.
//
// Two ways in:
//   * klein::Model — open a diffusers folder once (configs, scheduler and tokenizer parsed once;
//     with MemoryPolicy::kResident the weights mapped once too) and run any number of requests,
//     whole (generate, generate_batch) or phase by phase (encode_prompt, encode_references,
//     denoise, decode).
//   * klein::Session — one request's state on a Model (prompt embeddings, references, latents):
//     phases encode_prompt, set_references, denoise, decode, with classifier-free guidance for
//     base models and several seeds per encoded prompt. Model::generate is a Session underneath.
//   * klein::generate(GenerateOptions) — one-shot convenience: opens, runs, closes.
//
// Every call returns a Status (or Result<T>); no exception ever leaves the library (an
// allocation failure is Code::kOutOfMemory, any other escaped exception Code::kInternal).
// Messages are one line naming the file, tensor or option at fault. Public value types hold
// plain std::vector data; no engine-internal type appears here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "klein/export.h"
#include "klein/status.h"

namespace klein {

// An 8-bit RGB image, row-major, height * width * 3 bytes.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

// A dense float32 array, row-major (C order).
struct FloatArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// encode_prompt's result: prompt_embeds [1, max_length, 3 * hidden] plus the tokens behind it.
struct PromptEmbeddings : FloatArray {
  std::vector<int32_t> ids, mask;  // max_length each
  int num_real_tokens = 0;         // tokens before the padding
  int untruncated_length = 0;      // tokens the templated prompt had before truncation
};

// encode_references' result: per reference image, its VAE latent mean, patchified and
// batch-norm normalised, [1, 128, H/16, W/16] (H, W: the preprocessed image size).
struct ReferenceLatents {
  std::vector<FloatArray> latents;
  std::vector<std::string> paths;
  bool empty() const { return latents.empty(); }
};

// denoise's result: the final latents [1, 128, H/16, W/16] in the transformer's normalised space.
struct Latents : FloatArray {};

enum class MemoryPolicy {
  kLow,       // one component resident at a time, loaded for its phase and released after (default)
  kResident,  // text encoder, transformer and VAE mapped once at open and kept for every request
};

// The arithmetic of the matrix products (Linear layers, and on CUDA the VAE's convolutions).
enum class Precision {
  kFp32,  // float32 arithmetic on the stored weights: the exact path, equal to diffusers' float32
          // pipeline, for fidelity work; on CUDA float32 cuBLASLt GEMMs (no TF32) on weights
          // dequantised to f32 at upload
  kFast,  // (default: about 2x faster, and closer to diffusers' float32 picture than diffusers' own
          // bf16 pipeline is) the CPU's dot-product kernels for whatever the weights are: bf16 dot products
          // (activations rounded to bf16) with AVX512_BF16 where they out-run float32 FMA (not
          // on Intel cores, unless isa = "avx512_bf16"), int8 W8A8 for Q8_ROW weights and W4A8
          // for Q4_G64 (AVX512_VNNI or AVX2; activations quantized per token); float32 otherwise,
          // the VAE's same-padded 3×3 convs then in Winograd form F(2×2, 3×3) (AVX2 / AVX-512F).
          // On CUDA: bf16 GEMMs with float32 accumulation (weights uploaded as
          // bf16, quantized ones dequantised to bf16 at upload)
};

// Which processor runs the models.
enum class BackendKind {
  kAuto,  // CUDA when this build has the CUDA backend, a device is visible and no max_memory_gib
          // budget is set (the budget plans host memory); otherwise the CPU (default)
  kCpu,
  kCuda,  // an NVIDIA GPU (builds configured with -DKLEIN_CUDA=ON): weights uploaded once per
          // component as `memory` says; the tokenizer, scheduler, noise and image I/O stay on
          // the host. Fails at open without a device, or in a build without the backend
};

// The most worker threads an engine, a one-shot call or quantize_model takes (a larger
// `threads` is refused: each is an OS thread).
inline constexpr int kMaxThreads = 1024;

// Which training a model file holds. Only a diffusers folder says it (model_index.json's
// is_distilled); single files are shape-identical, so the caller says it or distilled is assumed.
enum class Variant {
  kAuto,       // a folder's is_distilled; for single files distilled (with a note when a file
               // name contains "base")
  kDistilled,  // the 4-step distilled model
  kBase,       // the undistilled base model: classifier-free guidance (scale 4.0) and 50 steps by default
  kKv,         // the KV-cached reference-editing distill (klein 9B-KV, diffusers' Flux2KleinKVPipeline):
               // distilled; an edit's references run once, in the first step, and every block's
               // reference keys and values are cached for the later steps (a folder says it by its
               // model_index.json class)
};

// How LoRAs change the model (docs/lora.md).
enum class LoraMode {
  kAuto,     // merged into float weights (F32/BF16/F16) at load, at run time on the others (quantized)
  kMerge,    // merged at load: W + s·(alpha/rank)·B·A, as diffusers' fuse_lora; quantized weights refuse
  kRuntime,  // kept beside the weights: y += s·(alpha/rank)·(x·Aᵀ)·Bᵀ after each changed linear (CPU)
};

// A LoRA file (diffusers/PEFT, BFL-named PEFT from ai-toolkit / fal / ComfyUI, kohya / musubi-tuner,
// LyCORIS LoKr / LoHa; safetensors) and its strength (multiplies alpha / rank; |scale| ≤ 100).
struct LoraSpec {
  std::string path;
  float scale = 1.0f;
};

struct LoadOptions {
  int threads = 0;                       // worker threads; 0: all cores; at most kMaxThreads
  MemoryPolicy memory = MemoryPolicy::kLow;
  std::string isa;                       // "": the fastest kernels this CPU has; else a ceiling: "scalar", "avx2", ...
                                         // (one this CPU has: naming another is an error)
                                         // ("avx512_bf16" also forces bf16 dot products where float32 is faster)
  // Seamless tiled VAE decoding/encoding (equal to the whole-image pass to float rounding, in a
  // fraction of the memory): the tile size in image pixels (a multiple of 8, else Model::open
  // refuses it); 0: automatic —
  // 512-pixel tiles when the whole-image pass would need more than vae_tile_above_gib of
  // activations (about 1024² and beyond); < 0: never.
  int vae_tile = 0;
  double vae_tile_above_gib = 4.0;
  Precision precision = Precision::kFast;
  // A memory budget in GiB for each request (weights, activations and kernel scratch; peak RSS
  // as getrusage sees it); 0: none (as before). With a budget the engine plans every request
  // before any work: components loaded as the policy says, or the text encoder's and the
  // transformer's weights streamed block by block from their mapped files (slower: each step
  // reads the transformer again from the page cache), and the VAE tile size from what remains.
  // A request that cannot fit fails before any work with the size it needs.
  double max_memory_gib = 0;
  BackendKind backend = BackendKind::kAuto;
  // Separate component files (safetensors: BFL / ComfyUI / diffusers / transformers names, with or
  // without ComfyUI's all-in-one prefixes; GGUF: ComfyUI-GGUF, sd.cpp, llama.cpp Qwen3), each replacing that component of the model path, or
  // giving it when the model path is empty or a single file that lacks it. Empty: none.
  std::string diffusion_model, text_encoder, vae;
  Variant variant = Variant::kAuto;
  // A manifest (make_manifest / `klein manifest`) that the files this load reads are checked
  // against before anything is loaded: the same files, each of the recorded size and SHA-256
  // (hashed on `threads` threads at disk speed). Empty: no check.
  std::string verify_manifest;
  // LoRAs applied, in order, to the transformer and the text encoder each time they are loaded
  // (so once with kResident); a key that matches no weight of this model is a load error.
  std::vector<LoraSpec> loras;
  LoraMode lora_mode = LoraMode::kAuto;
};

// The largest max_memory_gib / vae_tile_above_gib accepted (a budget beyond it means nothing).
inline constexpr double kMaxMemoryGib = 1e6;

// The checks Model::open makes of `options` before it reads anything: threads (0 to kMaxThreads),
// isa ("" or a known name that this CPU has), vae_tile (a multiple of 8; 0 or < 0 as documented),
// max_memory_gib and vae_tile_above_gib (finite, 0 to kMaxMemoryGib), precision and backend
// (known values). An error names the field first ("max_memory_gib nan: ..."), so a front end
// can put its own option's name in its place.
KLEIN_API Status check_load_options(const LoadOptions& options);

// Caller hooks. All are optional and called on the calling thread.
struct Callbacks {
  // Phase ("tokenize", "encode", "vae encode", "load transformer", "denoise", "decode"), done, total.
  // A report comes after the work it counts has finished, on a GPU too (the backend is
  // synchronised first), so the times between reports are the phases' real times.
  std::function<void(const std::string& phase, int done, int total)> progress;
  // Polled between layers and steps; returning true stops the call with Code::kCancelled.
  std::function<bool()> cancel;
  // Warnings and notes (e.g. a size floored to a multiple of 16).
  std::function<void(const std::string&)> log;
  // A live preview after each denoising step (step = 1..total), at the output size: the step's
  // predicted clean latent x0 = x − σ·v projected to RGB by a fixed linear map of the 32 VAE
  // latent channels (no VAE run; a few ms at 1024²), nearest-upsampled. Setting it costs, in
  // MemoryPolicy::kLow, one extra mapping of the VAE for its batch-norm statistics.
  std::function<void(int step, int total, const Image& preview)> preview;
};

// Named intermediates written as .npy for debugging (README "Correctness"); empty dir: none.
struct DumpOptions {
  std::string dir;
  std::string filter;  // comma-separated name parts; empty: all
};

struct EncodeOptions {
  int max_length = 512;  // klein's text sequence length
  DumpOptions dump;
};

struct DenoiseParams {
  int width = 0;    // 0: the first reference's width, else 1024; floored to a multiple of 16
  int height = 0;   // 0: the first reference's height, else 1024; floored to a multiple of 16
  int steps = 0;    // 0: 4 for distilled models, 50 for base models (diffusers' default)
  uint64_t seed = 0;
  bool bf16_noise = false;   // draw the noise as torch does for a bfloat16 pipeline
  FloatArray noise;          // if not empty: the initial noise [1, 128, H/16, W/16] instead of `seed`
  std::string noise_name;    // names `noise` in error messages (e.g. its .npy path)
  DumpOptions dump;
  // Schedule overrides, as diffusers allows them. sigmas: the custom sigmas of
  // Flux2KleinPipeline(sigmas=..., num_inference_steps=len(sigmas)) (1 to 1000 values in [0, 1],
  // shifted by the scheduler as its linspace would be); steps must then be 0 or their count.
  // shift > 0: the scheduler with use_dynamic_shifting false and that static shift
  // (shift·σ / (1 + (shift − 1)·σ)) in place of the resolution-dependent mu; 0: the config's.
  std::vector<double> sigmas;
  double shift = 0;
};

// An encoded image file held in memory (PNG/JPEG/WebP bytes, detected from the content): decoded
// exactly as the same file on disk would be. `name` stands for it in errors and metadata (its last
// path component only); no file is opened.
struct ReferenceImage {
  std::string name;
  std::vector<uint8_t> data;
};

// Inpainting and image-to-image, as diffusers' Flux2KleinInpaintPipeline: the output takes the
// source image's size (above 1024² pixels scaled down to about 1024², then resized to multiples
// of 16), denoising starts from the source's latents noised to the strength's step, and after
// every step the source (noised to the next step) is put back where the mask keeps it. The source
// is also the first reference image of every step (further references follow it).
struct InitImage {
  std::string path;          // the source image file (PNG/JPEG/WebP); or
  ReferenceImage data;       // the source from memory (used when path is empty)
  // The mask: white = repaint, black = keep (grey levels binarised at 50% after resizing to the
  // image's size, whatever its own). None: image-to-image (everything repainted).
  std::string mask_path;
  ReferenceImage mask_data;  // the mask from memory (used when mask_path is empty)
  // How far from the source: of the N steps' schedule, the steps from int(N − N·strength) on run
  // (diffusers' get_timesteps); 1 starts from pure noise. (0, 1]; < 0: 0.8 (diffusers' default).
  double strength = -1;
  bool empty() const { return path.empty() && data.data.empty(); }
  bool has_mask() const { return !mask_path.empty() || !mask_data.data.empty(); }
};

struct GenerateRequest {
  std::string prompt;
  int width = 0, height = 0, steps = 0;  // as DenoiseParams
  // Classifier-free guidance, as SessionOptions (base models; distilled ones ignore it).
  double guidance_scale = -1;
  std::string negative_prompt;
  uint64_t seed = 0;
  std::string noise_npy;     // if set: initial noise (1, 128, H/16, W/16) from this .npy
  // If set: prompt_embeds [1, T, 3·hidden] (float32 .npy, e.g. from `klein encode`) used instead of
  // encoding `prompt` (which is then only recorded in the metadata and may be empty).
  std::string prompt_embeds_npy;
  bool bf16_noise = false;
  std::vector<std::string> reference_images;  // editing: 1..N image files (PNG/JPEG/WebP)
  DumpOptions dump;
  std::vector<ReferenceImage> reference_data;  // editing from memory: after reference_images, in order
  // Inpainting / image-to-image (empty: none). The output then has the source's size (width and
  // height are not used) and, on base models, guidance_scale < 0 means 8.0 (the inpainting
  // pipeline's default).
  InitImage init_image;
  std::vector<double> sigmas;  // schedule overrides, as DenoiseParams
  double shift = 0;
  // This request's LoRAs, on top of LoadOptions::loras and at run time (LoraMode::kRuntime, CPU
  // backend): the loaded weights are not changed, so a resident model serves each request with
  // its own LoRAs (the server's `lora` field). Read from their files for each request.
  std::vector<LoraSpec> loras;
};

struct GenerateResult {
  Image image;
  int width = 0, height = 0, steps = 0;
  // Parameters worth recording with the image (prompt, seed, steps, size, model, version).
  std::vector<std::pair<std::string, std::string>> metadata;
};

struct TokenizeResult {
  std::vector<int32_t> ids;
  std::vector<int32_t> mask;  // only with a max_length
};

// What `klein info` prints: a model's components (from a folder or files), configs and weights.
struct ComponentSummary {
  std::string name, class_name, library, dir;  // dir: the component's folder or file
  std::string scheme, family;  // naming scheme ("diffusers", "BFL", "LDM", "transformers") and what it is
  std::string description;     // one line (detection's), e.g. "FLUX.2 [klein] 4B transformer, BFL names (…)"
  std::string error;  // non-empty: missing or unreadable (the rest may be partial)
  // The file's container where it says more than its tensors, e.g. "GGUF v3 by ComfyUI-GGUF,
  // architecture flux" (producer from the metadata: ComfyUI-GGUF, stable-diffusion.cpp, llama.cpp).
  std::string container;
  std::vector<std::pair<std::string, std::string>> config;  // scalar / short numeric config entries, JSON text
  bool has_weights = false;
  size_t files = 0, tensors = 0;
  double parameters = 0;
  uint64_t bytes = 0;
  struct DTypeShare {
    std::string dtype;  // "BF16", "F32", "Q4_K", ...
    size_t tensors = 0;  // as the model binds them (a fused qkv counts as its three matrices)
    double parameters = 0;
    uint64_t bytes = 0;
  };
  std::vector<DTypeShare> by_dtype;
};

struct ModelInfo {
  std::string path, pipeline_class;
  std::string layout;          // "diffusers folder", "single file", "single files", "all-in-one checkpoint", …
  bool distilled = false;
  bool kv = false;             // the KV-cached editing distill (Variant::kKv)
  std::string variant_source;  // what says `distilled` (model_index.json, --variant, the single-file default)
  std::vector<std::string> notes;
  std::vector<ComponentSummary> components;  // by name
  int errors = 0;                         // components with a non-empty error
};

// The shape of a request, for Model::estimate_memory.
struct RequestSize {
  int width = 0, height = 0;  // 0: as generate resolves it (the first reference's, else the model's native size)
  std::vector<std::pair<int, int>> references;  // each reference image's size in pixels, before preprocessing
  bool inpaint = false;                         // inpainting / image-to-image (the source kept beside the latents)
  double guidance_scale = -1;                   // as GenerateRequest (< 0: the model's default)
};

// What one request needs in memory (Model::estimate_memory). Bytes; every figure includes the
// process as it is (code, tokenizer, what is mapped) and the kernels' scratch for the threads.
struct MemoryEstimate {
  int width = 0, height = 0;           // the output size the request resolves to
  int64_t image_tokens = 0, reference_tokens = 0;
  bool guidance = false;               // classifier-free guidance: two predictions per step
  uint64_t resident_bytes = 0;         // the fastest plan's peak: nothing streamed, one whole-image decode
  uint64_t minimum_bytes = 0;          // the smallest max_memory_gib budget any plan fits in (to 1 MiB)
  std::string resident_plan, minimum_plan;  // each plan in one line (which parts stream, the phases' peaks)
};

// A FLUX.2 [klein] pipeline opened from a diffusers folder. Calls on one Model are serialised
// (a second thread waits); use one Model per thread for parallel requests.
class KLEIN_API Model {
 public:
  // Parses model_index.json, every component config, the scheduler config and the tokenizer
  // once; with MemoryPolicy::kResident also maps the text encoder, transformer and VAE.
  static Result<std::unique_ptr<Model>> open(const std::string& path, const LoadOptions& options = {});
  // Only the tokenizer: `path` is a pipeline folder (its tokenizer/ is used) or a folder with
  // tokenizer.json (or vocab.json + merges.txt). Every call but tokenize() then fails.
  static Result<std::unique_ptr<Model>> open_tokenizer(const std::string& path);
  // Describes a folder without loading it; broken components are reported, not fatal. Reads the
  // configs and the safetensors headers.
  static Result<ModelInfo> inspect(const std::string& path);
  // The same for what `options` adds: its separate component files (diffusion_model,
  // text_encoder, vae, which `path` may leave empty) and its variant.
  static Result<ModelInfo> inspect(const std::string& path, const LoadOptions& options);

  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The whole pipeline on a Session: encode_prompt, set_references, denoise, decode. References,
  // noise and given embeddings are read and checked (and a memory budget planned) before any
  // model work. With kLow the VAE is mapped once per request (it encodes the references and
  // decodes the result); with kResident no file is opened besides the request's own inputs
  // (reference images, noise) and dumps.
  Result<GenerateResult> generate(const GenerateRequest& request, const Callbacks& callbacks = {});
  // One image per seed (request.seed is not used; request.noise_npy must be empty): the prompt
  // and the references are encoded once, then each seed is denoised and decoded. Image i is the
  // one generate() gives for seeds[i]. At most 64 seeds.
  Result<std::vector<GenerateResult>> generate_batch(const GenerateRequest& request, const std::vector<uint64_t>& seeds,
                                                     const Callbacks& callbacks = {});

  Result<PromptEmbeddings> encode_prompt(const std::string& prompt, const EncodeOptions& options = {},
                                         const Callbacks& callbacks = {});
  Result<ReferenceLatents> encode_references(const std::vector<std::string>& paths, const Callbacks& callbacks = {},
                                             const DumpOptions& dump = {});
  // progress("denoise", step, steps) after each step; the result is finite or an error. Base
  // models at a guidance scale > 1 need the negative prompt too: a Session runs them (this call
  // refuses them).
  Result<Latents> denoise(const PromptEmbeddings& prompt, const ReferenceLatents& references,
                          const DenoiseParams& params, const Callbacks& callbacks = {});
  Result<Image> decode(const Latents& latents, const Callbacks& callbacks = {}, const DumpOptions& dump = {});

  // Token ids of `text` (optionally wrapped in the klein chat template); max_length > 0
  // truncates/pads to that length and fills the mask.
  Result<TokenizeResult> tokenize(const std::string& text, bool chat_template = false, int max_length = 0) const;
  // Reads the safetensors headers (file I/O) for parameter counts and sizes.
  Result<ModelInfo> info() const;
  // What a request of this shape needs in memory, from the weights' sizes (file headers) and
  // the shapes alone, as max_memory_gib plans it: nothing is loaded or run.
  Result<MemoryEstimate> estimate_memory(const RequestSize& request) const;
  const LoadOptions& load_options() const;
  // Notes from opening, one line each, for the caller to show (e.g. a single file whose name
  // suggests a base model, run as distilled).
  const std::vector<std::string>& notes() const;
  // What runs the models: "cpu" or "cuda" (what BackendKind::kAuto chose); "" for a
  // tokenizer-only model.
  std::string backend_name() const;
  // False for a base (undistilled) model: classifier-free guidance and 50 steps by default.
  bool distilled() const;

  struct Impl;

 private:
  friend class Session;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What a Session runs with.
struct SessionOptions {
  // Classifier-free guidance scale; < 0: 4.0 (diffusers' guidance_scale default). Guidance runs
  // on base models when the scale is > 1 (two transformer calls per step,
  // v = v_neg + scale·(v − v_neg), as Flux2KleinPipeline); distilled models ignore it, with a
  // note through Callbacks::log when a scale > 1 was asked for. At most 100.
  double guidance_scale = -1;
  // The unconditional prompt of guidance (diffusers: "", its only choice).
  std::string negative_prompt;
};

// One request's state on a Model: the prompt's embeddings (and the negative prompt's under
// guidance), the reference images and their latents, the last denoise's latents. The Model is
// not changed and may serve other Sessions, one after another or between this one's phases
// (phases of all Sessions on one Model are serialised, as Model's calls are); it must outlive
// the Session.
//
// Phases, in order: encode_prompt (or set_prompt_embeddings); set_references (optional, editing;
// before the first denoise); denoise; decode. denoise + decode may be repeated with other seeds:
// the prompt and the references are encoded once. A phase called out of order fails with
// Code::kInvalidArgument naming the phase it needs. Not thread-safe: one thread per Session.
class KLEIN_API Session {
 public:
  // Fails on a tokenizer-only model, or a guidance scale that is not a number up to 100.
  static Result<std::unique_ptr<Session>> create(const Model& model, const SessionOptions& options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Whether classifier-free guidance runs, and at which scale (1 when it does not).
  bool guided() const;
  float guidance_scale() const;

  // The prompt (and, with guidance, the negative prompt) through the text encoder, loaded once
  // for both. Dumps prompt_embeds (and negative_prompt_embeds).
  Status encode_prompt(const std::string& prompt, const Callbacks& callbacks = {}, const DumpOptions& dump = {});
  // Instead of encode_prompt: given embeddings [1, T <= 512, joint_attention_dim] (e.g. from
  // Model::encode_prompt or `klein encode`), finite. With guidance, `negative` (same width;
  // empty: the negative prompt is encoded here).
  Status set_prompt_embeddings(const FloatArray& embeds, const FloatArray& negative = {},
                               const Callbacks& callbacks = {});
  // Editing: reference image files, then in-memory images, read and preprocessed now (a bad
  // file fails here, before any model work); the first denoise VAE-encodes them once (with
  // MemoryPolicy::kLow the Session then keeps the VAE mapped for its decodes, until it ends).
  Status set_references(const std::vector<std::string>& paths, const std::vector<ReferenceImage>& data = {});
  // Inpainting / image-to-image (InitImage): the source and the mask are read and preprocessed
  // now (a bad file or a strength outside (0, 1] fails here); the first denoise VAE-encodes the
  // source with the references. Before the first denoise, once. denoise then makes the source's
  // size, and on base models a guidance scale left at its default (< 0) becomes 8.0.
  Status set_init_image(const InitImage& init);
  // Noise from params (seed or given noise), then the denoising loop; the latents stay in the
  // Session for decode (and latents()). Needs the prompt's embeddings.
  Status denoise(const DenoiseParams& params, const Callbacks& callbacks = {});
  // The last denoise's latents [1, 128, H/16, W/16].
  Result<Latents> latents() const;
  // The last denoise's latents through the VAE. Needs a denoise.
  Result<Image> decode(const Callbacks& callbacks = {}, const DumpOptions& dump = {});
  // The last denoise's size and step count (0 before one).
  int width() const;
  int height() const;
  int steps() const;

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One-shot options (the pre-Model API, kept for callers that run a single request).
struct GenerateOptions {
  std::string model_dir;        // diffusers folder with model_index.json
  std::string prompt;
  int width = 0;                // 0: the first reference's processed width, else the model's native size
  int height = 0;               // 0: the first reference's processed height, else the model's native size
  int steps = 0;                // 0: 4 for distilled models, 50 otherwise
  double guidance_scale = -1;   // as GenerateRequest: base models run CFG at > 1 (< 0: 4.0); distilled ignore it
  std::string negative_prompt;  // CFG's negative prompt (base models; default "")
  std::vector<LoraSpec> loras;  // as LoadOptions::loras: applied in order to the transformer and text encoder
  LoraMode lora_mode = LoraMode::kAuto;
  uint64_t seed = 0;
  std::string noise_npy;        // if set: initial noise (1, 128, H/16, W/16) from this .npy
  bool bf16_noise = false;      // draw the noise as torch does for a bfloat16 pipeline
  std::vector<std::string> reference_images;  // editing: 1..N image files
  int threads = 0;              // 0: all cores; at most kMaxThreads
  Precision precision = Precision::kFast;  // as LoadOptions::precision (kFp32: diffusers' float32 picture)
  std::string dump_dir;         // if set: named intermediates as .npy
  std::string dump_filter;      // comma-separated name parts to dump (empty: all)

  std::function<void(const std::string&, int, int)> on_progress;
  std::function<bool()> should_cancel;
  std::function<void(const std::string&)> on_log;
};

// Model::open(model_dir, {threads, kLow, precision}) then Model::generate. The result image is only
// returned if it is finite (never a NaN image).
KLEIN_API Result<GenerateResult> generate(const GenerateOptions& options);

// Writes `image` as PNG atomically (an unpredictable temporary file in the same folder, synced,
// then renamed over `path`; removed on failure), with text metadata chunks (iTXt, UTF-8: bytes
// of a value that are not valid UTF-8 are written as U+FFFD).
KLEIN_API Status save_png(const std::string& path, const Image& image,
                          const std::vector<std::pair<std::string, std::string>>& metadata = {});
enum class ImageFileFormat { kPng, kJpeg, kWebp };

// `image` encoded in memory. PNG carries `metadata` as iTXt chunks exactly as save_png writes
// them; JPEG and WebP carry none. quality 1..100 for JPEG and (lossy) WebP; PNG ignores it.
KLEIN_API Result<std::vector<uint8_t>> encode_image(const Image& image, ImageFileFormat format,
                                                    const std::vector<std::pair<std::string, std::string>>& metadata = {},
                                                    int quality = 90);
// PNG/JPEG/WebP bytes (detected from the content) decoded to RGB as a reference file would be
// (EXIF orientation applied, at most 2^26 pixels); `name` names the data in errors.
KLEIN_API Result<Image> decode_image(const std::vector<uint8_t>& data, const std::string& name = "image");

// torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=float32, or
// bfloat16 values with bf16) as float32: the seeded noise of DenoiseParams::seed. A batch drawn
// from one generator is one call, e.g. diffusers' num_images_per_prompt = B from one generator
// is shape [B, 128, H/16, W/16], image i its i-th slice. Every dimension >= 1, at most 2^31 values.
KLEIN_API Result<FloatArray> randn(const std::vector<int64_t>& shape, uint64_t seed, bool bf16 = false);

// Writes a float32 C-order .npy atomically, as save_png does. data.size() must match shape.
KLEIN_API Status save_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);
// Reads a .npy (format 1.0/2.0, little-endian, C order; float32/64/16, int, uint8, bool) as
// float32: e.g. latents dumped by `--dump` (latents_stepN.npy) for Model::decode.
KLEIN_API Result<FloatArray> load_npy(const std::string& path);

// `klein quantize`: a model (a folder, or single files written out as one first) rewritten as a
// diffusers folder with low-bit weights that Model::open loads without conversion. q8: int8 per output row + f32 scale (X.weight I8 +
// X.weight_scale), computed W8A8 under Precision::kFast; q4: MLX affine int4, groups of 64 along
// the input dimension (X.weight U32 + X.scales + X.biases, bf16), as mx.quantize(w, 64, 4) makes
// them; bf16: float weights rounded to bf16. The text encoder and transformer are rewritten; the
// VAE, tokenizer and scheduler are copied. Embeddings, time/guidance embedders, modulation, the
// input/output projections, norms, biases and every 1-D tensor stay as stored; `keep` adds
// tensor-name globs ('*' also matches '.'). The scheme is recorded in each rewritten
// component's config.json under "quantization". An input whose text encoder or transformer is
// already q8 / q4 (integer weights) is refused with Code::kUnsupported: quantize from the
// full-precision folder (a bf16 one is fine).
struct QuantizeOptions {
  std::string model;              // input: a diffusers folder or a safetensors file (as Model::open)
  // Separate component files and the variant, as LoadOptions: a model given as files is first
  // written out as a diffusers folder (float weights under diffusers names, beside the output,
  // removed after), which is then quantized; the output is a diffusers folder either way.
  std::string diffusion_model, text_encoder, vae;
  Variant variant = Variant::kAuto;
  std::string output;             // new folder (must not exist; written as output.tmp-* then renamed),
                                  // with a manifest.json of its files (make_manifest)
  std::string type = "q8";        // "q8", "q4" or "bf16"; or "gguf:<T>" (T one of Q8_0 Q4_0 Q4_1 Q5_0 Q5_1
                                  // Q2_K Q3_K Q4_K Q5_K Q6_K F16 BF16 F32): the transformer alone written as
                                  // one GGUF file `output` (ggml's reference quantizers, bit-exact), named
                                  // and typed as `flavor`'s producer writes it
  std::string flavor = "comfy";   // gguf only: "comfy" (ComfyUI-GGUF: BFL names, general.architecture
                                  // flux) or "sdcpp" (stable-diffusion.cpp: model.diffusion_model. names,
                                  // no metadata)
  std::vector<std::string> keep;  // extra globs of tensors kept as stored
  int threads = 0;                // 0: all cores; at most kMaxThreads
  std::string verify_manifest;    // as LoadOptions::verify_manifest, for the input
};
// progress("quantize <component>", tensors done, total); log: one summary line per component.
KLEIN_API Status quantize_model(const QuantizeOptions& options, const Callbacks& callbacks = {});

// Integrity manifests (`klein manifest`, `--verify`): JSON naming every file a load of `path`
// with `options` reads (component weights, configs, tokenizer, scheduler config,
// model_index.json) with its size and SHA-256, plus the layout, variant and per-component
// formats detected. Paths are relative to the model folder (or file names for single files), so
// a manifest still verifies a copy of the model elsewhere. Files are hashed on options.threads
// threads, streamed (bounded memory); cb.cancel is polled between blocks.
KLEIN_API Result<std::string> make_manifest(const std::string& path, const LoadOptions& options = {},
                                            const Callbacks& cb = {});
// make_manifest written to `output` atomically.
KLEIN_API Status write_manifest(const std::string& path, const LoadOptions& options, const std::string& output,
                                const Callbacks& cb = {});
// Checks what a load of `path` reads against the manifest file `manifest` (what
// LoadOptions::verify_manifest does at open): one line naming the first file that is missing,
// extra, of another size or of another SHA-256.
KLEIN_API Status verify_manifest(const std::string& manifest, const std::string& path, const LoadOptions& options = {},
                                 const Callbacks& cb = {});

// How close two images of one size are (`klein compare`).
struct ImageComparison {
  double psnr = 0;         // dB over the R, G, B values, peak 255; +inf when identical
  double ssim = 0;         // mean SSIM on BT.601 luma, Gaussian 11x11 window (sigma 1.5), valid positions
  double correlation = 0;  // Pearson correlation of the R, G, B values (1 when both are constant and equal)
};
KLEIN_API Result<ImageComparison> compare_images(const Image& a, const Image& b);
// Reads both files (PNG, JPEG, WebP) and compares them; the sizes must match.
KLEIN_API Result<ImageComparison> compare_image_files(const std::string& a, const std::string& b);

// How close two float arrays of one shape are (`klein compare A.npy B.npy`, e.g. two --dump
// folders' prompt_embeds or velocity_stepN): all in double precision over every element.
struct ArrayComparison {
  double cosine = 0;   // <a, b> / (|a| |b|); 1 when both are all zero
  double rel_l2 = 0;   // |a − b| / |a| (a is the reference); 0 when both are all zero
  double max_abs = 0;  // max |a − b|
  int64_t count = 0;   // elements compared
};
KLEIN_API Result<ArrayComparison> compare_arrays(const FloatArray& a, const FloatArray& b);
// Reads two float32 .npy files (as load_npy) and compares them; the shapes must match.
KLEIN_API Result<ArrayComparison> compare_npy_files(const std::string& a, const std::string& b);

// A report on this CPU: model name, the instruction-set features found, the ISAs usable, and the
// kernel chosen for each (op, weight format) — with the best ISA, or under the ceiling `isa`
// ("scalar", "avx2", ...; the names of LoadOptions::isa) — for Precision::kFp32, then the
// kernels that Precision::kFast chooses differently.
KLEIN_API Result<std::string> cpu_info(const std::string& isa = "");

// "0.1.0"
KLEIN_API const char* version();

}  // namespace klein
