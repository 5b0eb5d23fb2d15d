// A process-wide count of model files opened (safetensors mappings, JSON configs, tokenizer
// files), for tests that check a resident Model does no file I/O on repeated requests and
// that editing maps the VAE once. Internal; not part of the public API.
#pragma once

#include <cstdint>
#include <string>

namespace klein {

// Records one open of `path`.
void note_file_opened(const std::string& path);
// Opens of every file so far.
uint64_t files_opened();
// Opens so far of files whose path contains `part` (e.g. "vae/diffusion_pytorch_model").
uint64_t files_opened(const std::string& part);

}  // namespace klein
