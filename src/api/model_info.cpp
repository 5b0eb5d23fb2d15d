// Model::inspect / Model::info: what `klein info` prints, as data.
#include <map>
#include <set>

#include "api/guard.h"
#include "api/layout.h"
#include "api/manifest.h"
#include "api/model_impl.h"
#include "core/format.h"
#include "io/gguf.h"
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

const char* scheme_name(NamingScheme s) {
  switch (s) {
    case NamingScheme::kDiffusers: return "diffusers";
    case NamingScheme::kBfl: return "BFL";
    case NamingScheme::kLdm: return "LDM";
    case NamingScheme::kHfTransformers: return "transformers";
    case NamingScheme::kLlamaCpp: return "llama.cpp";
    case NamingScheme::kMflux: return "mflux";
    case NamingScheme::kUnknown: break;
  }
  return "unknown";
}

// Weights by format, through the component's (decorated) source, so a quantized weight counts
// once, in its format (an MLX 4-bit matrix as Q4_G64 [rows, cols], not as U32 words plus scales
// and biases), and a BFL fused qkv as the three matrices the model binds.
void summarize_weights(const api::ComponentSpec& spec, ComponentSummary& c) {
  auto src = spec.open();
  if (!src.ok()) {
    c.error = "weights: " + src.status().message();
    return;
  }
  if (spec.from_folder) {  // a folder's part is told apart here, not at open
    if (auto d = detect_checkpoint(**src); d.ok() && d->parts.size() == 1) {
      c.family = family_name(d->parts[0].family);
      c.description = d->parts[0].description;
    }
  }
  std::map<std::string, ComponentSummary::DTypeShare> by_format;
  const std::vector<std::string> names = (*src)->names();
  for (const auto& n : names) {
    auto w = (*src)->get(n);
    if (!w.ok()) {
      c.error = "weights: " + w.status().message();
      return;
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
    ++slot.tensors;
    slot.parameters += cnt;
    slot.bytes += bytes;
  }
  c.has_weights = true;
  if (!spec.from_folder && spec.path.extension() == ".gguf") {
    if (auto g = GgufFile::open(spec.path); g.ok()) {
      const std::string arch = (*g)->string_value("general.architecture");
      c.container = "GGUF v" + std::to_string((*g)->version()) + " by " + gguf_producer(**g) + ", architecture " +
                    (arch.empty() ? std::string("not given") : arch);
    }
  }
  const auto* st = dynamic_cast<const SafetensorsSource*>(src->get());
  c.files = st ? st->store().files().size() : 1;
  std::error_code ec;
  if (!st && std::filesystem::is_directory(spec.path, ec))  // an mflux pack's shards behind its name map
    if (auto shards = SafetensorsSource::open(spec.path); shards.ok()) c.files = (*shards)->store().files().size();
  c.tensors = names.size();
  c.bytes = (*src)->total_bytes();
  for (auto& [k, v] : by_format) c.by_dtype.push_back(v);
}

ComponentSummary summarize(const std::string& name, const api::ComponentSlot& s, const ModelFolder* folder) {
  ComponentSummary c;
  c.name = name;
  if (folder && folder->components().count(name)) {
    const ComponentInfo& ci = folder->components().at(name);
    c.class_name = ci.class_name;
    c.library = ci.library;
  }
  if (!s.spec) {
    c.error = (folder && folder->component(name).ok() ? "config: " : "missing: ") + s.error.message();
    return c;
  }
  const api::ComponentSpec& spec = *s.spec;
  c.dir = spec.where;
  c.scheme = scheme_name(spec.scheme);
  c.family = spec.family == Family::kUnknown ? "" : family_name(spec.family);
  c.description = spec.description;
  if (!spec.from_folder) {
    c.library = name == "text_encoder" ? "transformers" : "diffusers";
    if (spec.config.contains("_class_name")) c.class_name = spec.config["_class_name"].get<std::string>();
    else if (spec.config.contains("architectures")) c.class_name = spec.config["architectures"][0].get<std::string>();
  }
  c.config = config_entries(spec.config);
  summarize_weights(spec, c);
  return c;
}

ModelInfo describe(const api::Layout& l, const std::string& path) {
  ModelInfo info;
  info.path = path.empty() ? l.given : path;
  info.layout = l.kind;
  info.distilled = l.distilled;
  info.kv = l.kv;
  info.variant_source = l.variant_source;
  info.notes = l.notes;
  const ModelFolder* f = l.folder ? &*l.folder : nullptr;
  if (f) info.pipeline_class = f->pipeline_class();
  // The pipeline's five parts, and any other a folder's model_index.json names.
  std::set<std::string> names = {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"};
  if (f)
    for (const auto& [name, ci] : f->components()) names.insert(name);
  for (const std::string& name : names) {
    ComponentSummary c;
    if (name == "text_encoder") c = summarize(name, l.text_encoder, f);
    else if (name == "transformer") c = summarize(name, l.transformer, f);
    else if (name == "vae") c = summarize(name, l.vae, f);
    else {
      c.name = name;
      const bool in_folder = f && f->components().count(name);
      if (in_folder) {
        const ComponentInfo& ci = f->components().at(name);
        c.class_name = ci.class_name;
        c.library = ci.library;
      }
      if (name == "tokenizer") {
        if (!l.tokenizer_error.ok()) c.error = "missing: " + l.tokenizer_error.message();
        else if (l.tokenizer.empty()) c.dir = "built-in (Qwen3, as FLUX.2-klein's tokenizer/)";
        else c.dir = l.tokenizer.string();
      } else if (name == "scheduler") {
        if (!l.scheduler_error.ok())
          c.error = (in_folder && f->component(name).ok() ? "config: " : "missing: ") + l.scheduler_error.message();
        else {
          c.dir = f && in_folder ? f->component(name)->dir.string() : l.scheduler_where;
          c.config = config_entries(l.scheduler);
        }
      } else {  // another component of the folder: reported, not loaded
        auto comp = f->component(name);
        if (!comp.ok()) c.error = "missing: " + comp.status().message();
        else {
          c.dir = comp->dir.string();
          auto r = f->config(name);
          if (!r.ok()) c.error = "config: " + r.status().message();
          else c.config = config_entries(*r);
        }
      }
    }
    info.errors += !c.error.empty();
    info.components.push_back(std::move(c));
  }
  return info;
}

}  // namespace

Result<ModelInfo> Model::inspect(const std::string& path) { return inspect(path, LoadOptions{}); }

Result<ModelInfo> Model::inspect(const std::string& path, const LoadOptions& options) {
  return api::guarded("inspect", [&]() -> Result<ModelInfo> {
    KLEIN_ASSIGN_OR_RETURN(auto layout, api::resolve_layout(api::layout_request(path, options)));
    if (!options.verify_manifest.empty())
      KLEIN_RETURN_IF_ERROR(api::verify_layout(layout, options.verify_manifest, options.threads));
    return describe(layout, path);
  });
}

Result<ModelInfo> Model::info() const {
  return api::guarded("info", [&]() -> Result<ModelInfo> {
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("info"));
    return describe(impl_->layout, impl_->path);
  });
}

}  // namespace klein
