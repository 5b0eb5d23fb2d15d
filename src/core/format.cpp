#include "core/format.h"

#include <cstring>

#include "core/format_gguf.h"
#include "core/weight.h"

namespace klein {
namespace {

// Element i of a T array at `p`, read through memcpy: a safetensors file whose header length is
// not a multiple of the element size leaves the mapped data misaligned, and dereferencing a
// misaligned uint16_t* is undefined behaviour (it traps under -fsanitize=alignment).
template <class T>
T load_at(const void* p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(p) + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <class T, float (*Conv)(T)>
void plain_row(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const int64_t base = r * w.cols() + c0;
  for (int64_t i = 0; i < n; ++i) out[i] = Conv(load_at<T>(w.data, base + i));
}

float u16_bf16(uint16_t v) { return bf16_to_f32(v); }
float u16_f16(uint16_t v) { return f16_to_f32(v); }
float u8_f8(uint8_t v) { return f8e4m3_to_f32(v); }
float u8_f8e5m2(uint8_t v) { return f8e5m2_to_f32(v); }

void f32_row(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  std::memcpy(out, static_cast<const float*>(w.data) + r * w.cols() + c0, n * sizeof(float));
}

// Q8_ROW: int8 [rows, cols], one scale per row: v = scale[r] · q.
void q8row_row(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const int8_t* q = static_cast<const int8_t*>(w.data) + r * w.cols() + c0;
  const float s = scale_at(w.scales, w.scale_dtype, r);
  for (int64_t i = 0; i < n; ++i) out[i] = s * static_cast<float>(q[i]);
}

// Q4_G64: nibbles packed low-first (byte b holds elements 2b and 2b+1; MLX's uint32 words of 8
// nibbles are the same bytes on a little-endian machine); per group of 64: v = offset + scale·q,
// as MLX dequantises (w = scales * q + biases).
void q4g64_row(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols(), groups = cols / 64;
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
  for (int64_t g = c0 / 64; g < (c0 + n) / 64; ++g) {
    const float s = scale_at(w.scales, w.scale_dtype, r * groups + g);
    const float m = scale_at(w.offsets, w.scale_dtype, r * groups + g);
    float* o = out + (g * 64 - c0);
    for (int64_t i = 0; i < 64; i += 2) {
      const uint8_t b = q[(g * 64 + i) / 2];
      o[i] = m + s * static_cast<float>(b & 0xf);
      o[i + 1] = m + s * static_cast<float>(b >> 4);
    }
  }
}

// Q8_G64: one byte per element (MLX's uint32 words of 4 bytes, low first, are these bytes on a
// little-endian machine); per group of 64: v = offset + scale·q, as MLX dequantises.
void q8g64_row(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols(), groups = cols / 64;
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
  for (int64_t g = c0 / 64; g < (c0 + n) / 64; ++g) {
    const float s = scale_at(w.scales, w.scale_dtype, r * groups + g);
    const float m = scale_at(w.offsets, w.scale_dtype, r * groups + g);
    float* o = out + (g * 64 - c0);
    for (int64_t i = 0; i < 64; ++i) o[i] = m + s * static_cast<float>(q[g * 64 + i]);
  }
}

// F8_E4M3_SCALED: e4m3fn bytes and one scale for the tensor: v = e4m3(q) · scale, one float32
// multiply (the dequantisation BFL's and ComfyUI's loaders do before a bf16 matmul).
void f8scaled_row(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * w.cols() + c0;
  const float s = scale_at(w.scales, w.scale_dtype, 0);
  for (int64_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(q[i]) * s;
}

using S = ScalePlace;
// id, name, safetensors name, bits, block elems, block bytes, scales, offsets, float, weight, row_to_f32
constexpr FormatTraits kTable[] = {
    {DType::kF32, "F32", "F32", 32, 1, 4, S::kNone, false, true, true, f32_row},
    {DType::kF16, "F16", "F16", 16, 1, 2, S::kNone, false, true, true, plain_row<uint16_t, u16_f16>},
    {DType::kBF16, "BF16", "BF16", 16, 1, 2, S::kNone, false, true, true, plain_row<uint16_t, u16_bf16>},
    {DType::kF64, "F64", "F64", 64, 1, 8, S::kNone, false, true, false, nullptr},
    {DType::kI8, "I8", "I8", 8, 1, 1, S::kNone, false, false, false, nullptr},
    {DType::kU8, "U8", "U8", 8, 1, 1, S::kNone, false, false, false, nullptr},
    {DType::kI16, "I16", "I16", 16, 1, 2, S::kNone, false, false, false, nullptr},
    {DType::kI32, "I32", "I32", 32, 1, 4, S::kNone, false, false, false, nullptr},
    {DType::kI64, "I64", "I64", 64, 1, 8, S::kNone, false, false, false, nullptr},
    {DType::kBool, "BOOL", "BOOL", 8, 1, 1, S::kNone, false, false, false, nullptr},
    {DType::kF8E4M3, "F8_E4M3", "F8_E4M3", 8, 1, 1, S::kNone, false, true, true, plain_row<uint8_t, u8_f8>},
    {DType::kU32, "U32", "U32", 32, 1, 4, S::kNone, false, false, false, nullptr},
    {DType::kQ8Row, "Q8_ROW", "", 8, 1, 1, S::kSeparate, false, true, true, q8row_row, true},
    {DType::kQ4G64, "Q4_G64", "", 4, 64, 32, S::kSeparate, true, true, true, q4g64_row},
    {DType::kF8E5M2, "F8_E5M2", "F8_E5M2", 8, 1, 1, S::kNone, false, true, false, plain_row<uint8_t, u8_f8e5m2>},
    {DType::kF8E4M3Scaled, "F8_E4M3_SCALED", "", 8, 1, 1, S::kSeparate, false, true, true, f8scaled_row, false,
     true},
    {DType::kQ8G64, "Q8_G64", "", 8, 64, 64, S::kSeparate, true, true, true, q8g64_row},
    // ggml's block formats (GGUF), scales and mins inside each block; core/format_gguf.h.
    {DType::kQ8_0, "Q8_0", "", 8, 32, 34, S::kInBlock, false, true, true, ggml_rows::q8_0},
    {DType::kQ4_0, "Q4_0", "", 4, 32, 18, S::kInBlock, false, true, true, ggml_rows::q4_0},
    {DType::kQ4_1, "Q4_1", "", 4, 32, 20, S::kInBlock, true, true, true, ggml_rows::q4_1},
    {DType::kQ5_0, "Q5_0", "", 5, 32, 22, S::kInBlock, false, true, true, ggml_rows::q5_0},
    {DType::kQ5_1, "Q5_1", "", 5, 32, 24, S::kInBlock, true, true, true, ggml_rows::q5_1},
    {DType::kQ2_K, "Q2_K", "", 2, 256, 84, S::kInBlock, true, true, true, ggml_rows::q2_k},
    {DType::kQ3_K, "Q3_K", "", 3, 256, 110, S::kInBlock, false, true, true, ggml_rows::q3_k},
    {DType::kQ4_K, "Q4_K", "", 4, 256, 144, S::kInBlock, true, true, true, ggml_rows::q4_k},
    {DType::kQ5_K, "Q5_K", "", 5, 256, 176, S::kInBlock, true, true, true, ggml_rows::q5_k},
    {DType::kQ6_K, "Q6_K", "", 6, 256, 210, S::kInBlock, false, true, true, ggml_rows::q6_k},
};
static_assert(std::size(kTable) == static_cast<size_t>(DType::kCount), "one row per DType");

constexpr bool table_in_order() {
  for (size_t i = 0; i < std::size(kTable); ++i)
    if (static_cast<size_t>(kTable[i].id) != i) return false;
  return true;
}
static_assert(table_in_order(), "format table rows must be in DType order");

}  // namespace

std::span<const FormatTraits> format_table() { return kTable; }

const FormatTraits& format_traits(DType t) {
  const auto i = static_cast<size_t>(t);
  return kTable[i < std::size(kTable) ? i : 0];
}

bool format_row_ok(DType t, int64_t cols) {
  const FormatTraits& f = format_traits(t);
  return cols >= 0 && cols % f.block_elems == 0;
}

int64_t format_row_bytes(DType t, int64_t cols) {
  const FormatTraits& f = format_traits(t);
  return cols / f.block_elems * f.block_bytes;
}

size_t dtype_size(DType t) {
  const FormatTraits& f = format_traits(t);
  return f.block_elems == 1 && f.scales == ScalePlace::kNone ? static_cast<size_t>(f.block_bytes) : 0;
}

std::string_view dtype_name(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kTable) ? kTable[i].name : std::string_view("?");
}

bool dtype_from_safetensors(std::string_view s, DType* out) {
  for (const auto& f : kTable)
    if (!f.safetensors_name.empty() && f.safetensors_name == s) {
      *out = f.id;
      return true;
    }
  return false;
}

bool dtype_from_name(std::string_view s, DType* out) {
  for (const auto& f : kTable)
    if (f.name == s) {
      *out = f.id;
      return true;
    }
  return false;
}

float scale_at(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return f16_to_f32(load_at<uint16_t>(p, i));
    case DType::kBF16: return bf16_to_f32(load_at<uint16_t>(p, i));
    default: return load_at<float>(p, i);
  }
}

void scales_to_f32(const void* p, DType t, int64_t i0, int64_t n, float* out) {
  switch (t) {
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_at<uint16_t>(p, i0 + i));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_at<uint16_t>(p, i0 + i));
      break;
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = load_at<float>(p, i0 + i);
  }
}

}  // namespace klein
