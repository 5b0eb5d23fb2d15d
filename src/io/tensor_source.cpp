#include "io/tensor_source.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "io/name_map.h"

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
      if (bits * group == bits_per_group) fits += (fits.empty() ? "" : " or ") + mlx_layout_name(bits, group).substr(4);
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

std::string mlx_layout_name(int64_t bits, int64_t group) {
  const bool bits_ok = bits >= 2 && bits <= 8 && bits != 7, group_ok = group == 32 || group == 64 || group == 128;
  if (!bits_ok || !group_ok) return "";
  return "MLX " + std::to_string(bits) + "-bit with groups of " + std::to_string(group);
}

Status unsupported_mlx_layout(const std::string& where, const std::string& layout) {
  return unsupported(where + ": " + layout +
                     " (klein computes MLX 4-bit with groups of 64: `klein quantize --type q4` of the "
                     "full-precision model writes that; MLX 8-bit with groups of 64 where the file says so, as "
                     "mflux packs' quantization_level 8 does; and int8 per row: --type q8)");
}

Result<std::shared_ptr<SafetensorsSource>> SafetensorsSource::open(const fs::path& path) {
  KLEIN_ASSIGN_OR_RETURN(auto store, WeightStore::open(path));
  return std::make_shared<SafetensorsSource>(std::move(store));
}

SafetensorsSource::SafetensorsSource(WeightStore store) : store_(std::move(store)) {
  // mflux writes its bit width into every shard's header; U32 words alone cannot tell 8-bit
  // groups of 64 from 4-bit groups of 128 (both 512 bits per group).
  if (auto m = store_.metadata().find("quantization_level"); m != store_.metadata().end())
    mlx_bits_ = m->second == "8" ? 8 : m->second == "4" ? 4 : -1;
  if (auto m = store_.metadata().find("_quantization_metadata"); m != store_.metadata().end()) {
    auto layers = parse_quantization_metadata(m->second, store_.origin() + ": header _quantization_metadata");
    if (layers.ok()) layer_meta_ = std::move(*layers);
    else meta_status_ = layers.status();
  }
  // A file with any weight scale (or ComfyUI's legacy marker tensor `scaled_fp8`) stores scaled
  // fp8: there an F8_E4M3 weight without its scale is broken, not a plain fp8 tensor.
  bool scaled_file = false;
  for (const std::string& n : store_.names()) {
    if (n == "scaled_fp8" || n.ends_with(".scaled_fp8")) {
      scaled_file = true;
      companion_of_[n] = "";  // a marker, no tensor of the model
    }
    for (const CompanionRule& r : quant_companion_rules())
      scaled_file |= r.role == CompanionRole::kWeightScale && n.size() > r.suffix.size() && n.ends_with(r.suffix) &&
                     n[n.size() - r.suffix.size() - 1] == '.';
  }
  // Pair each integer weight with the companions that make it a quantized weight. A pairing
  // with a companion missing is kept: get() then names the missing one.
  for (const std::string& n : store_.names()) {
    const TensorEntry* e = store_.entry(n);
    Companions c;
    std::string base;
    const bool layer_weight = mlx_base(n, &base);  // "X.weight" → "X."
    if (layer_weight && e->dtype != DType::kU32)
      for (const CompanionRule& r : quant_companion_rules()) {
        std::string* slot = r.role == CompanionRole::kWeightScale  ? &c.scale
                            : r.role == CompanionRole::kInputScale ? &c.input_scale
                                                                   : &c.config;
        if (slot->empty() && store_.has(base + std::string(r.suffix))) *slot = base + std::string(r.suffix);
      }
    if (e->dtype == DType::kI8 && (store_.has(n + "_scale") || !c.scale.empty())) {
      if (store_.has(n + "_scale")) c.scale = n + "_scale";
    } else if (e->dtype == DType::kF8E4M3 && layer_weight && (!c.scale.empty() || !c.config.empty() || scaled_file)) {
      if (c.scale.empty()) c.scale = base + "weight_scale";  // missing: get() names it
    } else if (e->dtype == DType::kU32 && mlx_base(n, &base) &&
               (store_.has(base + "scales") || store_.has(base + "biases"))) {
      c.scale = base + "scales";
      c.offset = base + "biases";
    } else if (c.config.empty()) {
      continue;  // a plain tensor (a float weight's config alone is still checked, below)
    } else {
      c.scale.clear();
      c.input_scale.clear();
    }
    for (const std::string* comp : {&c.scale, &c.offset, &c.input_scale, &c.config})
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
  KLEIN_RETURN_IF_ERROR(meta_status_);
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
    return format_error(file_of(name) + ": tensor '" + name + "' is stored U32 (MLX-packed) but its companions '" +
                        base + "scales' and '" + base + "biases' are missing");
  KLEIN_RETURN_IF_ERROR(check_layer_quant(name, file_of(name) + ": tensor '" + name + "'", w.dtype, ""));
  return w;
}

Status SafetensorsSource::check_layer_quant(const std::string& name, const std::string& where, DType stored,
                                            const std::string& config, int64_t* rotation) const {
  std::optional<LayerQuant> q;
  const std::string layer = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
  if (!config.empty()) {
    // ComfyUI stores the JSON's bytes as a U8 vector.
    const TensorEntry* c = store_.entry(config);
    const std::string at = file_of(config) + ": tensor '" + config + "'";
    if (c->dtype != DType::kU8 || c->shape.size() != 1)
      return format_error(at + " must be a U8 vector of JSON bytes, got " + std::string(dtype_name(c->dtype)) + " " +
                          shape_str(c->shape));
    KLEIN_ASSIGN_OR_RETURN(q, parse_comfy_quant(std::string_view(reinterpret_cast<const char*>(c->data), c->nbytes), at));
  } else if (auto m = layer_meta_.find(layer); m != layer_meta_.end()) {
    q = m->second;
  }
  if (!q) return Status::Ok();
  const DType want = q->format == "float8_e4m3fn" ? DType::kF8E4M3 : DType::kI8;
  if (stored != want)
    return format_error(where + ": its layer's quantization config says " + q->format + ", but the weight is stored " +
                        std::string(dtype_name(stored)));
  if (q->convrot) {
    // comfy-kitchen's regular Hadamard exists for powers of 4 (Kronecker powers of its 4 × 4 seed).
    const int64_t g = q->convrot_group ? q->convrot_group : 256;
    bool pow4 = g >= 4;
    for (int64_t v = g; v > 1 && pow4; v /= 4) pow4 = v % 4 == 0;
    if (!pow4 || !rotation || q->format != "int8_tensorwise")
      return unsupported(where + ": layer '" + layer + "' is " + q->format + " with convrot in groups of " +
                         std::to_string(g) + ", which klein does not compute (groups of a power of 4)");
    *rotation = g;
  }
  return Status::Ok();
}

namespace {

// A per-tensor scale: one finite value > 0 of a scale dtype, stored [] or [1].
Result<float> scalar_scale(const TensorEntry& s, const std::string& where, const std::string& sname) {
  if (!is_scale_dtype(s.dtype))
    return unsupported(where + ": scale '" + sname + "' has dtype " + std::string(dtype_name(s.dtype)) +
                       " (f32, f16 or bf16)");
  if (!(s.shape.empty() || s.shape == Shape{1}))
    return format_error(where + ": scale '" + sname + "' has shape " + shape_str(s.shape) +
                        ", expected a scalar (one scale for the tensor)");
  const float v = scale_at(s.data, s.dtype, 0);
  if (!std::isfinite(v) || v <= 0.0f) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return format_error(where + ": scale '" + sname + "' is " + b + "; a weight scale must be finite and > 0");
  }
  return v;
}

}  // namespace

Result<Weight> SafetensorsSource::resolve(const std::string& name, const Companions& c) const {
  const std::string file = file_of(name);
  const std::string where = file + ": tensor '" + name + "'";
  const TensorEntry* e = store_.entry(name);
  int64_t rotation = 0;
  KLEIN_RETURN_IF_ERROR(check_layer_quant(name, where, e->dtype, c.config, &rotation));
  if (c.scale.empty() || e->dtype != DType::kI8) rotation = 0;  // only int8 layers rotate (else refused above)
  if (c.scale.empty()) return store_.get(name);  // a float weight whose config said so
  for (const std::string* comp : {&c.scale, &c.offset})
    if (!comp->empty() && !store_.has(*comp))
      return format_error(where + " is a quantized weight, but its companion '" + *comp + "' is missing");
  const TensorEntry* s = store_.entry(c.scale);
  if (e->dtype == DType::kF8E4M3) return resolve_fp8(name, c, where);
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
  if (c.offset.empty() && (s->shape.empty() || s->shape == Shape{1})) {
    // ComfyUI int8_tensorwise with one scale for the tensor: the same W8A8 arithmetic as Q8_ROW
    // with that scale in every row (rows floats, owned; the int8 payload stays mapped).
    KLEIN_ASSIGN_OR_RETURN(const float v, scalar_scale(*s, where, c.scale));
    auto per_row = std::make_shared<std::vector<float>>(static_cast<size_t>(std::max<int64_t>(rows, 1)), v);
    w.scales = per_row->data();
    w.scale_dtype = DType::kF32;
    w.owner = per_row;
    w.dtype = DType::kQ8Row;
    w.shape = e->shape;
  } else if (c.offset.empty()) {
    // Q8_ROW: int8 [rows, ...] and one scale per row, stored [rows] or [rows, 1].
    if (s->shape != Shape{rows} && s->shape != Shape{rows, 1})
      return format_error(where + ": scales '" + c.scale + "' have shape " + shape_str(s->shape) + ", expected [" +
                          std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1] (one per row)");
    w.dtype = DType::kQ8Row;
    w.shape = e->shape;
  } else {
    // MLX 4-bit: uint32 [rows, cols/8] (8 nibbles per word, low first), or 8-bit where the header
    // says so (mflux): [rows, cols/4], 4 bytes per word, low first; with scales and biases
    // [rows, cols/group]. The engine computes groups of 64.
    const TensorEntry* b = store_.entry(c.offset);
    if (e->shape.size() != 2)
      return format_error(where + ": an MLX-packed weight must be 2-D, got " + shape_str(e->shape));
    if (mlx_bits_ < 0)
      return unsupported_mlx_layout(where, "header quantization_level \"" +
                                               store_.metadata().at("quantization_level") + "\"");
    const int64_t per_word = mlx_bits_ == 8 ? 4 : 8;
    const int64_t cols = e->shape[1] * per_word;
    if (s->shape.size() != 2 || s->shape[0] != rows || s->shape[1] <= 0 || cols % s->shape[1] != 0)
      return format_error(where + ": scales '" + c.scale + "' have shape " + shape_str(s->shape) +
                          ", which does not divide the weight's " + std::to_string(rows) + " x " +
                          std::to_string(cols) + " into groups");
    if (cols / s->shape[1] != 64) {
      const std::string named = mlx_bits_ > 0 ? mlx_layout_name(mlx_bits_, cols / s->shape[1]) : "";
      return unsupported_mlx_layout(where, named.empty() ? mlx_layout_guess(e->shape[1] * 32 / s->shape[1]) : named);
    }
    if (b->shape != s->shape || b->dtype != s->dtype)
      return format_error(where + ": biases '" + c.offset + "' (" + std::string(dtype_name(b->dtype)) + " " +
                          shape_str(b->shape) + ") do not match its scales (" + std::string(dtype_name(s->dtype)) +
                          " " + shape_str(s->shape) + ")");
    w.dtype = mlx_bits_ == 8 ? DType::kQ8G64 : DType::kQ4G64;
    w.shape = {rows, cols};
    w.offsets = b->data;
  }
  if (rotation > 0) {
    if (w.cols() % rotation != 0)
      return format_error(where + ": convrot groups of " + std::to_string(rotation) + " do not divide its " +
                          std::to_string(w.cols()) + " columns");
    w.act_rotation_group = rotation;
  }
  if (Status st = validate_weight(w); !st.ok()) return Status(st.code(), file + ": " + st.message());
  return w;
}

Result<Weight> SafetensorsSource::resolve_fp8(const std::string& name, const Companions& c,
                                              const std::string& where) const {
  const TensorEntry* e = store_.entry(name);
  const TensorEntry* s = store_.entry(c.scale);
  KLEIN_RETURN_IF_ERROR(scalar_scale(*s, where, c.scale).status());
  Weight w;
  w.name = name;
  w.dtype = DType::kF8E4M3Scaled;
  w.shape = e->shape;
  w.data = e->data;
  w.nbytes = e->nbytes;
  w.scales = s->data;  // mapped: a per-tensor scale is shared by every row view
  w.scale_dtype = s->dtype;
  if (!c.input_scale.empty()) {
    KLEIN_ASSIGN_OR_RETURN(w.input_scale, scalar_scale(*store_.entry(c.input_scale), where, c.input_scale));
  }
  if (Status st = validate_weight(w); !st.ok()) return Status(st.code(), file_of(name) + ": " + st.message());
  return w;
}

namespace {

// What a config.json "quantization" entry claims the stored weights are.
struct QuantClaim {
  enum Kind { kQ8, kMlx, kNone } kind = kNone;
  int64_t bits = 0, group = 0;  // kMlx
  std::string text;             // for messages: "\"quantization\" says q8", ...
  // klein quantize's "kept": the 2-D float weights it left as stored (all of them, where none
  // fits the scheme); MLX writes no such list.
  bool has_kept = false;
  std::set<std::string> kept;
  // mlx-lm's per-layer overrides: "model.layers.0.mlp.gate_proj": {"group_size": G, "bits": B}.
  std::map<std::string, std::pair<int64_t, int64_t>> layers;
};

Result<QuantClaim> parse_quantization(const nlohmann::json& q, const std::string& where) {
  const std::string at = where + ": \"quantization\"";
  if (!q.is_object()) return format_error(at + " must be an object, got " + std::string(q.type_name()));
  auto integer = [&](const char* key, int64_t* out) -> Status {
    if (!q.contains(key)) return Status::Ok();
    const auto& v = q[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      return format_error(at + " \"" + key + "\" must be a positive integer, got " + v.dump());
    *out = v.get<int64_t>();
    return Status::Ok();
  };
  int64_t bits = 0, group = 0;
  KLEIN_RETURN_IF_ERROR(integer("bits", &bits));
  KLEIN_RETURN_IF_ERROR(integer("group_size", &group));
  std::string type, mode;
  for (auto [key, out] : {std::pair<const char*, std::string*>{"type", &type}, {"mode", &mode}})
    if (q.contains(key)) {
      if (!q[key].is_string()) return format_error(at + " \"" + key + "\" must be a string, got " + q[key].dump());
      *out = q[key].get<std::string>();
    }
  // klein quantize's modes and MLX's default one; MLX's others (mxfp4, nvfp4, mxfp8) store
  // floating-point blocks the engine does not read.
  if (!mode.empty() && mode != "affine" && mode != "affine (MLX)" && mode != "int8 symmetric per output row, f32 scale")
    return unsupported(at + " \"mode\" \"" + mode + "\": unknown scheme (klein reads affine MLX and int8 per row)");
  QuantClaim c;
  if (q.contains("kept")) {
    const auto& k = q["kept"];
    if (!k.is_array()) return format_error(at + " \"kept\" must be a list of tensor names, got " + k.dump());
    for (const auto& n : k) {
      if (!n.is_string()) return format_error(at + " \"kept\" must be a list of tensor names, got " + n.dump());
      c.kept.insert(n.get<std::string>());
    }
    c.has_kept = true;
  }
  for (auto it = q.begin(); it != q.end(); ++it) {
    if (!it->is_object()) continue;
    const auto& o = *it;
    auto num = [&](const char* k, int64_t dflt) {
      return o.contains(k) && o[k].is_number_integer() ? o[k].get<int64_t>() : dflt;
    };
    c.layers[it.key()] = {num("bits", bits ? bits : 4), num("group_size", group ? group : 64)};
  }
  if (type == "q8") {
    if (bits || group)
      return format_error(at + " says type q8 (int8 per row) but also bits/group_size " + std::to_string(bits) + "/" +
                          std::to_string(group));
    c.kind = QuantClaim::kQ8;
    c.text = "\"quantization\" says q8 (int8 per row)";
    return c;
  }
  if (type == "bf16") {
    c.text = "\"quantization\" says bf16 (no quantized weights)";
    return c;
  }
  if (!type.empty() && type != "q4")
    return unsupported(at + " type \"" + type +
                       "\": unknown scheme (klein writes q8, q4 or bf16; MLX group_size + bits)");
  if (!type.empty() && ((bits && bits != 4) || (group && group != 64)))
    return format_error(at + " says type q4 (4-bit, groups of 64) but bits " + std::to_string(bits) +
                        ", group_size " + std::to_string(group));
  if (type.empty() && !bits && !group)
    return unsupported(at + ": unknown scheme (no type, bits or group_size)");
  // MLX's defaults for a missing one (mx.quantize: group_size 64, bits 4).
  c.kind = QuantClaim::kMlx;
  c.bits = bits ? bits : 4;
  c.group = group ? group : 64;
  const std::string name = mlx_layout_name(c.bits, c.group);
  if (name.empty())
    return unsupported(at + " bits " + std::to_string(c.bits) + ", group_size " + std::to_string(c.group) +
                       ": unknown scheme (MLX writes bits 2-6 or 8, groups of 32, 64 or 128)");
  c.text = "\"quantization\" says " + name;
  return c;
}

}  // namespace

Status SafetensorsSource::check_quantization(const nlohmann::json& config, const std::string& config_where) const {
  if (!config.is_object() || !config.contains("quantization") || config["quantization"].is_null()) return Status::Ok();
  KLEIN_ASSIGN_OR_RETURN(const QuantClaim claim, parse_quantization(config["quantization"], config_where));
  const std::string says = config_where + ": " + claim.text;
  bool any_q8 = false, any_mlx = false;
  std::string first_matrix;  // the first 2-D float weight, to name when nothing is quantized
  for (const std::string& n : names()) {
    const TensorEntry* e = store_.entry(n);
    auto q = quantized_.find(n);
    // FP8 weights and float layers with a ComfyUI config are paired too, but they are neither
    // klein's int8 nor MLX's scheme: for this check they are stored float weights.
    if (q != quantized_.end() && e->dtype != DType::kI8 && e->dtype != DType::kU32) q = quantized_.end();
    if (q == quantized_.end()) {
      if (e->shape.size() != 2 || !format_traits(e->dtype).is_float || !n.ends_with(".weight")) continue;
      if (first_matrix.empty()) first_matrix = n;
      // klein quantize quantizes every 2-D float weight that it does not list as kept.
      if (claim.kind != QuantClaim::kNone && claim.has_kept && !claim.kept.count(n))
        return format_error(says + ", but tensor '" + n + "' in " + file_of(n) + " is " +
                            std::string(dtype_name(e->dtype)) + " and not in its \"kept\" list");
      continue;
    }
    const bool mlx = !q->second.offset.empty();
    const std::string tensor = "tensor '" + n + "' in " + file_of(n);
    (mlx ? any_mlx : any_q8) = true;
    if (claim.kind != (mlx ? QuantClaim::kMlx : QuantClaim::kQ8))
      return format_error(says + ", but " + tensor + " is " +
                          (mlx ? "MLX-packed (U32 words with scales and biases)" : "int8 with a per-row scale"));
    if (!mlx) continue;
    int64_t bits = claim.bits, group = claim.group;
    if (auto l = claim.layers.find(n.substr(0, n.size() - 7)); l != claim.layers.end())
      std::tie(bits, group) = l->second;
    // Words per row × 32 = bits × group × groups per row, for the claimed bits and group.
    const TensorEntry* s = store_.has(q->second.scale) ? store_.entry(q->second.scale) : nullptr;
    if (!s || e->shape.size() != 2 || s->shape.size() != 2 || s->shape[1] <= 0) continue;  // get() names these
    const std::string layout = mlx_layout_name(bits, group);
    if (layout.empty() || e->shape[1] * 32 != bits * group * s->shape[1])
      return format_error(config_where + ": \"quantization\" says " + std::to_string(bits) + "-bit with groups of " +
                          std::to_string(group) + ", but " + tensor + " (U32 " + shape_str(e->shape) + ", scales " +
                          shape_str(s->shape) + ") fits " + mlx_layout_guess(e->shape[1] * 32 / s->shape[1]));
    if ((bits != 4 || group != 64) && !(bits == 8 && group == 64 && mlx_bits_ == 8))
      return unsupported_mlx_layout(file_of(n) + ": tensor '" + n + "'",
                                    layout + " (as " + config_where + " \"quantization\" says)");
  }
  // Without a "kept" list (MLX), a quantized scheme needs at least one quantized weight.
  if (claim.kind == QuantClaim::kNone || claim.has_kept || (claim.kind == QuantClaim::kQ8 ? any_q8 : any_mlx))
    return Status::Ok();
  return format_error(says + ", but no weight is quantized" +
                      (first_matrix.empty() ? std::string()
                                            : " (tensor '" + first_matrix + "' in " + file_of(first_matrix) + " is " +
                                                  std::string(dtype_name(store_.entry(first_matrix)->dtype)) + ")"));
}

}  // namespace klein
