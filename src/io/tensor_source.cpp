#include "io/tensor_source.h"

#include <algorithm>
#include <string>

namespace fs = std::filesystem;

namespace klein {

namespace {

// The file alone gives only the bits per group of a U32-packed MLX weight (words per row × 32 /
// groups per row): e.g. 512 is 8-bit with groups of 64 or 4-bit with groups of 128. Names the
// layouts MLX can write (bits 2-8, groups 32 / 64 / 128) that fit, for the error message.
std::string mlx_layout_guess(int64_t bits_per_group) {
  std::string fits;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      if (bits * group == bits_per_group)
        fits += (fits.empty() ? "" : " or ") + std::to_string(bits) + "-bit with groups of " + std::to_string(group);
  return fits.empty() ? std::to_string(bits_per_group) + " bits per group, no MLX layout" : "MLX " + fits;
}

bool is_scale_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// "a.b.weight" → "a.b." (MLX names the companions of a.b.weight a.b.scales / a.b.biases).
bool mlx_base(const std::string& name, std::string* base) {
  static const std::string kSuffix = "weight";
  if (!name.ends_with("." + kSuffix)) return false;
  *base = name.substr(0, name.size() - kSuffix.size());
  return true;
}

}  // namespace

Result<std::shared_ptr<SafetensorsSource>> SafetensorsSource::open(const fs::path& path) {
  KLEIN_ASSIGN_OR_RETURN(auto store, WeightStore::open(path));
  return std::make_shared<SafetensorsSource>(std::move(store));
}

SafetensorsSource::SafetensorsSource(WeightStore store) : store_(std::move(store)) {
  // Pair each integer weight with the companions that make it a quantized weight. A pairing
  // with a companion missing is kept: get() then names the missing one.
  for (const std::string& n : store_.names()) {
    const TensorEntry* e = store_.entry(n);
    Companions c;
    std::string base;
    if (e->dtype == DType::kI8 && store_.has(n + "_scale")) {
      c.scale = n + "_scale";
    } else if (e->dtype == DType::kU32 && mlx_base(n, &base) &&
               (store_.has(base + "scales") || store_.has(base + "biases"))) {
      c.scale = base + "scales";
      c.offset = base + "biases";
    } else {
      continue;
    }
    for (const std::string* comp : {&c.scale, &c.offset})
      if (!comp->empty() && store_.has(*comp)) companion_of_[*comp] = n;
    quantized_.emplace(n, std::move(c));
  }
}

bool SafetensorsSource::has(const std::string& name) const {
  return store_.has(name) && !companion_of_.count(name);
}

std::vector<std::string> SafetensorsSource::names() const {
  std::vector<std::string> r = store_.names();
  std::erase_if(r, [&](const std::string& n) { return companion_of_.count(n) != 0; });
  return r;
}

std::string SafetensorsSource::file_of(const std::string& name) const {
  const std::string& f = store_.file_of(name);
  return f.empty() ? store_.origin() : f;
}

Result<Weight> SafetensorsSource::get(const std::string& name) const {
  if (!has(name)) return not_found(store_.origin() + ": tensor '" + name + "' is missing");
  auto q = quantized_.find(name);
  if (q != quantized_.end()) return resolve(name, q->second);
  KLEIN_ASSIGN_OR_RETURN(Weight w, store_.get(name));
  // An integer ".weight" on its own is a quantized weight that lost its scales (a partial copy
  // or a converter bug); say so rather than "I8 is not a weight format" later.
  std::string base;
  if (w.dtype == DType::kI8 && name.ends_with(".weight"))
    return format_error(file_of(name) + ": tensor '" + name + "' is stored I8 but its companion '" + name +
                        "_scale' (one scale per row) is missing");
  if (w.dtype == DType::kU32 && mlx_base(name, &base))
    return format_error(file_of(name) + ": tensor '" + name + "' is stored U32 (MLX 4-bit) but its companions '" +
                        base + "scales' and '" + base + "biases' are missing");
  return w;
}

Result<Weight> SafetensorsSource::resolve(const std::string& name, const Companions& c) const {
  const std::string file = file_of(name);
  const std::string where = file + ": tensor '" + name + "'";
  for (const std::string* comp : {&c.scale, &c.offset})
    if (!comp->empty() && !store_.has(*comp))
      return format_error(where + " is a quantized weight, but its companion '" + *comp + "' is missing");
  const TensorEntry* e = store_.entry(name);
  const TensorEntry* s = store_.entry(c.scale);
  if (!is_scale_dtype(s->dtype))
    return unsupported(where + ": scales '" + c.scale + "' have dtype " + std::string(dtype_name(s->dtype)) +
                       " (f32, f16 or bf16)");
  if (e->shape.empty()) return format_error(where + " is a quantized weight without dimensions");
  const int64_t rows = e->shape[0];
  Weight w;
  w.name = name;
  w.data = e->data;
  w.nbytes = e->nbytes;
  w.scales = s->data;
  w.scale_dtype = s->dtype;
  if (c.offset.empty()) {
    // Q8_ROW: int8 [rows, ...] and one scale per row, stored [rows] or [rows, 1].
    if (s->shape != Shape{rows} && s->shape != Shape{rows, 1})
      return format_error(where + ": scales '" + c.scale + "' have shape " + shape_str(s->shape) + ", expected [" +
                          std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1] (one per row)");
    w.dtype = DType::kQ8Row;
    w.shape = e->shape;
  } else {
    // MLX 4-bit: uint32 [rows, cols/8] (8 nibbles per word, low first) with scales and biases
    // [rows, cols/group]; the engine computes group 64 only.
    const TensorEntry* b = store_.entry(c.offset);
    if (e->shape.size() != 2)
      return format_error(where + ": a 4-bit weight must be 2-D, got " + shape_str(e->shape));
    const int64_t cols = e->shape[1] * 8;
    if (s->shape.size() != 2 || s->shape[0] != rows || s->shape[1] <= 0 || cols % s->shape[1] != 0)
      return format_error(where + ": scales '" + c.scale + "' have shape " + shape_str(s->shape) +
                          ", which does not divide the weight's " + std::to_string(rows) + " x " +
                          std::to_string(cols) + " into groups");
    if (cols / s->shape[1] != 64)
      return unsupported(where + ": " + mlx_layout_guess(e->shape[1] * 32 / s->shape[1]) +
                         " (klein computes MLX 4-bit with groups of 64: `klein quantize --type q4` of the "
                         "full-precision model writes that)");
    if (b->shape != s->shape || b->dtype != s->dtype)
      return format_error(where + ": biases '" + c.offset + "' (" + std::string(dtype_name(b->dtype)) + " " +
                          shape_str(b->shape) + ") do not match its scales (" + std::string(dtype_name(s->dtype)) +
                          " " + shape_str(s->shape) + ")");
    w.dtype = DType::kQ4G64;
    w.shape = {rows, cols};
    w.offsets = b->data;
  }
  if (Status st = validate_weight(w); !st.ok()) return Status(st.code(), file + ": " + st.message());
  return w;
}

}  // namespace klein
