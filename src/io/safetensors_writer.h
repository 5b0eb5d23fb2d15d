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

// Writes atomically; tensors are laid out in the given order, 8-byte aligned header.
Status write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace klein
