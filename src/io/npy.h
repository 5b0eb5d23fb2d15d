// NumPy .npy files (format 1.0/2.0, little-endian, C order): the exchange format for dumped
// intermediates and reference fixtures.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace klein {

struct NpyArray {
  DType dtype = DType::kF32;  // F32, F64, F16, I64, I32, U8, I8, BOOL
  Shape shape;
  std::vector<uint8_t> bytes;
  int64_t numel() const { return shape_numel(shape); }
  // Element values converted to float32 / int64 (any supported dtype).
  std::vector<float> to_f32() const;
  std::vector<int64_t> to_i64() const;
  Tensor to_tensor() const;
};

Result<NpyArray> read_npy(const std::filesystem::path& path);
// Writes atomically (temp file + rename). dtype must be a plain type.
Status write_npy(const std::filesystem::path& path, DType dtype, const Shape& shape,
                 const void* data);
inline Status write_npy(const std::filesystem::path& path, const Tensor& t) {
  return write_npy(path, DType::kF32, t.shape(), t.data());
}

}  // namespace klein
