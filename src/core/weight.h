// A weight tensor in its storage format (the idea of gemma.cpp's MatPtr). Models hold Weights and
// never assume a format: the backend's kernels are chosen by Weight::dtype, so one model
// definition serves f32/f16/bf16 files and the quantized formats of core/format.h.
//
// The bytes live in a mapped file (owner null: the TensorSource keeps the mapping alive) or in
// a buffer the Weight co-owns (`owner`: repacked, quantized-at-load or uploaded copies).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/format.h"
#include "core/lora_delta.h"
#include "core/status.h"
#include "core/tensor.h"

namespace klein {

// How the rows of a weight are laid out in memory.
enum class Layout : uint8_t {
  kRowMajor,  // [rows, cols] in storage order, row stride = format_row_bytes(dtype, cols)
  kPacked,    // repacked for a kernel (panels); only that backend's kernels read it
};

struct Weight {
  std::string name;             // key in the checkpoint, for error messages and dumps
  DType dtype = DType::kF32;
  Shape shape;                  // logical shape; Linear weights are [out, in]
  Layout layout = Layout::kRowMajor;
  Device device = Device::kCpu;
  const void* data = nullptr;   // element / block storage
  size_t nbytes = 0;            // bytes at `data`
  // Block formats with ScalePlace::kSeparate: one scale (and offset) per block, row-major
  // [rows, cols / block_elems], in scale_dtype (f32, f16 or bf16).
  const void* scales = nullptr;
  const void* offsets = nullptr;
  DType scale_dtype = DType::kF32;
  // F8_E4M3_SCALED: the activation scale stored beside the weight (`input_scale`; 0 when the file
  // has none). Kept for `klein info` and a future fp8-activation kernel only: klein computes as
  // BFL's and ComfyUI's reference code does on CPUs without fp8 matmuls — x in float32 (or bf16)
  // against the dequantized weight — so input_scale does not change any result here; it would
  // only if activations were quantized to fp8.
  float input_scale = 0.0f;
  // ComfyUI int8_tensorwise "convrot": the stored rows are W·H per group of this many columns (H
  // the normalized Hadamard matrix of that size, hadamard_groups), so the linear rotates x the
  // same way first ((x·H)(W·H)ᵀ = x·Wᵀ, H·Hᵀ = I). 0: not rotated.
  int64_t act_rotation_group = 0;
  std::shared_ptr<const void> owner;  // keeps owned storage alive (null: the source owns it)
  // LoRA applied at run time (null: none, the common case; the linear op tests only this
  // pointer): the backend adds each term's rows [lora_row0, lora_row0 + rows()) to the output.
  // lora_row0 is where this Weight's rows start in the rows the terms count (row views move it).
  std::shared_ptr<const LoraTerms> lora;
  int64_t lora_row0 = 0;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape_numel(shape); }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  // The product of the trailing dimensions (1 for a vector): computed, not numel() / rows(), which
  // divides by zero for a valid tensor with no rows ([0, 4]).
  int64_t cols() const {
    if (shape.empty()) return 0;
    int64_t c = 1;
    for (size_t i = 1; i < shape.size(); ++i) c *= shape[i];
    return c;
  }
  const FormatTraits& format() const { return format_traits(dtype); }
  int64_t row_bytes() const { return format_row_bytes(dtype, cols()); }
  // Scale / offset entries per row (block formats).
  int64_t blocks_per_row() const { return cols() / format().block_elems; }
  // 0 for a per-tensor scale (F8_E4M3_SCALED): no row owns an entry, so row views share it.
  int64_t scales_per_row() const {
    return format().scale_per_tensor ? 0 : format().scale_per_row ? 1 : blocks_per_row();
  }

  // Rows [r0, r1) as a Weight sharing this one's storage (outer dimension; scales follow).
  // Fails for r0 > r1, r1 > rows() or a packed layout.
  Result<Weight> row_range(int64_t r0, int64_t r1) const;
  // [this; below] as one Weight sharing their storage, when `below`'s rows, scales and offsets
  // lie right after this one's in memory (a layer's gate and up projections in a safetensors file
  // written in name order) and both have one format, column count, device and owner; else
  // nullopt. Rows are then read across the seam as from one tensor, and nothing is copied.
  std::optional<Weight> stacked_with(const Weight& below) const;
};

// Converts elements [offset, offset+n) of a weight (row-major, host) to float32. For block
// formats the range must cover whole blocks of whole rows' columns (see format_row_ok).
void weight_to_f32(const Weight& w, int64_t offset, int64_t n, float* out);
// Row `r` of a 2-D (or flattened) weight as float32.
void weight_row_to_f32(const Weight& w, int64_t r, float* out);
// Whole weight as a float32 Tensor (for small tensors: norms, biases, convs).
Tensor weight_to_tensor(const Weight& w);
// Whole weight as a float32 vector.
std::vector<float> weight_to_vector(const Weight& w);

// Checks that a weight's byte size, scales and shape agree with its format (used by sources
// and tests); the message names the tensor.
Status validate_weight(const Weight& w);

}  // namespace klein
