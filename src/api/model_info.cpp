// Model::inspect / Model::info: what `klein info` prints, as data.
#include <map>

#include "api/guard.h"
#include "api/model_impl.h"
#include "core/format.h"
#include "io/tensor_source.h"
#include "io/safetensors.h"

namespace klein {

namespace {

// Scalars, booleans and short numeric lists of a config, in file order; "_"-keys are metadata.
std::vector<std::pair<std::string, std::string>> config_entries(const nlohmann::json& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    if (it.key().starts_with("_")) continue;
    if (it->is_number() || it->is_boolean() || (it->is_array() && it->size() <= 8 && !it->empty() && (*it)[0].is_number()))
      out.emplace_back(it.key(), it->dump());
  }
  return out;
}

ModelInfo describe(const ModelFolder& m) {
  ModelInfo info;
  info.path = m.root().string();
  info.pipeline_class = m.pipeline_class();
  info.distilled = m.is_distilled();
  for (const auto& [name, ci] : m.components()) {
    ComponentSummary c;
    c.name = name;
    c.class_name = ci.class_name;
    c.library = ci.library;
    auto comp = m.component(name);
    if (!comp.ok()) {
      c.error = "missing: " + comp.status().message();
      ++info.errors;  // the exit code of `klein info` says the folder cannot run
      info.components.push_back(std::move(c));
      continue;
    }
    c.dir = comp->dir.string();
    nlohmann::json cfg;
    if (name != "tokenizer") {
      auto r = m.config(name);
      if (!r.ok()) c.error = "config: " + r.status().message();
      else cfg = std::move(r).value();
      c.config = config_entries(cfg);
    }
    if (name != "tokenizer" && name != "scheduler" && c.error.empty()) {
      // Through the tensor source, so a quantized weight counts once, in its format (an MLX
      // 4-bit matrix as Q4_G64 [rows, cols], not as U32 words plus scales and biases).
      auto src = SafetensorsSource::open(comp->dir);
      const Status quant = src.ok() ? (*src)->check_quantization(cfg, (comp->dir / "config.json").string()) : Status::Ok();
      if (!src.ok()) {
        c.error = "weights: " + src.status().message();
      } else if (!quant.ok()) {
        c.error = "weights: " + quant.message();
      } else {
        std::map<std::string, ComponentSummary::DTypeShare> by_format;
        const std::vector<std::string> names = (*src)->names();
        for (const auto& n : names) {
          auto w = (*src)->get(n);
          if (!w.ok()) {
            c.error = "weights: " + w.status().message();
            break;
          }
          const FormatTraits& f = w->format();
          const double cnt = static_cast<double>(w->numel());
          uint64_t bytes = w->nbytes;
          if (f.scales == ScalePlace::kSeparate)
            bytes += static_cast<uint64_t>(w->rows() * w->scales_per_row()) * dtype_size(w->scale_dtype) *
                     (f.has_offsets ? 2 : 1);
          c.parameters += cnt;
          auto& slot = by_format[std::string(f.name)];
          slot.dtype = f.name;
          slot.parameters += cnt;
          slot.bytes += bytes;
        }
        c.has_weights = true;
        c.files = (*src)->store().files().size();
        c.tensors = names.size();
        c.bytes = (*src)->total_bytes();
        for (auto& [k, v] : by_format) c.by_dtype.push_back(v);
      }
    }
    info.errors += !c.error.empty();
    info.components.push_back(std::move(c));
  }
  // A component the pipeline needs that model_index.json does not name at all.
  for (const char* name : {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"}) {
    if (m.has(name)) continue;
    ComponentSummary c;
    c.name = name;
    c.error = "missing: " + m.component(name).status().message();
    ++info.errors;
    info.components.push_back(std::move(c));
  }
  return info;
}

}  // namespace

Result<ModelInfo> Model::inspect(const std::string& path) {
  return api::guarded("inspect", [&]() -> Result<ModelInfo> {
    KLEIN_ASSIGN_OR_RETURN(auto folder, ModelFolder::open(path));
    return describe(folder);
  });
}

Result<ModelInfo> Model::info() const {
  return api::guarded("info", [&]() -> Result<ModelInfo> {
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("info"));
    return describe(impl_->folder);
  });
}

}  // namespace klein
