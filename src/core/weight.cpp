#include "core/weight.h"

#include <cstring>

namespace klein {

Result<Weight> Weight::row_range(int64_t r0, int64_t r1) const {
  if (layout != Layout::kRowMajor)
    return internal_error("weight '" + name + "': row view of a packed layout");
  if (r0 < 0 || r1 < r0 || r1 > rows())
    return internal_error("weight '" + name + "': rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                          ") outside [0, " + std::to_string(rows()) + ")");
  Weight v = *this;
  v.shape[0] = r1 - r0;
  v.lora_row0 += r0;
  const int64_t rb = row_bytes();
  v.data = static_cast<const uint8_t*>(data) + r0 * rb;
  v.nbytes = static_cast<size_t>((r1 - r0) * rb);
  if (format().scales == ScalePlace::kSeparate) {
    const int64_t per_row = scales_per_row();
    const size_t ssz = dtype_size(scale_dtype);
    v.scales = static_cast<const uint8_t*>(scales) + r0 * per_row * ssz;
    if (offsets) v.offsets = static_cast<const uint8_t*>(offsets) + r0 * per_row * ssz;
  }
  return v;
}

std::optional<Weight> Weight::stacked_with(const Weight& below) const {
  const Weight& a = *this;
  const Weight& b = below;
  if (a.empty() || b.empty() || a.layout != Layout::kRowMajor || b.layout != Layout::kRowMajor) return std::nullopt;
  // A run-time LoRA belongs to one of the two (stacking would mix up its rows).
  if (a.lora || b.lora) return std::nullopt;
  if (a.dtype != b.dtype || a.device != b.device || a.owner != b.owner || a.shape.size() != 2 ||
      b.shape.size() != 2 || a.cols() != b.cols() || a.act_rotation_group != b.act_rotation_group)
    return std::nullopt;
  // The byte counts must be what the rows take, so that the seam is where the next row starts.
  const int64_t rb = a.row_bytes();
  if (a.nbytes != static_cast<size_t>(a.rows() * rb) || b.nbytes != static_cast<size_t>(b.rows() * rb))
    return std::nullopt;
  auto follows = [](const void* first, size_t first_bytes, const void* second) {
    return first != nullptr && second != nullptr &&
           reinterpret_cast<uintptr_t>(first) + first_bytes == reinterpret_cast<uintptr_t>(second);
  };
  if (!follows(a.data, a.nbytes, b.data)) return std::nullopt;
  if (a.format().scales == ScalePlace::kSeparate) {
    if (a.scale_dtype != b.scale_dtype) return std::nullopt;
    const size_t side = static_cast<size_t>(a.rows() * a.scales_per_row()) * dtype_size(a.scale_dtype);
    if (!follows(a.scales, side, b.scales)) return std::nullopt;
    if ((a.offsets == nullptr) != (b.offsets == nullptr)) return std::nullopt;
    if (a.offsets && !follows(a.offsets, side, b.offsets)) return std::nullopt;
  }
  Weight s = a;
  s.name = a.name + " + " + b.name;
  s.shape[0] = a.rows() + b.rows();
  s.nbytes = a.nbytes + b.nbytes;
  return s;
}

void weight_to_f32(const Weight& w, int64_t offset, int64_t n, float* out) {
  const FormatTraits& f = w.format();
  const int64_t cols = w.cols();
  if (n <= 0 || cols <= 0) return;
  // Walk the range row by row (a 1-D weight is one row).
  int64_t r = offset / cols, c = offset % cols;
  while (n > 0) {
    const int64_t take = std::min<int64_t>(n, cols - c);
    f.row_to_f32(w, r, c, take, out);
    out += take;
    n -= take;
    ++r;
    c = 0;
  }
}

void weight_row_to_f32(const Weight& w, int64_t r, float* out) {
  w.format().row_to_f32(w, r, 0, w.cols(), out);
}

Tensor weight_to_tensor(const Weight& w) {
  Tensor t(w.shape);
  weight_to_f32(w, 0, t.numel(), t.data());
  return t;
}

std::vector<float> weight_to_vector(const Weight& w) {
  std::vector<float> v(static_cast<size_t>(w.numel()));
  weight_to_f32(w, 0, w.numel(), v.data());
  return v;
}

Status validate_weight(const Weight& w) {
  const FormatTraits& f = w.format();
  if (!f.is_weight || !f.row_to_f32)
    return unsupported("tensor '" + w.name + "' has dtype " + std::string(f.name) +
                       ", which is not a weight format this engine computes with");
  for (int64_t d : w.shape)
    if (d < 0) return format_error("tensor '" + w.name + "' has a negative dimension");
  if (!format_row_ok(w.dtype, w.cols()))
    return format_error("tensor '" + w.name + "' has " + std::to_string(w.cols()) + " columns, not a multiple of " +
                        std::to_string(f.block_elems) + " (" + std::string(f.name) + " blocks)");
  const int64_t want = w.rows() * w.row_bytes();
  if (w.layout == Layout::kRowMajor && static_cast<int64_t>(w.nbytes) != (w.shape.empty() ? f.block_bytes : want))
    return format_error("tensor '" + w.name + "' holds " + std::to_string(w.nbytes) + " bytes, but " +
                        std::string(f.name) + " " + shape_str(w.shape) + " needs " + std::to_string(want));
  if (f.scales == ScalePlace::kSeparate) {
    if (!w.scales) return format_error("tensor '" + w.name + "' (" + std::string(f.name) + ") has no scales");
    if (f.has_offsets && !w.offsets)
      return format_error("tensor '" + w.name + "' (" + std::string(f.name) + ") has no offsets");
    if (w.scale_dtype != DType::kF32 && w.scale_dtype != DType::kF16 && w.scale_dtype != DType::kBF16)
      return unsupported("tensor '" + w.name + "': scales of dtype " + std::string(dtype_name(w.scale_dtype)) +
                         " (f32, f16 or bf16)");
  }
  return Status::Ok();
}

}  // namespace klein
