// A weight tensor in its storage type. Models hold Weights and never assume a dtype: kernels
// dispatch on Weight::dtype, so one model definition serves f32/f16/bf16 files and quantized ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace klein {

struct Weight {
  std::string name;             // key in the checkpoint, for error messages and dumps
  DType dtype = DType::kF32;
  Shape shape;                  // logical shape; Linear weights are [out, in]
  const void* data = nullptr;   // element storage (mmapped file or owned buffer); for
                                // kQ8Row int8 [out,in], kQ4G64 packed nibbles [out, in/2]
  // Quantized formats only.
  const float* scales = nullptr;  // kQ8Row: [out]; kQ4G64: [out, in/64]
  const float* mins = nullptr;    // kQ4G64: [out, in/64]

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape_numel(shape); }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? (shape.empty() ? 0 : 1) : numel() / shape[0]; }
};

// Converts elements [offset, offset+n) of a plain-typed weight to float32.
void weight_to_f32(const Weight& w, int64_t offset, int64_t n, float* out);
// Row `r` of a 2-D (or flattened) weight as float32 (works for quantized types too).
void weight_row_to_f32(const Weight& w, int64_t r, float* out);
// Whole weight as a float32 Tensor (for small tensors: norms, biases, convs).
Tensor weight_to_tensor(const Weight& w);

}  // namespace klein
