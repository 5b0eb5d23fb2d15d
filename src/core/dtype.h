// Storage types of weights and tensors, and scalar conversions between them. What each type
// is (size, blocks, scales, safetensors name) is in the format table, core/format.h.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace klein {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kU8,
  kI16,
  kI32,
  kI64,
  kBool,
  kF8E4M3,
  kU32,
  // Quantized weight formats (engine formats; their traits are in core/format.h).
  kQ8Row,  // int8 per output row, one scale per row (symmetric)
  kQ4G64,  // int4 affine, groups of 64 along K, scale + offset per group, MLX nibble order
  kF8E5M2,  // float8 e5m2 as stored (read; not a weight format the engine computes with)
  kF8E4M3Scaled,  // float8 e4m3fn with one float32 scale per tensor: v = e4m3(q) · scale (BFL / ComfyUI fp8)
  kQ8G64,  // uint8 affine, groups of 64 along K, scale + offset per group (MLX / mflux 8-bit)
  // GGUF (ggml) block formats, stored as ggml writes them: scales inside each block.
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kCount,  // number of formats (not a format)
};

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even, as torch's .to(bfloat16); NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds a float to the nearest bf16 value and back (used where the reference rounds to bf16).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// E4M3FN (bias 7, no infinities; 0x7f / 0xff are NaN) and E5M2 (bias 15, IEEE-like: inf and NaN).
float f8e4m3_to_f32(uint8_t v);
float f8e5m2_to_f32(uint8_t v);

}  // namespace klein
