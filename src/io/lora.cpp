#include "io/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/weight.h"
#include "io/name_map.h"

namespace klein {

namespace {

// ---- the key schemes, as data

// What a key's last part says the tensor is.
enum class Role : uint8_t {
  kDown, kUp, kAlpha,                       // LoRA (PEFT lora_A / lora_B, kohya lora_down / lora_up)
  kLokrW1, kLokrW1A, kLokrW1B, kLokrW2, kLokrW2A, kLokrW2B,  // LyCORIS LoKr
  kHadaW1A, kHadaW1B, kHadaW2A, kHadaW2B,   // LyCORIS LoHa
  kUnsupported,                             // understood, refused (DoRA, Tucker, biases, raw diffs)
};

struct SuffixRule {
  std::string_view suffix;
  Role role;
  std::string_view scheme;  // for LoraFile::scheme
};

// Longest first where one suffix ends another (".lokr_w1_a" before ".lokr_w1" is not needed:
// suffixes are matched whole at the end of the key).
constexpr SuffixRule kSuffixes[] = {
    {".lora_A.weight", Role::kDown, "PEFT"},
    {".lora_B.weight", Role::kUp, "PEFT"},
    {".lora_down.weight", Role::kDown, "kohya"},
    {".lora_up.weight", Role::kUp, "kohya"},
    {".alpha", Role::kAlpha, ""},
    {".lokr_w1", Role::kLokrW1, "LyCORIS LoKr"},
    {".lokr_w1_a", Role::kLokrW1A, "LyCORIS LoKr"},
    {".lokr_w1_b", Role::kLokrW1B, "LyCORIS LoKr"},
    {".lokr_w2", Role::kLokrW2, "LyCORIS LoKr"},
    {".lokr_w2_a", Role::kLokrW2A, "LyCORIS LoKr"},
    {".lokr_w2_b", Role::kLokrW2B, "LyCORIS LoKr"},
    {".hada_w1_a", Role::kHadaW1A, "LyCORIS LoHa"},
    {".hada_w1_b", Role::kHadaW1B, "LyCORIS LoHa"},
    {".hada_w2_a", Role::kHadaW2A, "LyCORIS LoHa"},
    {".hada_w2_b", Role::kHadaW2B, "LyCORIS LoHa"},
    // Refused with a reason rather than reported as unknown.
    {".dora_scale", Role::kUnsupported, "DoRA (magnitude vectors)"},
    {".lora_magnitude_vector", Role::kUnsupported, "DoRA (magnitude vectors)"},
    {".lora_A.bias", Role::kUnsupported, "LoRA biases"},
    {".lora_B.bias", Role::kUnsupported, "LoRA biases"},
    {".lokr_t2", Role::kUnsupported, "LoKr Tucker factors"},
    {".hada_t1", Role::kUnsupported, "LoHa Tucker factors"},
    {".hada_t2", Role::kUnsupported, "LoHa Tucker factors"},
    {".diff", Role::kUnsupported, "full weight differences"},
    {".diff_b", Role::kUnsupported, "full bias differences"},
};

// How the module part of a key is spelled after its prefix.
enum class Naming : uint8_t {
  kDotted,      // diffusers / transformers names, or BFL names (tried in that order)
  kUnderscore,  // kohya: the dotted name with '_' for '.'
};

struct PrefixRule {
  std::string_view prefix;
  LoraComponent component;
  Naming naming;
  std::string_view scheme;
};

// The first matching prefix applies (longer ones first); "" catches bare module names (a PEFT
// save of the transformer alone). Sources: diffusers lora_pipeline.py Flux2LoraLoaderMixin
// (transformer. / text_encoder.; base_model.model. → diffusion_model.), lora_conversion_utils.py
// (_convert_non_diffusers_flux2_lora_to_diffusers: diffusion_model.; the kohya converter:
// lora_unet_), ComfyUI's model-only LoRAs (diffusion_model., model.diffusion_model.).
constexpr PrefixRule kPrefixes[] = {
    {"transformer.", LoraComponent::kTransformer, Naming::kDotted, "diffusers/PEFT"},
    {"base_model.model.", LoraComponent::kTransformer, Naming::kDotted, "BFL-named PEFT"},
    {"model.diffusion_model.", LoraComponent::kTransformer, Naming::kDotted, "BFL-named PEFT"},
    {"diffusion_model.", LoraComponent::kTransformer, Naming::kDotted, "BFL-named PEFT"},
    {"text_encoder.", LoraComponent::kTextEncoder, Naming::kDotted, "diffusers/PEFT"},
    {"lora_unet_", LoraComponent::kTransformer, Naming::kUnderscore, "kohya"},
    {"lora_te1_", LoraComponent::kTextEncoder, Naming::kUnderscore, "kohya"},
    {"lora_te_", LoraComponent::kTextEncoder, Naming::kUnderscore, "kohya"},
    // LyCORIS wrapping the diffusers model: lycoris_<diffusers module with '_' for '.'>
    // (diffusers _convert_lycoris_flux2_lokr_to_diffusers).
    {"lycoris_", LoraComponent::kTransformer, Naming::kUnderscore, "LyCORIS"},
    {"", LoraComponent::kTransformer, Naming::kDotted, "PEFT"},
};

std::string underscored(std::string_view s) {
  std::string r(s);
  std::replace(r.begin(), r.end(), '.', '_');
  return r;
}

std::string listed(const std::vector<std::string>& names, size_t show = 4) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < show; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > show) s += " and " + std::to_string(names.size() - show) + " more";
  return s;
}

// One module's target in the model: a weight, which of its `parts` equal row blocks the module's
// rows fill (BFL's fused qkv: parts 3), and whether its halves are swapped.
struct Resolved {
  std::vector<std::string> targets;  // one, or one per part (kSplitRows)
  bool swap_halves = false;
};

// The model's names, and every spelling a module of it may have in a LoRA file.
class Resolver {
 public:
  explicit Resolver(const std::vector<LoraTarget>& targets) {
    for (const LoraTarget& t : targets) {
      if (!t.name.ends_with(".weight")) continue;
      shapes_[{t.component, t.name}] = t.shape;
      if (t.unused) unused_.insert({t.component, t.name});
      const std::string module = t.name.substr(0, t.name.size() - 7);
      add_underscored(t.component, module, module);
      if (t.component == LoraComponent::kTextEncoder && module.starts_with("model."))
        add_underscored(t.component, module.substr(6), module);
      if (t.component == LoraComponent::kTransformer)
        if (auto src = unmap_name(bfl_flux2_dit_map(), t.name)) {
          const std::string bfl = src->source.substr(0, src->source.size() - 7);
          add_underscored(t.component, bfl, bfl);
        }
    }
    for (auto it = under_.begin(); it != under_.end();)
      it = ambiguous_.count(it->first) ? under_.erase(it) : std::next(it);
  }

  const Shape* shape(LoraComponent c, const std::string& name) const {
    auto it = shapes_.find({c, name});
    return it == shapes_.end() ? nullptr : &it->second;
  }

  bool unused(LoraComponent c, const std::string& name) const { return unused_.count({c, name}) != 0; }

  std::optional<Resolved> resolve(LoraComponent c, Naming naming, const std::string& rest) const {
    std::string module = rest;
    // Some ai-toolkit exports spell transformer_blocks "sformer_blocks" (diffusers
    // _convert_non_diffusers_flux2_lora_to_diffusers normalizes the alias too).
    if (naming == Naming::kDotted && module.starts_with("sformer_blocks.")) module = "tran" + module;
    if (naming == Naming::kUnderscore) {
      auto it = under_.find({c, rest});
      if (it == under_.end()) return std::nullopt;
      module = it->second;
    }
    if (shape(c, module + ".weight")) return Resolved{{module + ".weight"}, false};
    if (c == LoraComponent::kTextEncoder && shape(c, "model." + module + ".weight"))
      return Resolved{{"model." + module + ".weight"}, false};
    if (c != LoraComponent::kTransformer) return std::nullopt;
    const NameMap& map = bfl_flux2_dit_map();
    std::vector<MappedName> m = map_name(map, module + ".weight");
    if (m.empty()) return std::nullopt;
    const NameOp op = map.rules[m[0].rule].op;
    if (op != NameOp::kRename && op != NameOp::kSplitRows && op != NameOp::kSwapHalves) return std::nullopt;
    Resolved r;
    r.swap_halves = op == NameOp::kSwapHalves;
    for (const MappedName& x : m) {
      if (!shape(c, x.target)) return std::nullopt;
      r.targets.push_back(x.target);
    }
    return r;
  }

 private:
  void add_underscored(LoraComponent c, const std::string& spelled, const std::string& module) {
    auto [it, fresh] = under_.emplace(std::pair{c, underscored(spelled)}, module);
    if (!fresh && it->second != module) ambiguous_.insert(it->first);
  }

  std::map<std::pair<LoraComponent, std::string>, Shape> shapes_;
  std::map<std::pair<LoraComponent, std::string>, std::string> under_;
  std::set<std::pair<LoraComponent, std::string>> ambiguous_, unused_;
};

// A matrix read from the file as float32.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<float> v;
};

Result<Mat> read_mat(const WeightStore& store, const std::string& key, bool scalar_ok = false) {
  KLEIN_ASSIGN_OR_RETURN(Weight w, store.get(key));
  const std::string where = store.origin() + ": '" + key + "' " + shape_str(w.shape);
  if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16)
    return format_error(where + ": a LoRA tensor must be F32, F16 or BF16, not " + std::string(format_traits(w.dtype).name));
  KLEIN_RETURN_IF_ERROR(validate_weight(w));
  Mat m;
  if (scalar_ok) {
    // A 0-dim tensor (torch.tensor(alpha)) or one of one element, decoded here: the weight
    // helpers see rows and columns, which a 0-dim tensor has none of.
    if (shape_numel(w.shape) != 1 || w.nbytes != dtype_size(w.dtype))
      return format_error(where + ": alpha must be one number");
    float v = 0;
    if (w.dtype == DType::kF32) {
      std::memcpy(&v, w.data, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, w.data, 2);
      v = w.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    if (!std::isfinite(v)) return format_error(where + ": alpha is not finite");
    m.rows = m.cols = 1;
    m.v = {v};
    return m;
  } else {
    if (w.shape.size() != 2 || w.shape[0] <= 0 || w.shape[1] <= 0)
      return format_error(where + ": expected a non-empty 2-D matrix (conv LoRAs do not apply to FLUX.2)");
    m.rows = w.shape[0];
    m.cols = w.shape[1];
  }
  m.v = weight_to_vector(w);
  for (float x : m.v)
    if (!std::isfinite(x)) return format_error(where + ": holds a non-finite value");
  return m;
}

// a[m, k] · b[k, n] in float32 (sums in order over k, as one row of a torch matmul on the CPU).
std::vector<float> matmul(const Mat& a, const Mat& b) {
  std::vector<float> c(static_cast<size_t>(a.rows * b.cols), 0.0f);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t k = 0; k < a.cols; ++k) {
      const float x = a.v[i * a.cols + k];
      const float* br = b.v.data() + k * b.cols;
      float* cr = c.data() + i * b.cols;
      for (int64_t j = 0; j < b.cols; ++j) cr[j] += x * br[j];
    }
  return c;
}

struct Module {
  std::string key;  // the key without its role suffix
  std::map<Role, std::string> keys;
};

// PEFT's adapter settings that diffusers writes into the file's header (safetensors metadata
// "lora_adapter_metadata": the LoraConfig as JSON, keys prefixed "transformer." by
// save_lora_weights, bare by save_lora_adapter): lora_alpha, r, alpha_pattern, use_rslora, use_dora.
struct PeftSettings {
  bool present = false;
  double lora_alpha = 0;
  bool rslora = false;
  std::vector<std::pair<std::string, double>> alpha_pattern;
};

Result<PeftSettings> peft_settings(const WeightStore& store, LoraComponent component) {
  PeftSettings p;
  auto it = store.metadata().find("lora_adapter_metadata");
  if (it == store.metadata().end()) return p;
  const std::string where = store.origin() + ": header entry lora_adapter_metadata";
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return format_error(where + " is not a JSON object");
  const std::string prefix = component == LoraComponent::kTextEncoder ? "text_encoder." : "transformer.";
  auto field = [&](const std::string& k) -> const nlohmann::json* {
    for (const std::string& key : {prefix + k, k})
      if (auto f = j.find(key); f != j.end() && !f->is_null()) return &*f;
    return nullptr;
  };
  if (const auto* d = field("use_dora"); d && d->is_boolean() && d->get<bool>())
    return unsupported(where + ": DoRA adapters (use_dora) are not supported");
  if (const auto* a = field("lora_alpha")) {
    if (!a->is_number()) return format_error(where + ": lora_alpha is not a number");
    p.present = true;
    p.lora_alpha = a->get<double>();
  }
  if (const auto* r = field("use_rslora"); r && r->is_boolean()) p.rslora = r->get<bool>();
  if (const auto* ap = field("alpha_pattern"); ap && ap->is_object())
    for (const auto& [k, v] : ap->items()) {
      if (!v.is_number()) return format_error(where + ": alpha_pattern '" + k + "' is not a number");
      p.alpha_pattern.emplace_back(k, v.get<double>());
    }
  return p;
}

// The module's alpha under PEFT's settings: an alpha_pattern key that names the module's tail
// (PEFT matches "(.*\.)?key$"; keys are taken literally here), else lora_alpha.
double peft_alpha(const PeftSettings& p, const std::string& module) {
  for (const auto& [k, v] : p.alpha_pattern)
    if (module == k || (module.ends_with(k) && module.size() > k.size() && module[module.size() - k.size() - 1] == '.'))
      return v;
  return p.lora_alpha;
}

}  // namespace

const char* lora_component_name(LoraComponent c) {
  return c == LoraComponent::kTextEncoder ? "text encoder" : "transformer";
}

size_t LoraFile::bytes() const {
  size_t n = 0;
  for (const LoraDelta& d : deltas) n += (d.down.size() + d.up.size()) * sizeof(float);
  return n;
}

Result<LoraFile> parse_lora(const WeightStore& store, const std::vector<LoraTarget>& targets, LoraComponent component) {
  const std::string& origin = store.origin();
  LoraFile out;
  out.origin = origin;
  // ---- keys → modules
  std::map<std::string, Module> modules;
  std::vector<std::string> unknown, refused;
  std::string unsupported_why;
  std::string role_scheme;
  for (const std::string& key : store.names()) {
    const SuffixRule* hit = nullptr;
    for (const SuffixRule& r : kSuffixes)
      if (key.size() > r.suffix.size() && key.ends_with(r.suffix) && (!hit || r.suffix.size() > hit->suffix.size()))
        hit = &r;
    if (!hit) {
      unknown.push_back(key);
      continue;
    }
    if (hit->role == Role::kUnsupported) {
      refused.push_back(key);
      if (unsupported_why.empty()) unsupported_why = std::string(hit->scheme);
      continue;
    }
    if (role_scheme.empty() && !hit->scheme.empty()) role_scheme = std::string(hit->scheme);
    const std::string mkey = key.substr(0, key.size() - hit->suffix.size());
    Module& m = modules[mkey];
    m.key = mkey;
    m.keys[hit->role] = key;
  }
  if (!refused.empty())
    return unsupported(origin + ": " + unsupported_why + " are not supported: " + listed(refused));
  if (!unknown.empty())
    return format_error(origin + ": not LoRA keys klein understands (lora_A/lora_B, lora_down/lora_up, alpha, "
                        "lokr_*, hada_*): " + listed(unknown));
  if (modules.empty()) return format_error(origin + ": holds no LoRA tensors");

  // ---- modules → targets and deltas
  const Resolver resolver(targets);
  KLEIN_ASSIGN_OR_RETURN(const PeftSettings peft, peft_settings(store, component));
  std::vector<std::string> unmatched;
  for (const auto& entry : modules) {
    const std::string& mkey = entry.first;  // not a structured binding: the lambdas below use it
    const Module& m = entry.second;
    const PrefixRule* pre = nullptr;
    std::optional<Resolved> res;
    for (const PrefixRule& p : kPrefixes) {
      if (!mkey.starts_with(p.prefix) || mkey.size() == p.prefix.size()) continue;
      pre = &p;
      if (p.component == component) res = resolver.resolve(p.component, p.naming, mkey.substr(p.prefix.size()));
      break;  // the first prefix decides (a bare name never falls back onto another scheme)
    }
    if (pre && pre->component != component) continue;
    if (!res) {
      unmatched.push_back(mkey);
      continue;
    }
    if (out.scheme.empty())
      out.scheme = role_scheme.starts_with("LyCORIS") ? role_scheme : std::string(pre->scheme);
    const LoraComponent comp = pre->component;
    const std::string where = origin + ": module '" + mkey + "'";
    auto has = [&](Role r) { return m.keys.count(r) != 0; };
    auto get = [&](Role r) { return read_mat(store, m.keys.at(r)); };

    // Rows and columns the module's delta must have: the target's, or all parts' rows together.
    const Shape& t0 = *resolver.shape(comp, res->targets[0]);
    if (t0.size() != 2) return format_error(where + ": its target '" + res->targets[0] + "' is not a matrix");
    const int64_t parts = static_cast<int64_t>(res->targets.size());
    const int64_t rows = t0[0] * parts, cols = t0[1];
    const std::string want = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";

    LoraDelta d;
    d.component = comp;
    d.module = mkey;
    d.cols = cols;
    float alpha = 0.0f;
    const bool has_alpha = has(Role::kAlpha);
    if (has_alpha) {
      KLEIN_ASSIGN_OR_RETURN(Mat a, read_mat(store, m.keys.at(Role::kAlpha), true));
      alpha = a.v[0];
    }
    const bool lora = has(Role::kDown) || has(Role::kUp);
    const bool lokr = has(Role::kLokrW1) || has(Role::kLokrW1A) || has(Role::kLokrW1B) || has(Role::kLokrW2) ||
                      has(Role::kLokrW2A) || has(Role::kLokrW2B);
    const bool loha = has(Role::kHadaW1A) || has(Role::kHadaW1B) || has(Role::kHadaW2A) || has(Role::kHadaW2B);
    if (int(lora) + int(lokr) + int(loha) != 1)
      return format_error(where + (lora || lokr || loha ? ": mixes LoRA, LoKr and LoHa tensors" : ": has only an alpha"));
    if (lora) {
      if (!has(Role::kDown) || !has(Role::kUp))
        return format_error(where + ": has " + (has(Role::kDown) ? "a down (lora_A)" : "an up (lora_B)") +
                            " matrix without its pair");
      KLEIN_ASSIGN_OR_RETURN(Mat down, get(Role::kDown));
      KLEIN_ASSIGN_OR_RETURN(Mat up, get(Role::kUp));
      if (down.rows != up.cols)
        return format_error(where + ": rank mismatch: down is [" + std::to_string(down.rows) + ", " +
                            std::to_string(down.cols) + "], up [" + std::to_string(up.rows) + ", " +
                            std::to_string(up.cols) + "]");
      if (down.cols != cols || up.rows != rows)
        return format_error(where + ": the delta up·down is [" + std::to_string(up.rows) + ", " +
                            std::to_string(down.cols) + "], but '" + res->targets[0] + "'" +
                            (parts > 1 ? " and its sibling parts need " : " needs ") + want);
      d.kind = LoraKind::kLora;
      d.rank = down.rows;
      // An alpha key wins (kohya); else PEFT's settings from the header; else alpha = rank.
      const double r = static_cast<double>(d.rank);
      if (has_alpha)
        d.scale = static_cast<double>(alpha) / r;
      else if (peft.present)
        d.scale = peft_alpha(peft, mkey.substr(pre->prefix.size())) / (peft.rslora ? std::sqrt(r) : r);
      d.down = std::move(down.v);
      d.up = std::move(up.v);
    } else {
      // LyCORIS: ΔW = kron(W1, W2) (LoKr) or (W1a·W1b) ⊙ (W2a·W2b) (LoHa), formed densely here.
      int64_t rank = 0;
      std::vector<float> dense;
      if (lokr) {
        auto factor = [&](Role full, Role fa, Role fb, Mat* w) -> Status {
          if (has(full)) {
            if (has(fa) || has(fb)) return format_error(where + ": has a LoKr factor both whole and split");
            KLEIN_ASSIGN_OR_RETURN(*w, get(full));
            return Status::Ok();
          }
          if (!has(fa) || !has(fb)) return format_error(where + ": lacks a LoKr factor (lokr_w1 / lokr_w2, or _a and _b)");
          KLEIN_ASSIGN_OR_RETURN(Mat a, get(fa));
          KLEIN_ASSIGN_OR_RETURN(Mat b, get(fb));
          if (a.cols != b.rows) return format_error(where + ": LoKr factor rank mismatch");
          if (a.rows * b.cols > rows * cols)
            return format_error(where + ": a LoKr factor larger than the target " + want);
          rank = a.cols;
          w->rows = a.rows;
          w->cols = b.cols;
          w->v = matmul(a, b);
          return Status::Ok();
        };
        Mat w1, w2;
        KLEIN_RETURN_IF_ERROR(factor(Role::kLokrW1, Role::kLokrW1A, Role::kLokrW1B, &w1));
        KLEIN_RETURN_IF_ERROR(factor(Role::kLokrW2, Role::kLokrW2A, Role::kLokrW2B, &w2));
        if (w1.rows * w2.rows != rows || w1.cols * w2.cols != cols)
          return format_error(where + ": kron of [" + std::to_string(w1.rows) + ", " + std::to_string(w1.cols) +
                              "] and [" + std::to_string(w2.rows) + ", " + std::to_string(w2.cols) + "] is not " + want);
        dense.resize(static_cast<size_t>(rows * cols));
        for (int64_t i = 0; i < w1.rows; ++i)
          for (int64_t j = 0; j < w1.cols; ++j) {
            const float s = w1.v[i * w1.cols + j];
            for (int64_t k = 0; k < w2.rows; ++k)
              for (int64_t l = 0; l < w2.cols; ++l)
                dense[(i * w2.rows + k) * cols + j * w2.cols + l] = s * w2.v[k * w2.cols + l];
          }
        d.kind = LoraKind::kLoKr;
        // LyCORIS: alpha / rank when a factor is low-rank, else 1 (LokrModule sets alpha = rank).
        d.scale = has_alpha && rank > 0 ? static_cast<double>(alpha) / static_cast<double>(rank) : 1.0;
      } else {
        for (Role r : {Role::kHadaW1A, Role::kHadaW1B, Role::kHadaW2A, Role::kHadaW2B})
          if (!has(r)) return format_error(where + ": lacks a LoHa factor (hada_w1_a, hada_w1_b, hada_w2_a, hada_w2_b)");
        KLEIN_ASSIGN_OR_RETURN(Mat a1, get(Role::kHadaW1A));
        KLEIN_ASSIGN_OR_RETURN(Mat b1, get(Role::kHadaW1B));
        KLEIN_ASSIGN_OR_RETURN(Mat a2, get(Role::kHadaW2A));
        KLEIN_ASSIGN_OR_RETURN(Mat b2, get(Role::kHadaW2B));
        for (auto [a, b] : {std::pair{&a1, &b1}, std::pair{&a2, &b2}})
          if (a->cols != b->rows || a->rows != rows || b->cols != cols)
            return format_error(where + ": LoHa factors [" + std::to_string(a->rows) + ", " + std::to_string(a->cols) +
                                "]·[" + std::to_string(b->rows) + ", " + std::to_string(b->cols) + "] do not give " + want);
        rank = a1.cols;
        dense = matmul(a1, b1);
        const std::vector<float> p2 = matmul(a2, b2);
        for (size_t i = 0; i < dense.size(); ++i) dense[i] *= p2[i];
        d.kind = LoraKind::kLoHa;
        d.scale = has_alpha ? static_cast<double>(alpha) / static_cast<double>(rank) : 1.0;
      }
      d.rank = 0;
      d.down = std::move(dense);
    }
    if (!std::isfinite(d.scale)) return format_error(where + ": alpha / rank is not finite");

    // BFL's final-layer modulation is (shift, scale); the model's norm_out.linear (scale, shift).
    const int64_t width = d.rank > 0 ? d.rank : cols;
    std::vector<float>& rowsv = d.rank > 0 ? d.up : d.down;
    if (res->swap_halves) {
      if (rows % 2 != 0) return format_error(where + ": a half swap of an odd row count");
      const size_t half = static_cast<size_t>((rows / 2) * width);
      std::rotate(rowsv.begin(), rowsv.begin() + static_cast<std::ptrdiff_t>(half), rowsv.end());
    }
    // A fused BFL qkv: the down matrix is shared, the up (or dense) rows cut into q, k, v.
    const int64_t prow = rows / parts;
    for (int64_t p = 0; p < parts; ++p) {
      if (resolver.unused(comp, res->targets[static_cast<size_t>(p)])) continue;
      LoraDelta e;
      e.component = d.component;
      e.target = res->targets[static_cast<size_t>(p)];
      e.module = d.module;
      e.kind = d.kind;
      e.row0 = 0;
      e.rows = prow;
      e.cols = cols;
      e.rank = d.rank;
      e.scale = d.scale;
      e.down = d.rank > 0 ? d.down : std::vector<float>();
      const auto b = rowsv.begin() + static_cast<std::ptrdiff_t>(p * prow * width);
      std::vector<float> part(b, b + static_cast<std::ptrdiff_t>(prow * width));
      (d.rank > 0 ? e.up : e.down) = std::move(part);
      out.deltas.push_back(std::move(e));
    }
  }
  if (!unmatched.empty())
    return format_error(origin + ": LoRA modules that match no weight of this model (another model's LoRA, or a "
                        "key scheme klein does not know): " + listed(unmatched));
  // Two modules on one weight (e.g. the same layer under two spellings) would be applied twice.
  std::set<std::pair<LoraComponent, std::string>> seen;
  for (const LoraDelta& d : out.deltas)
    if (!seen.insert({d.component, d.target}).second)
      return format_error(origin + ": two modules change '" + d.target + "' (one is '" + d.module + "')");
  return out;
}

Result<LoraFile> load_lora(const std::filesystem::path& path, const std::vector<LoraTarget>& targets,
                           LoraComponent component) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return not_found("LoRA file '" + path.string() + "' does not exist or is not a file");
  KLEIN_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(path));
  return parse_lora(store, targets, component);
}

}  // namespace klein
