/* klein.cpp C API: FLUX.2 [klein] text-to-image and reference-image editing from C (C11).
 *
 * Conventions:
 *   - Every fallible call returns a klein_status (KLEIN_OK == 0) and, when `err` is not NULL,
 *     fills it with the code and a one-line message (NUL-terminated, truncated to fit). There is
 *     no global or thread-local error state.
 *   - Parameter structs are plain data: start from klein_*_default_params() and set fields.
 *   - Strings are UTF-8, borrowed for the duration of the call only.
 *   - Objects returned through an out-pointer belong to the caller: klein_model_free,
 *     klein_session_free, klein_image_free. All accept NULL.
 *   - Callbacks run on the calling thread; `user_data` is passed back unchanged.
 *   - One model serves one call at a time (concurrent calls on it wait for each other).
 */
#ifndef KLEIN_KLEIN_C_H_
#define KLEIN_KLEIN_C_H_

#include <stddef.h>
#include <stdint.h>

#include "klein/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum klein_status {
  KLEIN_OK = 0,
  KLEIN_INVALID_ARGUMENT = 1, /* bad option or value given by the caller */
  KLEIN_NOT_FOUND = 2,        /* missing file, tensor or key */
  KLEIN_IO_ERROR = 3,         /* read/write/mmap failure */
  KLEIN_FORMAT_ERROR = 4,     /* malformed file contents */
  KLEIN_UNSUPPORTED = 5,      /* well-formed but not handled */
  KLEIN_CANCELLED = 6,        /* the cancel callback asked to stop */
  KLEIN_OUT_OF_MEMORY = 7,    /* an allocation failed */
  KLEIN_INTERNAL = 8          /* a bug in klein.cpp */
} klein_status;

typedef struct klein_error {
  int code;           /* a klein_status */
  char message[512];  /* one line, e.g. "not found: model/vae/config.json: no such file" */
} klein_error;

typedef enum klein_memory_policy {
  KLEIN_MEMORY_LOW = 0,     /* one component resident at a time (default) */
  KLEIN_MEMORY_RESIDENT = 1 /* all components mapped once, kept for repeated requests */
} klein_memory_policy;

/* The arithmetic of the matrix products (klein::Precision). */
typedef enum klein_precision {
  KLEIN_PRECISION_FP32 = 0, /* float32 on the stored weights: the exact path (diffusers' float32 pipeline) */
  KLEIN_PRECISION_FAST = 1  /* (default) the CPU's dot-product kernels (bf16 dot, int8 W8A8 for Q8_ROW); bf16 GEMMs on CUDA */
} klein_precision;

/* Which processor runs the models (klein::BackendKind). */
typedef enum klein_backend {
  KLEIN_BACKEND_AUTO = 0, /* CUDA when built with it and a device is visible (and no budget), else CPU (default) */
  KLEIN_BACKEND_CPU = 1,
  KLEIN_BACKEND_CUDA = 2  /* fails at open without a device or in a build without -DKLEIN_CUDA=ON */
} klein_backend;

typedef enum klein_variant {
  KLEIN_VARIANT_AUTO = 0,      /* a folder's is_distilled; single files: distilled (default) */
  KLEIN_VARIANT_DISTILLED = 1,
  KLEIN_VARIANT_BASE = 2,      /* the base model: classifier-free guidance (4.0) and 50 steps by default */
  KLEIN_VARIANT_KV = 3         /* the KV-cached reference-editing distill (9B-KV): references cached at step 0 */
} klein_variant;

/* How LoRAs apply (klein.h LoraMode). */
typedef enum klein_lora_mode {
  KLEIN_LORA_AUTO = 0,    /* merged into float weights, at run time beside quantized ones */
  KLEIN_LORA_MERGE = 1,   /* merged at load (quantized weights: an error) */
  KLEIN_LORA_RUNTIME = 2  /* y += s*(x*A^T)*B^T beside each changed linear (CPU backend) */
} klein_lora_mode;

typedef struct klein_model klein_model;     /* opaque */
typedef struct klein_session klein_session; /* opaque: one request's state on a model (klein.h Session) */

/* An 8-bit RGB image, row-major, height * width * 3 bytes. */
typedef struct klein_image {
  int width;
  int height;
  unsigned char* rgb;
} klein_image;

/* phase: "tokenize", "encode", "vae encode", "load transformer", "denoise", "decode". */
typedef void (*klein_progress_fn)(const char* phase, int done, int total, void* user_data);
typedef void (*klein_log_fn)(const char* message, void* user_data);
/* Return non-zero to stop the call with KLEIN_CANCELLED. */
typedef int (*klein_cancel_fn)(void* user_data);
/* A live preview after each denoising step (step = 1..total) at the output size: the predicted
   clean latent projected to RGB (klein.h Callbacks::preview). The image is valid during the call. */
typedef void (*klein_preview_fn)(int step, int total, const klein_image* preview, void* user_data);

typedef struct klein_load_params {
  int threads;        /* 0: all cores; at most 1024 (kMaxThreads) */
  int memory;         /* a klein_memory_policy */
  const char* isa;    /* NULL or "": best available; else a ceiling this CPU has: "scalar", "avx2", ... */
  int vae_tile;       /* seamless tiled VAE: tile size in image pixels, a multiple of 8; 0: automatic; < 0: never */
  int precision;      /* a klein_precision: KLEIN_PRECISION_FAST (default) or KLEIN_PRECISION_FP32 */
  double max_memory_gib; /* memory budget in GiB, 0 (none) to 1e6 (klein.h LoadOptions::max_memory_gib) */
  int backend;        /* a klein_backend: KLEIN_BACKEND_AUTO (default), KLEIN_BACKEND_CPU or KLEIN_BACKEND_CUDA */
  /* Separate component safetensors files (NULL or "": none), each replacing that part of `path` or
     giving it when `path` is NULL / "" or a single file without it (klein.h LoadOptions). */
  const char* diffusion_model;
  const char* text_encoder;
  const char* vae;
  int variant;        /* a klein_variant */
  /* NULL or "": none; else a manifest (`klein manifest`) the files are checked against first
     (klein.h LoadOptions::verify_manifest). */
  const char* verify_manifest;
  /* LoRA files (klein.h LoadOptions::loras), applied in order: num_loras paths and their scales
     (NULL: 1 each); lora_mode a klein_lora_mode. */
  const char* const* lora_paths;
  const float* lora_scales;
  int num_loras;
  int lora_mode;
} klein_load_params;

typedef struct klein_generate_params {
  const char* prompt;     /* required unless prompt_embeds_npy is set; then it must be NULL */
  int width, height;  /* 0: the first reference's size, else the model's native size (1024); multiples of 16 */
  int steps;          /* 0: 4 */
  uint64_t seed;
  const char* noise_npy;  /* NULL or a .npy with the initial noise (1, 128, H/16, W/16) */
  int bf16_noise;         /* non-zero: draw the noise as a bfloat16 torch pipeline does */
  const char* const* reference_images; /* editing: num_reference_images paths */
  int num_reference_images;
  klein_progress_fn progress;
  klein_log_fn log;
  klein_cancel_fn cancel;
  klein_preview_fn preview;
  void* user_data;        /* passed to every callback */
  /* NULL or a float32 .npy with prompt embeddings [1, T <= 512, joint_attention_dim] (as written by
   * `klein encode` or a --dump's prompt_embeds.npy), used instead of the text encoder. */
  const char* prompt_embeds_npy;
  /* Classifier-free guidance on base models (klein.h SessionOptions): < 0 (the default params'
   * -1): 4.0; guidance runs above 1; distilled models ignore it (with a note through log). */
  double guidance_scale;
  const char* negative_prompt; /* NULL: "" (diffusers' only negative prompt) */
  /* Inpainting / image-to-image (klein.h InitImage): NULL: none; else the source image file, which
   * sets the output size. mask_image: NULL for image-to-image, else white = repaint. strength in
   * (0, 1]; < 0 (the default params' -1): 0.8. */
  const char* init_image;
  const char* mask_image;
  double strength;
} klein_generate_params;

/* A Session (klein.h): encode the prompt once, then denoise + decode any number of seeds. */
typedef struct klein_session_params {
  double guidance_scale;        /* < 0: 4.0 (default -1); as klein_generate_params */
  const char* negative_prompt;  /* NULL: "" */
  klein_progress_fn progress;   /* callbacks of every phase of the session (NULL: none) */
  klein_log_fn log;
  klein_cancel_fn cancel;
  klein_preview_fn preview;
  void* user_data;
} klein_session_params;

typedef struct klein_denoise_params {
  int width, height;  /* 0: the first reference's size, else the model's native size (1024); multiples of 16 */
  int steps;          /* 0: 4 for distilled models, 50 for base models */
  uint64_t seed;
  int bf16_noise;     /* non-zero: draw the noise as a bfloat16 torch pipeline does */
} klein_denoise_params;

KLEIN_API klein_load_params klein_load_default_params(void);
KLEIN_API klein_generate_params klein_generate_default_params(void);
KLEIN_API klein_session_params klein_session_default_params(void);
KLEIN_API klein_denoise_params klein_denoise_default_params(void);

/* Opens a model (configs, scheduler, tokenizer parsed once): a diffusers folder or one safetensors / GGUF file
   (path may be NULL or "" when params names the component files). params may be NULL. */
KLEIN_API klein_status klein_model_open(const char* path, const klein_load_params* params, klein_model** out,
                                        klein_error* err);
/* Runs one request; *out receives a new image (free it with klein_image_free). */
KLEIN_API klein_status klein_model_generate(klein_model* model, const klein_generate_params* params,
                                            klein_image** out, klein_error* err);
KLEIN_API void klein_model_free(klein_model* model);

/* What one request needs in memory (klein.h Model::estimate_memory): the planner behind
   max_memory_gib, from the weights' sizes and the shapes alone (nothing loaded or run). */
typedef struct klein_memory_estimate {
  int width, height;              /* the output size the request resolves to */
  int64_t image_tokens, reference_tokens;
  int guidance;                   /* non-zero: classifier-free guidance (two predictions a step) */
  uint64_t resident_bytes;        /* the fastest plan's peak: nothing streamed, one whole-image decode */
  uint64_t minimum_bytes;         /* the smallest max_memory_gib budget (in bytes) any plan fits in */
} klein_memory_estimate;
/* width/height 0: the first reference's size, else the model's native size; ref_sizes: num_refs
   (width, height) pairs in pixels (NULL when num_refs is 0); guidance_scale < 0: the default. */
KLEIN_API klein_status klein_model_estimate_memory(klein_model* model, int width, int height, const int* ref_sizes,
                                                   int num_refs, double guidance_scale, klein_memory_estimate* out,
                                                   klein_error* err);

/* A session on `model` (which must outlive it; other sessions may use the model in between).
   params may be NULL. Phases in order: encode_prompt, set_references (optional), denoise, decode;
   denoise + decode may repeat with other seeds. Out of order: KLEIN_INVALID_ARGUMENT. */
KLEIN_API klein_status klein_session_create(klein_model* model, const klein_session_params* params,
                                            klein_session** out, klein_error* err);
/* The prompt (and, under guidance, the negative prompt) through the text encoder, once. */
KLEIN_API klein_status klein_session_encode_prompt(klein_session* session, const char* prompt, klein_error* err);
/* Editing: num_paths reference image files (PNG/JPEG/WebP), before the first denoise. */
KLEIN_API klein_status klein_session_set_references(klein_session* session, const char* const* paths, int num_paths,
                                                    klein_error* err);
/* Inpainting / image-to-image (klein.h Session::set_init_image): the source image file, the mask
   (NULL: image-to-image) and the strength (< 0: 0.8), before the first denoise. */
KLEIN_API klein_status klein_session_set_init_image(klein_session* session, const char* image, const char* mask,
                                                   double strength, klein_error* err);
KLEIN_API klein_status klein_session_denoise(klein_session* session, const klein_denoise_params* params,
                                             klein_error* err);
/* The last denoise's latents through the VAE; *out receives a new image (klein_image_free). */
KLEIN_API klein_status klein_session_decode(klein_session* session, klein_image** out, klein_error* err);
/* Non-zero when classifier-free guidance runs (a base model at a scale > 1). */
KLEIN_API int klein_session_guided(const klein_session* session);
KLEIN_API void klein_session_free(klein_session* session);

/* Writes the image as PNG (atomically: temporary file + rename). */
KLEIN_API klein_status klein_image_save_png(const klein_image* image, const char* path, klein_error* err);
KLEIN_API void klein_image_free(klein_image* image);

/* "0.1.0" */
KLEIN_API const char* klein_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KLEIN_KLEIN_C_H_ */
