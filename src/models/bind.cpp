#include "models/bind.h"

#include "io/json_file.h"

namespace klein {

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
