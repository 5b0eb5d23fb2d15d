#include "backend/cuda/pack.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace klein::cuda_pack {

Target target_for(const Weight& w, bool bf16_matrices) {
  return bf16_matrices && w.shape.size() >= 2 ? Target::kBF16 : Target::kF32;
}

int64_t target_size(Target t) { return t == Target::kBF16 ? 2 : 4; }

int64_t packed_bytes(const Weight& w, Target t) { return w.numel() * target_size(t); }

DType target_dtype(Target t) { return t == Target::kBF16 ? DType::kBF16 : DType::kF32; }

Status check_packable(const Weight& w) {
  if (w.device != Device::kCpu) return internal_error("weight '" + w.name + "' is not in host memory");
  if (w.layout != Layout::kRowMajor) return internal_error("weight '" + w.name + "' has a packed (CPU) layout");
  if (w.act_rotation_group > 0)
    return unsupported("weight '" + w.name + "' is ComfyUI int8 with convrot (its inputs rotated in groups of " +
                       std::to_string(w.act_rotation_group) + "), which the CUDA backend does not compute");
  const FormatTraits& f = w.format();
  if (!f.is_weight || !f.row_to_f32)
    return unsupported("weight '" + w.name + "' is stored as " + std::string(f.name) +
                       ", which the CUDA backend cannot compute with");
  if (w.numel() > 0 && w.data == nullptr) return internal_error("weight '" + w.name + "' has no data");
  return validate_weight(w);
}

namespace {

// Rows [r0, r1) as f32 or bf16, single-threaded; `tmp` holds one row of f32 when converting.
void pack_range(const Weight& w, int64_t r0, int64_t r1, Target t, void* out) {
  const int64_t cols = w.shape.empty() ? 1 : w.cols();
  const int64_t n = (r1 - r0) * cols;
  if (n <= 0) return;
  const bool copy = (t == Target::kBF16 && w.dtype == DType::kBF16) || (t == Target::kF32 && w.dtype == DType::kF32);
  if (copy) {
    const int64_t es = target_size(t);
    std::memcpy(out, static_cast<const uint8_t*>(w.data) + r0 * cols * es, static_cast<size_t>(n * es));
    return;
  }
  if (t == Target::kF32) {
    weight_to_f32(w, r0 * cols, n, static_cast<float*>(out));
    return;
  }
  std::vector<float> row(static_cast<size_t>(cols));
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t r = r0; r < r1; ++r) {
    weight_to_f32(w, r * cols, cols, row.data());
    for (int64_t c = 0; c < cols; ++c) o[(r - r0) * cols + c] = f32_to_bf16(row[c]);
  }
}

}  // namespace

Status pack_rows(const Weight& w, int64_t r0, int64_t r1, Target t, void* out, ThreadPool* pool) {
  KLEIN_RETURN_IF_ERROR(check_packable(w));
  const int64_t rows = w.shape.empty() ? 1 : w.rows();
  if (r0 < 0 || r1 < r0 || r1 > rows)
    return internal_error("weight '" + w.name + "': rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                          ") outside [0, " + std::to_string(rows) + ")");
  if (r1 == r0) return Status::Ok();
  if (!out) return internal_error("weight '" + w.name + "': no output buffer");
  const int64_t cols = w.shape.empty() ? 1 : w.cols();
  const int64_t es = target_size(t);
  // Parallel over rows when there are enough of them to matter (a few MB per task).
  if (pool && pool->size() > 1 && (r1 - r0) * cols >= (int64_t{1} << 20)) {
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, cols));
    pool->parallel_for(r1 - r0, [&](int64_t b, int64_t e) {
      pack_range(w, r0 + b, r0 + e, t, static_cast<uint8_t*>(out) + b * cols * es);
    }, grain);
  } else {
    pack_range(w, r0, r1, t, out);
  }
  return Status::Ok();
}

int64_t rows_per_chunk(const Weight& w, Target t, int64_t chunk_bytes) {
  const int64_t row = (w.shape.empty() ? 1 : w.cols()) * target_size(t);
  return std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, row));
}

}  // namespace klein::cuda_pack
