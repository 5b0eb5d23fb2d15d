// Shared pieces of the `klein` command-line tool.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "klein/klein.h"
#include "klein/status.h"

namespace CLI {
class App;
}

namespace klein::cli {

// --model (a folder or a file), --diffusion-model, --text-encoder, --vae and --variant: the
// model options of every command that loads one.
struct ModelArgs {
  std::string model, diffusion_model, text_encoder, vae, variant;
  std::string verify;  // --verify: a manifest the files are checked against before loading
  // Adds the options to `s`; `model_help` describes --model (and its default, if any).
  void add(CLI::App* s, const char* model_help);
  bool any() const { return !model.empty() || !diffusion_model.empty() || !text_encoder.empty() || !vae.empty(); }
  // The component files and the variant into `lo`.
  void apply(LoadOptions& lo) const;
  // The path to open: --model; with `default_tiny` and no model option at all, the tiny test model.
  std::string path(bool default_tiny) const;
  // A command that needs a model and got none: one line naming the options.
  static Status none_given(const char* command);
};
// --lora FILE[:SCALE] (repeatable) and --lora-mode: the LoRAs of generate and encode.
struct LoraArgs {
  std::vector<std::string> specs;
  std::string mode = "auto";
  void add(CLI::App* s);
  // Into `lo`; a bad FILE[:SCALE] is an error naming it.
  Status apply(LoadOptions& lo) const;
};

inline constexpr const char* kModelFileHelp =
    "Model: a diffusers folder (model_index.json), an mflux pack folder (transformer/0.safetensors ...) or one "
    "safetensors / GGUF file (a BFL / ComfyUI transformer, or a "
    "ComfyUI all-in-one checkpoint); --diffusion-model, --text-encoder and --vae add or replace parts";
// Prints the model's notes from opening ("note: ..." on stderr).
void print_notes(const std::vector<std::string>& notes);

// Prints "klein: <message>" on stderr and returns the exit code for `s` (never 0).
int fail(const Status& s);

// Callbacks::log for the pipeline commands: the memory plan as is, anything else as a warning.
void print_log(const std::string& message);

// Writes a float32 C-order .npy (through a temporary file + rename, so never a partial file).
Status write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);
// --seed: decimal digits only, 0..2^64-1 (else an error naming --seed).
Status parse_seed(const std::string& text, uint64_t* seed);
// --prompt-file: UTF-8 text from FILE ("-": stdin), one trailing newline dropped.
Status read_prompt_file(const std::string& path, std::string* prompt);
// The prompt from exactly one of --prompt / --prompt-file.
Status resolve_prompt(const std::string& prompt, bool prompt_given, const std::string& prompt_file,
                      std::string* out);
// An output path (for `option`, e.g. "-o") that is not one of the (option, path) inputs, not a
// folder, and whose folder exists.
Status check_output_path(const std::string& option, const std::string& out,
                         const std::vector<std::pair<std::string, std::string>>& inputs);

// Under --precision fp32, a note on stderr when the text encoder or transformer holds q8 / q4
// weights: they are then dequantized and computed in float32 (slower than bf16 + fast), which a
// user who ran `klein quantize` rarely wants. `info` runs only under fp32 (it reads the
// safetensors headers): Model::info or Model::inspect.
void note_quantized_fp32(Precision precision, const std::function<Result<ModelInfo>()>& info);

// klein::check_load_options with the fields named as the options that set them ("--max-memory nan:
// ..." rather than "max_memory_gib nan: ..."): generate, encode, decode and serve run it before
// anything else is opened, so a value that means nothing never reaches a run.
Status check_load_options_cli(const LoadOptions& options);

// --backend: "cpu", "cuda" or "auto" (CLI11 checks the name; anything else is auto).
BackendKind parse_backend(const std::string& name);
inline constexpr const char* kBackendHelp =
    "cpu, cuda (an NVIDIA GPU; builds configured with -DKLEIN_CUDA=ON) or auto (default: cuda when this build has it "
    "and a device is present, else cpu)";

// --isa on the commands that run kernels.
inline constexpr const char* kIsaHelp =
    "Highest instruction set for the kernels: scalar, avx2, avx_vnni, avx512, avx512_vnni, avx512_bf16, amx; one "
    "this CPU has (`klein info --cpu` lists them) (default: the fastest kernels this CPU has; naming avx512_bf16 "
    "forces its bf16 dot products where they are slower than float32)";

// The model `generate` and `serve` run without --model: the tiny random-weight test model, from
// the source tree for a binary in its build folder, else installed beside the binary
// (<exe>/../share/klein/models/tiny), so an installed klein needs no source tree.
std::string default_model_dir();
inline constexpr const char* kModelHelp =
    "Model: a diffusers folder (model_index.json), an mflux pack folder (transformer/0.safetensors ...) or one "
    "safetensors / GGUF file (a BFL / ComfyUI transformer, or a "
    "ComfyUI all-in-one checkpoint); --diffusion-model, --text-encoder and --vae add or replace parts. Default "
    "(no model option at all): the tiny random-weight test model (tests/data/tiny; installed: "
    "share/klein/models/tiny), whose images are noise";

// "[1, 512, 7680]"
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace klein::cli
