// Writing safetensors files (converters, test-model generators, tests that build bad files).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/format.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace klein {

struct TensorToWrite {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;  // numel(shape) * dtype_size(dtype) bytes
};

// Pads a safetensors JSON header with spaces (which the format allows) so that the data that
// follows the 8-byte length and the header starts on a 64-byte boundary: in a page-aligned
// mapping every tensor whose offset is a multiple of 64 then starts on a cache line, which the
// AMX kernels read in place (a misaligned tile load touches two lines per row: ~40 % slower).
inline void pad_safetensors_header(std::string& header) {
  header.append((64 - (8 + header.size()) % 64) % 64, ' ');
}

// Writes atomically; tensors are laid out in the given order after a header padded as above.
Status write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace klein
