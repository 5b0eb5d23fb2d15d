#include "core/weight.h"

#include <cstring>
#include <stdexcept>

namespace klein {

void weight_to_f32(const Weight& w, int64_t offset, int64_t n, float* out) {
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + offset, n * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(p[i]);
      return;
    }
    case DType::kQ8Row:
    case DType::kQ4G64: {
      // Row-aligned ranges only; used through weight_row_to_f32.
      const int64_t cols = w.cols();
      if (offset % cols != 0 || n % cols != 0)
        throw std::logic_error("weight_to_f32: quantized range not row-aligned: " + w.name);
      for (int64_t r = 0; r < n / cols; ++r) weight_row_to_f32(w, offset / cols + r, out + r * cols);
      return;
    }
    default:
      throw std::logic_error("weight_to_f32: unsupported dtype for " + w.name);
  }
}

void weight_row_to_f32(const Weight& w, int64_t r, float* out) {
  const int64_t cols = w.cols();
  if (w.dtype == DType::kQ8Row) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
    const float s = w.scales[r];
    for (int64_t i = 0; i < cols; ++i) out[i] = s * q[i];
    return;
  }
  if (w.dtype == DType::kQ4G64) {
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
    const int64_t groups = cols / 64;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = w.scales[r * groups + g], m = w.mins[r * groups + g];
      for (int64_t i = 0; i < 64; i += 2) {
        uint8_t b = q[(g * 64 + i) / 2];
        out[g * 64 + i] = m + s * static_cast<float>(b & 0xf);
        out[g * 64 + i + 1] = m + s * static_cast<float>(b >> 4);
      }
    }
    return;
  }
  weight_to_f32(w, r * cols, cols, out);
}

Tensor weight_to_tensor(const Weight& w) {
  Tensor t(w.shape);
  if (w.dtype == DType::kQ8Row || w.dtype == DType::kQ4G64) {
    for (int64_t r = 0; r < w.rows(); ++r) weight_row_to_f32(w, r, t.data() + r * w.cols());
  } else {
    weight_to_f32(w, 0, t.numel(), t.data());
  }
  return t;
}

}  // namespace klein
