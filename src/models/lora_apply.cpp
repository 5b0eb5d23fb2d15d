#include "models/lora_apply.h"

#include <cstring>
#include <map>

#include "core/dtype.h"

namespace klein {

namespace {

// A model's weights by name, with the shapes the config gives them.
struct Slot {
  Shape shape;
  Weight* weight = nullptr;
};

template <class Table>
std::map<std::string, Slot> slots_of(const Table& table) {
  std::map<std::string, Slot> s;
  for (const auto& r : table)
    if (r.weight && r.shape.size() == 2) s[r.name] = {r.shape, r.weight};
  return s;
}

std::vector<LoraTarget> targets_of(const std::map<std::string, Slot>& slots, LoraComponent c) {
  std::vector<LoraTarget> t;
  t.reserve(slots.size());
  for (const auto& [name, slot] : slots) t.push_back({c, name, slot.shape});
  return t;
}

bool mergeable(const Weight& w) {
  return (w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16) &&
         w.layout == Layout::kRowMajor && w.device == Device::kCpu && w.act_rotation_group == 0 && w.shape.size() == 2;
}

// The float32 value rounded to `dt` and back (identity for F32).
float round_to(DType dt, float v) {
  if (dt == DType::kBF16) return round_bf16(v);
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

void store_row(DType dt, const float* v, int64_t n, uint8_t* dst) {
  if (dt == DType::kF32) {
    std::memcpy(dst, v, static_cast<size_t>(n) * 4);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t h = dt == DType::kBF16 ? f32_to_bf16(v[j]) : f32_to_f16(v[j]);
    std::memcpy(dst + 2 * j, &h, 2);
  }
}

Status apply(std::map<std::string, Slot>& slots, LoraComponent comp, const std::vector<LoraUse>& loras,
             LoraApply mode, bool merge_to_f32, int* merged, int* runtime) {
  // Deltas per target weight, in the order of the files.
  std::map<std::string, std::vector<std::pair<const LoraDelta*, float>>> per_target;
  for (const LoraUse& u : loras)
    for (const LoraDelta& d : u.file->deltas)
      if (d.component == comp) per_target[d.target].push_back({&d, u.strength});
  int nm = 0, nr = 0;
  for (auto& [name, ds] : per_target) {
    auto it = slots.find(name);
    if (it == slots.end() || it->second.weight->empty())
      return internal_error("LoRA: the " + std::string(lora_component_name(comp)) + " has no weight '" + name + "'");
    Weight& w = *it->second.weight;
    const bool merge = mode == LoraApply::kMerge || (mode == LoraApply::kAuto && mergeable(w));
    if (merge) {
      if (!mergeable(w))
        return unsupported("LoRA: '" + name + "' is stored as " + std::string(format_traits(w.dtype).name) +
                           ", and merging into quantized weights is not done: use --lora-mode runtime (or auto)");
      KLEIN_ASSIGN_OR_RETURN(w, merge_lora_deltas(w, ds, merge_to_f32 ? DType::kF32 : w.dtype));
      ++nm;
      continue;
    }
    auto terms = std::make_shared<LoraTerms>(w.lora ? *w.lora : LoraTerms{});
    for (const auto& [d, strength] : ds) {
      LowRankTerm t;
      t.row0 = d->row0;
      t.rows = d->rows;
      t.cols = d->cols;
      t.rank = d->rank;
      // PEFT's scaling (alpha / r, times the strength) as the float32 the tensor product uses.
      t.scale = static_cast<float>(d->scale * static_cast<double>(strength));
      t.down = d->down;
      t.up = d->up;
      terms->terms.push_back(std::move(t));
    }
    w.lora = std::move(terms);
    w.lora_row0 = 0;
    ++nr;
  }
  if (merged) *merged += nm;
  if (runtime) *runtime += nr;
  return Status::Ok();
}

uint64_t memory_of(const std::map<std::string, Slot>& slots, LoraComponent comp, const std::vector<LoraUse>& loras,
                   LoraApply mode, bool merge_to_f32) {
  uint64_t bytes = 0;
  std::map<std::string, const Weight*> changed;
  for (const LoraUse& u : loras)
    for (const LoraDelta& d : u.file->deltas) {
      if (d.component != comp) continue;
      bytes += (d.down.size() + d.up.size()) * sizeof(float);
      if (auto it = slots.find(d.target); it != slots.end()) changed[d.target] = it->second.weight;
    }
  for (const auto& [name, w] : changed)
    if (mode == LoraApply::kMerge || (mode == LoraApply::kAuto && mergeable(*w)))
      bytes += static_cast<uint64_t>(format_row_bytes(merge_to_f32 ? DType::kF32 : w->dtype, w->cols())) *
               static_cast<uint64_t>(w->rows());
  return bytes;
}

}  // namespace

uint64_t lora_memory(const Flux2Transformer& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32) {
  return memory_of(slots_of(m.tensor_table()), LoraComponent::kTransformer, loras, mode, merge_to_f32);
}

uint64_t lora_memory(const Qwen3Encoder& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32) {
  auto slots = slots_of(m.tensor_table(0, m.loaded_layers()));
  // A stacked [gate; up] leaves gate and up empty until unstack_mlp: count them by their shapes.
  uint64_t extra = 0;
  for (auto& [name, slot] : slots)
    if (slot.weight->empty()) slot.weight = nullptr;
  std::map<std::string, Slot> present;
  for (auto& [name, slot] : slots)
    if (slot.weight) present[name] = slot;
  for (const LoraUse& u : loras)
    for (const LoraDelta& d : u.file->deltas)
      if (d.component == LoraComponent::kTextEncoder && !present.count(d.target) && slots.count(d.target))
        extra += static_cast<uint64_t>(d.rows * d.cols) * (merge_to_f32 ? 4 : 2);  // gate / up (16-bit or f32)
  return memory_of(present, LoraComponent::kTextEncoder, loras, mode, merge_to_f32) + extra;
}

Result<Weight> merge_lora_deltas(const Weight& w, const std::vector<std::pair<const LoraDelta*, float>>& deltas,
                                 DType out) {
  if (!mergeable(w)) return unsupported("LoRA: cannot merge into '" + w.name + "' (not a float weight)");
  if (out != DType::kF32 && out != w.dtype) return internal_error("LoRA: merge of '" + w.name + "' into another type");
  const int64_t R = w.rows(), C = w.cols();
  const size_t rb = static_cast<size_t>(format_row_bytes(out, C));
  auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(R) * rb]);
  std::vector<float> row(static_cast<size_t>(C)), delta(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    weight_row_to_f32(w, r, row.data());
    for (const auto& [d, strength] : deltas) {
      if (r < d->row0 || r >= d->row0 + d->rows) continue;
      if (d->cols != C) return internal_error("LoRA: a delta of " + std::to_string(d->cols) + " columns on '" + w.name + "'");
      const int64_t i = r - d->row0;
      // PEFT get_delta_weight: (B @ A) in float32 (bf16/fp16 factors are cast up on the CPU),
      // times the scaling, cast to the weight's type; merge then adds it in that type.
      const float s = static_cast<float>(d->scale * static_cast<double>(strength));
      if (d->rank > 0) {
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t k = 0; k < d->rank; ++k) {
          const float u = d->up[static_cast<size_t>(i * d->rank + k)];
          const float* dn = d->down.data() + k * C;
          for (int64_t j = 0; j < C; ++j) delta[j] += u * dn[j];
        }
      } else {
        std::memcpy(delta.data(), d->down.data() + i * C, static_cast<size_t>(C) * 4);
      }
      for (int64_t j = 0; j < C; ++j) row[j] = round_to(out, row[j] + round_to(out, delta[j] * s));
    }
    store_row(out, row.data(), C, buf.get() + static_cast<size_t>(r) * rb);
  }
  Weight m = w;
  m.dtype = out;
  m.data = buf.get();
  m.nbytes = static_cast<size_t>(R) * rb;
  m.owner = std::shared_ptr<const void>(buf, buf.get());
  m.lora.reset();
  m.lora_row0 = 0;
  return m;
}

std::vector<LoraTarget> lora_targets(const Flux2Transformer& m) {
  return targets_of(slots_of(m.tensor_table()), LoraComponent::kTransformer);
}

std::vector<LoraTarget> lora_targets(const Qwen3Encoder& m) {
  auto slots = slots_of(m.tensor_table(0, m.loaded_layers()));
  slots.erase("model.embed_tokens.weight");  // an embedding, not a linear
  std::vector<LoraTarget> t = targets_of(slots, LoraComponent::kTextEncoder);
  // The layers past the deepest tap are never run: a LoRA on them is valid and changes nothing.
  const std::string first = "model.layers.0.";
  const size_t n = t.size();
  for (int64_t i = m.loaded_layers(); i < m.config().num_layers; ++i)
    for (size_t k = 0; k < n; ++k)
      if (t[k].name.starts_with(first))
        t.push_back({LoraComponent::kTextEncoder,
                     "model.layers." + std::to_string(i) + "." + t[k].name.substr(first.size()), t[k].shape, true});
  return t;
}

Status apply_loras(Flux2Transformer& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32,
                   int* merged, int* runtime) {
  auto slots = slots_of(m.tensor_table());
  return apply(slots, LoraComponent::kTransformer, loras, mode, merge_to_f32, merged, runtime);
}

Status apply_loras(Qwen3Encoder& m, const std::vector<LoraUse>& loras, LoraApply mode, bool merge_to_f32, int* merged,
                   int* runtime) {
  bool any = false;
  for (const LoraUse& u : loras)
    for (const LoraDelta& d : u.file->deltas) any = any || d.component == LoraComponent::kTextEncoder;
  if (!any) return Status::Ok();
  m.unstack_mlp();  // gate and up may each take a delta
  auto slots = slots_of(m.tensor_table(0, m.loaded_layers()));
  slots.erase("model.embed_tokens.weight");
  return apply(slots, LoraComponent::kTextEncoder, loras, mode, merge_to_f32, merged, runtime);
}

}  // namespace klein
