// `klein quantize`: a model folder rewritten with low-bit weights (q8 → Q8_ROW triples, q4 → MLX
// 4-bit triples, bf16), in the same diffusers layout, loadable without conversion because the
// SafetensorsSource resolves exactly these triples (io/tensor_source.h). The recipes are
// core/quantize.h. Streams tensor by tensor: one tensor's output is in memory at a time, and the
// input pages of each tensor are released after it is written.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace klein {

struct QuantizeSpec {
  std::filesystem::path input, output;
  std::string type;               // "q8", "q4" or "bf16"
  std::vector<std::string> keep;  // extra tensor-name globs kept as stored (fnmatch, '*' crosses '.')
  int threads = 0;                // 0: all cores
  std::function<void(const std::string&, int, int)> progress;
  std::function<bool()> cancel;
  std::function<void(const std::string&)> log;
  // Called with the finished temporary folder before it is renamed to `output` (the API layer
  // writes the output's manifest.json there); an error fails the whole quantization.
  std::function<Status(const std::filesystem::path&)> finish;
};

// The layers kept as stored by default: the ones seed 004 keeps in bf16 (embeddings, the DiT's
// time/guidance embedders, modulation, input/output projections, final norm) — small, and where
// the error of one weight reaches every token. Norms, biases and every 1-D tensor are always kept.
const std::vector<std::string>& default_keep_globs();

// Writes spec.output (which must not exist) through spec.output + ".tmp-*", renamed at the end;
// on failure nothing is left behind. The text encoder and transformer are quantized; every other
// file (VAE, tokenizer, scheduler, model_index.json) is copied as stored.
Status quantize_model_folder(const QuantizeSpec& spec);
// The checks quantize_model_folder makes of `spec` before it reads anything (type, globs, the
// output folder: new, its parent existing, not the input or inside it).
Status check_quantize_spec(const QuantizeSpec& spec);

}  // namespace klein
