// klein.cpp public API: FLUX.2 [klein] text-to-image and reference-image editing.
//
// Every call returns a Status (or Result<T>) instead of throwing or aborting; messages are one
// line naming the file, tensor or option at fault. Components are loaded one at a time and
// released after use, so peak memory is that of the largest component plus activations.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "klein/status.h"

namespace klein {

// An 8-bit RGB image, row-major, height * width * 3 bytes.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

struct GenerateOptions {
  std::string model_dir;        // diffusers folder with model_index.json
  std::string prompt;
  int width = 0;                // 0: 1024, or the first reference's processed width
  int height = 0;               // 0: 1024, or the first reference's processed height
  int steps = 0;                // 0: 4 for distilled models, 50 otherwise
  uint64_t seed = 0;
  std::string noise_npy;        // if set: initial noise (1, 128, H/16, W/16) from this .npy
  bool bf16_noise = false;      // draw the noise as torch does for a bfloat16 pipeline
  std::vector<std::string> reference_images;  // editing: 1..N image files
  int threads = 0;              // 0: all cores
  std::string dump_dir;         // if set: named intermediates as .npy
  std::string dump_filter;      // comma-separated name parts to dump (empty: all)

  // Phase ("encode", "denoise", "decode", ...), units done, units total.
  std::function<void(const std::string&, int, int)> on_progress;
  // Polled between layers and steps; true cancels with Code::kCancelled.
  std::function<bool()> should_cancel;
  // Warnings and notes (e.g. a size floored to a multiple of 16).
  std::function<void(const std::string&)> on_log;
};

struct GenerateResult {
  Image image;
  int width = 0, height = 0, steps = 0;
  // Parameters worth recording with the image (prompt, seed, steps, size, model, version).
  std::vector<std::pair<std::string, std::string>> metadata;
};

// Runs the whole pipeline. The result image is only returned if it is finite (never a NaN image).
Result<GenerateResult> generate(const GenerateOptions& options);

// Writes `image` as PNG atomically (temporary file + rename), with text metadata chunks.
Status save_png(const std::string& path, const Image& image,
                const std::vector<std::pair<std::string, std::string>>& metadata = {});

// "0.1.0"
const char* version();

}  // namespace klein
