#include "models/bind.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "io/json_file.h"

namespace klein {

namespace {

// The companion tensors holding a quantized weight's scales and offsets, as the source pairs
// them (io/tensor_source.cpp): q8 "X.weight_scale", MLX q4 "X.scales" / "X.biases".
std::string companion(const Weight& w, bool offsets) {
  if (w.dtype == DType::kQ8Row) return w.name + "_scale";
  const std::string base = w.name.ends_with(".weight") ? w.name.substr(0, w.name.size() - 6) : w.name + ".";
  return base + (offsets ? "biases" : "scales");
}

// max |v| over n values of type t (f32, f16 or bf16) at p, as a float: for non-negative values
// the bits' order is the magnitudes', with NaN above inf, so one integer max (which vectorizes;
// memcpy: the mapped file gives no alignment) finds a NaN or inf too.
float max_abs(const void* p, DType t, int64_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (t == DType::kF32) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, b + 4 * i, 4);
      m = std::max(m, u & 0x7fffffffu);
    }
    return std::bit_cast<float>(m);
  }
  uint16_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t u;
    std::memcpy(&u, b + 2 * i, 2);
    m = std::max<uint16_t>(m, u & 0x7fff);
  }
  return t == DType::kBF16 ? bf16_to_f32(m) : f16_to_f32(m);
}

// A quantized weight's scales (and q4 offsets) must be finite, and small enough that every
// dequantized value is a float32: 128·|s| for q8 (|q| ≤ 128), 15·|s| + |o| for q4 (nibbles
// 0..15). A NaN there would make the weight's rows NaN; a larger scale, rows of ±inf. A scale
// within this that still overflows a product is found at run time, as for float weights (the
// output check, non_finite_weight_status). These are small tensors — one value per row for q8,
// two per 64 weights for q4 (an eighth of its payload) — read here once, as one integer max
// each; only when the maxima fail the bound are the rows checked one by one, to name the row.
// The payloads themselves (gigabytes) are scanned only when an output goes non-finite. The q4
// ones are then dropped from this process's pages again (the page cache keeps them), so that
// load does not make them resident ahead of a memory plan that streams the weights.
Status check_scales(const TensorSource& src, const Weight& w, const std::string& file) {
  const bool q4 = w.offsets != nullptr;
  const int64_t n = w.rows() * w.scales_per_row(), per_row = w.scales_per_row();
  const float kMax = std::numeric_limits<float>::max(), mul = q4 ? 15.0f : 128.0f;
  auto fits = [&](float s, float o) { return mul * std::fabs(s) + std::fabs(o) <= kMax; };  // false for NaN
  if (!fits(max_abs(w.scales, w.scale_dtype, n), q4 ? max_abs(w.offsets, w.scale_dtype, n) : 0.0f)) {
    std::vector<float> sc(static_cast<size_t>(per_row)), of(static_cast<size_t>(per_row), 0.0f);
    for (int64_t r = 0; r < w.rows(); ++r) {
      scales_to_f32(w.scales, w.scale_dtype, r * per_row, per_row, sc.data());
      if (q4) scales_to_f32(w.offsets, w.scale_dtype, r * per_row, per_row, of.data());
      for (int64_t i = 0; i < per_row; ++i) {
        if (!std::isfinite(sc[i]) || !std::isfinite(of[i]))
          return format_error(file + ": tensor '" + companion(w, std::isfinite(sc[i])) +
                              "' has a non-finite value (NaN/Inf) at row " + std::to_string(r));
        if (!fits(sc[i], of[i])) {
          char v[32];
          std::snprintf(v, sizeof v, "%.3g", sc[i]);
          return format_error(file + ": tensor '" + companion(w, false) + "' has a scale of " + v + " at row " +
                              std::to_string(r) + ", whose dequantized weights overflow float32");
        }
      }
    }
  }
  if (q4) {
    const size_t bytes = static_cast<size_t>(n) * dtype_size(w.scale_dtype);
    src.advise(w.scales, bytes, Residency::kDontNeed);
    src.advise(w.offsets, bytes, Residency::kDontNeed);
  }
  return Status::Ok();
}

}  // namespace

Status Binder::required(const std::string& name, const Shape& expected, Weight* out) {
  if (!src_.has(name)) return not_found(src_.origin() + ": tensor '" + name + "' is missing");
  return optional(name, expected, out);
}

Status Binder::optional(const std::string& name, const Shape& expected, Weight* out) {
  *out = Weight{};
  // A model asking twice is a bug in its load(), not in the file.
  if (!bound_.insert(name).second) return internal_error("tensor '" + name + "' is bound twice");
  if (!src_.has(name)) return Status::Ok();
  KLEIN_ASSIGN_OR_RETURN(Weight w, src_.get(name));
  const std::string file = src_.file_of(name);
  if (!expected.empty() && w.shape != expected && w.dtype == DType::kQ4G64 && expected.size() == 2 &&
      w.shape[0] == expected[0] && expected[1] > 0) {
    // The source reads MLX's U32 words as 4-bit with groups of 64 wherever the shapes give 256 bits
    // per group, which 8-bit groups of 32 and 2-bit groups of 128 also do. The config's column
    // count settles it: bits = words per row × 32 / cols, group = cols / groups per row.
    const int64_t words = w.shape[1] / 8, groups = w.shape[1] / 64;
    if (words * 32 % expected[1] == 0 && expected[1] % groups == 0) {
      const std::string layout = mlx_layout_name(words * 32 / expected[1], expected[1] / groups);
      if (!layout.empty())
        return unsupported_mlx_layout(file + ": tensor '" + name + "'",
                                      layout + " (U32 [" + std::to_string(w.shape[0]) + ", " + std::to_string(words) +
                                          "] for the config's " + shape_str(expected) + ")");
    }
  }
  if (!expected.empty() && w.shape != expected)
    return format_error(file + ": tensor '" + name + "' has shape " + shape_str(w.shape) +
                        " but the config implies " + shape_str(expected));
  if (Status st = validate_weight(w); !st.ok()) return Status(st.code(), file + ": " + st.message());
  if (w.scales) KLEIN_RETURN_IF_ERROR(check_scales(src_, w, file));
  // Vectors (norms, biases) are cheap to scan here; matrices are scanned only when an output
  // goes non-finite (non_finite_weight_status).
  if (w.shape.size() <= 1 && w.numel() <= (int64_t{1} << 24)) {
    std::vector<float> v = weight_to_vector(w);
    if (!all_finite(v.data(), static_cast<int64_t>(v.size())))
      return format_error(file + ": tensor '" + name + "' has non-finite values (NaN/Inf)");
  }
  *out = std::move(w);
  return Status::Ok();
}

Status Binder::vector_f32(const std::string& name, int64_t n, std::vector<float>* out) {
  Weight w;
  KLEIN_RETURN_IF_ERROR(required(name, {n}, &w));
  *out = weight_to_vector(w);
  return Status::Ok();
}

bool Binder::ignored(const std::string& name) const {
  for (const std::string& p : ignored_)
    if (name.starts_with(p)) return true;
  return false;
}

Status Binder::finish(const std::string& described_by) const {
  for (const std::string& name : src_.names()) {
    if (bound_.count(name) || ignored(name)) continue;
    return format_error(src_.file_of(name) + ": tensor '" + name + "' is not part of the model" +
                        (described_by.empty() ? std::string() : " that " + described_by + " describes"));
  }
  return Status::Ok();
}

Status non_finite_weight_status(const TensorSource& src, const std::string& component,
                                const std::function<bool(const std::string&)>& used) {
  std::vector<float> row;
  for (const std::string& name : src.names()) {
    if (used && !used(name)) continue;
    auto w = src.get(name);
    if (!w.ok() || !validate_weight(*w).ok() || w->layout != Layout::kRowMajor) continue;
    const int64_t rows = w->shape.empty() ? 1 : w->rows(), cols = w->shape.empty() ? 1 : w->cols();
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      weight_to_f32(*w, r * cols, cols, row.data());
      if (!all_finite(row.data(), cols))
        return format_error(src.file_of(name) + ": tensor '" + name + "' has non-finite values (NaN/Inf), so the " +
                            component + " output is not finite");
    }
  }
  return internal_error(component + " produced non-finite values although every weight is finite (overflow)");
}

Result<ComponentFiles> open_component(const std::filesystem::path& dir) {
  ComponentFiles f;
  const std::filesystem::path cfg = dir / "config.json";
  f.config_where = cfg.string();
  KLEIN_ASSIGN_OR_RETURN(f.config, read_json_file(cfg));
  KLEIN_ASSIGN_OR_RETURN(auto src, SafetensorsSource::open(dir));
  KLEIN_RETURN_IF_ERROR(src->check_quantization(f.config, f.config_where));
  f.source = std::move(src);
  return f;
}

}  // namespace klein
