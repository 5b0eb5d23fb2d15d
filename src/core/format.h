// The storage-format table: one row per way a tensor's elements can be stored (plain element
// types and block-quantized weight formats). The loader, the kernels' dispatch, dequantisation
// and `klein info` all read this table; nothing else switches on a format to learn its size.
//
// A block format stores a row of `cols` logical elements as cols / block_elems blocks of
// block_bytes bytes each. Its scales (and offsets) live either in a companion array
// (ScalePlace::kSeparate, one per block, in scale_dtype, which the Weight records: f32, f16 or
// bf16 — MLX keeps bf16 scales) or inside each block (kInBlock, GGUF style).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/dtype.h"

namespace klein {

struct Weight;

enum class ScalePlace : uint8_t {
  kNone,      // plain element type
  kSeparate,  // Weight::scales (and Weight::offsets) arrays, one entry per block
  kInBlock,   // inside each block's bytes
};

struct FormatTraits {
  DType id;
  std::string_view name;             // "BF16", "Q4_G64", ...
  std::string_view safetensors_name; // the safetensors dtype string; empty if not one
  int bits;                          // bits per element as stored (payload only)
  int64_t block_elems;               // elements per block (1 for plain types)
  int64_t block_bytes;               // bytes per block (element size for plain types)
  ScalePlace scales;                 // where the per-block scales live
  bool has_offsets;                  // affine formats: a per-block offset (min / bias) too
  bool is_float;                     // a floating-point element type or a format dequantised to float
  bool is_weight;                    // the kernels can compute with it as a weight (row → f32 exists)
  // Converts elements [c0, c0 + n) of row `r` of `w` (a weight of this format) to float32.
  // c0 and n must be multiples of block_elems. Null for formats the engine cannot dequantise.
  void (*row_to_f32)(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
  // ScalePlace::kSeparate: one scale (and offset) per row rather than per block (Q8_ROW).
  bool scale_per_row = false;
  // ScalePlace::kSeparate: one scale for the whole tensor (F8_E4M3_SCALED). Row views and splits
  // keep pointing at it: Weight::scales_per_row() is 0, so no row owns a scale entry.
  bool scale_per_tensor = false;
};

// The whole table, in DType order (format_table()[i].id == DType(i)).
std::span<const FormatTraits> format_table();
const FormatTraits& format_traits(DType t);

// Bytes of a row of `cols` elements (cols must be a multiple of the block size: see
// format_row_ok), or of `n` elements of a plain type.
int64_t format_row_bytes(DType t, int64_t cols);
bool format_row_ok(DType t, int64_t cols);
// Bytes per element for plain types; 0 for block formats.
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("F32", "BF16", "I8", ...). false if unknown.
bool dtype_from_safetensors(std::string_view s, DType* out);
// Parses a format name as dtype_name prints it ("Q8_ROW"); false if unknown.
bool dtype_from_name(std::string_view s, DType* out);

// One scale/offset value of type `t` (f32, f16 or bf16) at index i of `p`, as float.
float scale_at(const void* p, DType t, int64_t i);
// Elements [i0, i0 + n) of the same as float32 into out (one type switch for the whole range).
void scales_to_f32(const void* p, DType t, int64_t i0, int64_t n, float* out);

}  // namespace klein
