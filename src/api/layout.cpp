#include "api/layout.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "io/checkpoint_detect.h"
#include "io/json_file.h"
#include "io/gguf.h"
#include "io/mapped_source.h"
#include "io/name_map.h"
#include "io/tensor_source.h"

namespace fs = std::filesystem;

namespace klein {
extern const char kFlux2KleinSchedulerJson[];  // generated from data/flux2_klein_scheduler.json
}

namespace klein::api {

namespace {

// The slots in pipeline order, with the words messages use for them.
struct Role {
  Component component;
  const char* name;     // the diffusers folder's component name
  const char* words;    // for messages
  const char* option;   // the CLI option that gives it
};
constexpr Role kRoles[] = {{Component::kTextEncoder, "text_encoder", "text encoder", "--text-encoder"},
                           {Component::kTransformer, "transformer", "transformer (DiT)", "--diffusion-model"},
                           {Component::kVae, "vae", "VAE", "--vae"}};

ComponentSlot& slot(Layout& l, Component c) {
  return c == Component::kTextEncoder ? l.text_encoder : c == Component::kTransformer ? l.transformer : l.vae;
}
const Role& role_of(Component c) {
  for (const Role& r : kRoles)
    if (r.component == c) return r;
  return kRoles[1];
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// A spec for the folder's component `name` (an error in the slot when it is missing or its
// config is unreadable, as `klein info` reports it).
ComponentSlot folder_slot(const ModelFolder& f, const Role& r) {
  ComponentSlot s;
  auto c = f.component(r.name);
  if (!c.ok()) {
    s.error = c.status();
    return s;
  }
  auto cfg = f.config(r.name);
  if (!cfg.ok()) {
    s.error = cfg.status();
    return s;
  }
  ComponentSpec spec;
  spec.role = r.name;
  spec.path = c->dir;
  spec.from_folder = true;
  spec.config = std::move(cfg).value();
  spec.config_where = (c->dir / "config.json").string();
  spec.where = c->dir.string();
  spec.description = "diffusers " + c->class_name + " folder";
  s.spec = std::move(spec);
  return s;
}

// The class a config.json describes: diffusers' "_class_name" or transformers' "architectures".
std::string config_class(const nlohmann::json& j) {
  if (!j.is_object()) return "";
  if (auto it = j.find("_class_name"); it != j.end() && it->is_string()) return it->get<std::string>();
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    return (*it)[0].get<std::string>();
  return "";
}

bool config_is_for(const std::string& cls, Component c) {
  switch (c) {
    case Component::kTransformer: return cls == "Flux2Transformer2DModel";
    case Component::kVae: return cls == "AutoencoderKLFlux2";
    case Component::kTextEncoder: return cls == "Qwen3ForCausalLM" || cls == "Qwen3Model";
    case Component::kUnknown: break;
  }
  return false;
}

bool is_gguf_path(const fs::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".gguf";
}

// A single file's tensors under their stored names: safetensors or GGUF (by extension).
Result<std::shared_ptr<const TensorSource>> open_single_file(const fs::path& file) {
  if (is_gguf_path(file)) {
    KLEIN_ASSIGN_OR_RETURN(auto g, GgufSource::open(file));
    return std::shared_ptr<const TensorSource>(std::move(g));
  }
  KLEIN_ASSIGN_OR_RETURN(auto st, SafetensorsSource::open(file));
  return std::shared_ptr<const TensorSource>(std::move(st));
}

// The parts of one safetensors (or GGUF) file, detected; a part klein cannot run is refused naming what it
// looks like.
Result<std::vector<ComponentSpec>> file_specs(const fs::path& file, const std::string& given_as) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return not_found(given_as + " " + file.string() + ": no such file");
  if (fs::is_directory(file, ec))
    return invalid_argument(given_as + " " + file.string() +
                            ": expected a safetensors or GGUF file, got a folder (a diffusers folder goes to --model)");
  // Named before it is read: a JSON or image file given by mistake is not parsed as a header.
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext != ".safetensors" && ext != ".sft" && ext != ".gguf")
    return invalid_argument(given_as + " " + file.string() + ": expected " +
                            (given_as == "--model" ? "a diffusers model folder (with model_index.json) or " : "") +
                            "a .safetensors or .gguf file");
  KLEIN_ASSIGN_OR_RETURN(auto src, open_single_file(file));
  KLEIN_ASSIGN_OR_RETURN(CheckpointInfo info, detect_checkpoint(*src));
  if (info.parts.empty()) return format_error(file.string() + ": holds no tensors (not a klein component)");
  std::vector<ComponentSpec> out;
  for (const CheckpointPart& p : info.parts) {
    if (!p.supported())
      return unsupported(file.string() + ": not a FLUX.2 [klein] component: it looks like " + p.description);
    ComponentSpec spec;
    spec.role = role_of(p.component).name;
    spec.path = file;
    spec.prefix = p.prefix;
    spec.map = p.map;
    spec.where = file.string();
    spec.scheme = p.scheme;
    spec.family = p.family;
    spec.description = p.description;
    spec.config_where =
        file.string() + (p.prefix.empty() ? "" : " '" + p.prefix + "'") + " (config from its tensor shapes)";
    KLEIN_ASSIGN_OR_RETURN(spec.config, preset_config(p, file.string()));
    // A config.json beside the file for this component wins over the preset, as a component
    // folder's does (diffusers' layout: vae/config.json beside its weights): it carries what
    // the weights cannot say, e.g. a VAE's GroupNorm group count.
    const fs::path beside = file.parent_path() / "config.json";
    if (fs::is_regular_file(beside, ec)) {
      KLEIN_ASSIGN_OR_RETURN(auto j, read_json_file(beside));
      if (config_is_for(config_class(j), p.component)) {
        spec.config = std::move(j);
        spec.config_where = beside.string();
      }
    }
    for (const ComponentSpec& o : out)
      if (o.role == spec.role)
        return unsupported(file.string() + ": holds two " + role_of(p.component).words + "s ('" + o.prefix + "' and '" +
                           p.prefix + "'); give each as its own file");
    out.push_back(std::move(spec));
  }
  return out;
}

// An mflux pack (mflux's ModelSaver): component folders transformer/, vae/, text_encoder/ of
// shards 0.safetensors, 1.safetensors, ... (and model.safetensors.index.json), no
// model_index.json and no config.json.
bool is_mflux_pack(const fs::path& root) {
  std::error_code ec;
  if (fs::exists(root / "model_index.json", ec)) return false;
  for (const Role& r : kRoles)
    if (fs::is_regular_file(root / r.name / "0.safetensors", ec)) return true;
  return false;
}

const NameMap& mflux_map_of(Component c) {
  return c == Component::kTransformer ? mflux_flux2_dit_map()
         : c == Component::kVae       ? mflux_flux2_vae_map()
                                      : mflux_qwen3_map();
}

// The pack's component `r`: its shards through the mflux map, detected like a single file, the
// config from its shapes (a config.json in the folder for this class wins, as beside a file).
// Errors go to the slot, as a diffusers folder's do; a missing folder leaves the slot empty.
ComponentSlot mflux_slot(const fs::path& root, const Role& r) {
  ComponentSlot s;
  const fs::path dir = root / r.name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return s;
  const std::string where = dir.string();
  auto fail = [&](Status st) {
    s.error = std::move(st);
    return s;
  };
  if (!fs::is_regular_file(dir / "0.safetensors", ec) && !fs::is_regular_file(dir / "model.safetensors.index.json", ec))
    return fail(not_found(where + ": an mflux pack's " + r.words + " folder without 0.safetensors"));
  auto st = SafetensorsSource::open(dir);
  if (!st.ok()) return fail(st.status());
  std::string quant = "unquantized";
  if (auto m = (*st)->store().metadata().find("quantization_level"); m != (*st)->store().metadata().end())
    quant = m->second == "None" ? quant : "MLX " + m->second + "-bit, groups of 64";
  const NameMap& map = mflux_map_of(r.component);
  auto mapped = MappedSource::create(*st, map);
  if (!mapped.ok()) return fail(mapped.status());
  auto info = detect_checkpoint(**mapped);
  if (!info.ok()) return fail(info.status());
  if (info->parts.size() != 1 || info->parts[0].component != r.component || !info->parts[0].supported())
    return fail(unsupported(where + ": expected an mflux pack's " + r.words + ", but it looks like " +
                            (info->parts.empty() ? std::string("nothing (no tensors)") : info->description)));
  const CheckpointPart& p = info->parts[0];
  ComponentSpec spec;
  spec.role = r.name;
  spec.path = dir;
  spec.map = &map;
  spec.where = where;
  spec.scheme = NamingScheme::kMflux;
  spec.family = p.family;
  // Detection saw the names the map gives; the pack's own are mflux's.
  spec.description = p.description;
  for (const char* mapped_words : {", diffusers names", ", transformers names"})
    if (auto at = spec.description.find(mapped_words); at != std::string::npos)
      spec.description.replace(at, std::strlen(mapped_words), ", mflux names");
  spec.description += " (mflux pack, " + quant + ")";
  spec.config_where = where + " (config from its tensor shapes)";
  auto cfg = preset_config(p, where);
  if (!cfg.ok()) return fail(cfg.status());
  spec.config = std::move(cfg).value();
  const fs::path beside = dir / "config.json";
  if (fs::is_regular_file(beside, ec)) {
    auto j = read_json_file(beside);
    if (!j.ok()) return fail(j.status());
    if (config_is_for(config_class(*j), r.component)) {
      spec.config = std::move(j).value();
      spec.config_where = beside.string();
    }
  }
  s.spec = std::move(spec);
  return s;
}

int64_t int_or(const nlohmann::json& j, const char* key, int64_t def) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : def;
}

// What the pipeline feeds between components, checked before anything is loaded: the encoder's
// three tapped hidden states concatenated are the transformer's text input, and the VAE's
// patchified latents its image input (FLUX.2: 32 channels × 2 × 2 = 128). Two parts of one
// folder are left to Model::open, which names the config field at fault.
Status check_pairing(const Layout& l) {
  const auto& te = l.text_encoder.spec;
  const auto& dit = l.transformer.spec;
  const auto& vae = l.vae.spec;
  if (te && dit && !(te->from_folder && dit->from_folder)) {
    const int64_t hidden = int_or(te->config, "hidden_size", -1);
    const int64_t width = int_or(dit->config, "joint_attention_dim", -1);
    if (hidden > 0 && width > 0 && width != 3 * hidden)
      return invalid_argument("wrong pairing: transformer " + dit->where + " (" + dit->description +
                              ") takes text embeddings of width " + std::to_string(width) + ", but text encoder " +
                              te->where + " (" + te->description + ") gives 3 x " + std::to_string(hidden) + " = " +
                              std::to_string(3 * hidden) + " (klein 4B pairs with Qwen3-4B, 9B with Qwen3-8B)");
  }
  if (vae && dit && !(vae->from_folder && dit->from_folder)) {
    const int64_t latent = int_or(vae->config, "latent_channels", -1);
    int64_t patch = 2;
    if (auto it = vae->config.find("patch_size"); it != vae->config.end() && it->is_array() && it->size() == 2 &&
                                                 (*it)[0].is_number_integer() && (*it)[1].is_number_integer())
      patch = (*it)[0].get<int64_t>() * (*it)[1].get<int64_t>();
    else patch = 4;
    const int64_t in = int_or(dit->config, "in_channels", -1);
    if (latent > 0 && in > 0 && latent * patch != in)
      return invalid_argument("wrong pairing: VAE " + vae->where + " (" + vae->description + ") has " +
                              std::to_string(latent) + " latent channels (" + std::to_string(latent * patch) +
                              " patchified), but transformer " + dit->where + " (" + dit->description + ") takes " +
                              std::to_string(in));
  }
  return Status::Ok();
}

bool name_says_base(const fs::path& p) {
  std::string n = p.filename().string();
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return n.find("base") != std::string::npos;
}

}  // namespace

Result<std::shared_ptr<const TensorSource>> ComponentSpec::open() const {
  if (from_folder) {
    KLEIN_ASSIGN_OR_RETURN(auto st, SafetensorsSource::open(path));
    KLEIN_RETURN_IF_ERROR(st->check_quantization(config, config_where));
    return std::shared_ptr<const TensorSource>(std::move(st));
  }
  KLEIN_ASSIGN_OR_RETURN(auto src, open_single_file(path));
  if (!prefix.empty()) {
    KLEIN_ASSIGN_OR_RETURN(auto scoped, ScopedSource::create(std::move(src), prefix));
    src = std::move(scoped);
  }
  if (map) {
    KLEIN_ASSIGN_OR_RETURN(auto mapped, MappedSource::create(std::move(src), *map));
    src = std::move(mapped);
  }
  return src;
}

Status Layout::complete() const {
  if (!tokenizer_error.ok()) return tokenizer_error;
  for (const ComponentSlot* s : {&text_encoder, &transformer, &vae})
    if (!s->spec) return s->error;
  return scheduler_error;
}

LayoutRequest layout_request(const std::string& model, const LoadOptions& o) {
  return {model, o.diffusion_model, o.text_encoder, o.vae, o.variant};
}

Result<Layout> resolve_layout(const LayoutRequest& req) {
  Layout l;
  std::vector<std::string> given;
  if (!req.model.empty()) given.push_back("--model " + req.model);
  const std::pair<const std::string*, Component> files[] = {{&req.diffusion_model, Component::kTransformer},
                                                           {&req.text_encoder, Component::kTextEncoder},
                                                           {&req.vae, Component::kVae}};
  for (const auto& [path, c] : files)
    if (!path->empty()) given.push_back(std::string(role_of(c).option) + " " + *path);
  l.given = given.empty() ? std::string("nothing") : join(given, ", ");
  if (given.empty()) return invalid_argument("no model given: expected a diffusers folder or a safetensors file");

  std::error_code ec;
  std::vector<fs::path> single_files;
  bool mflux = false;
  if (!req.model.empty()) {
    if (fs::is_directory(req.model, ec) && is_mflux_pack(req.model)) {
      mflux = true;
      l.kind = "mflux pack";
      for (const Role& r : kRoles) slot(l, r.component) = mflux_slot(req.model, r);
      const fs::path tok = fs::path(req.model) / "tokenizer";
      if (fs::is_regular_file(tok / "tokenizer.json", ec)) l.tokenizer = tok;
    } else if (fs::is_directory(req.model, ec)) {
      KLEIN_ASSIGN_OR_RETURN(l.folder, ModelFolder::open(req.model));
      l.kind = "diffusers folder";
      for (const Role& r : kRoles) slot(l, r.component) = folder_slot(*l.folder, r);
    } else if (fs::exists(req.model, ec)) {
      KLEIN_ASSIGN_OR_RETURN(auto specs, file_specs(req.model, "--model"));
      l.kind = specs.size() > 1 ? "all-in-one checkpoint" : "single file";
      for (auto& s : specs) {
        Component c = s.role == "transformer" ? Component::kTransformer
                      : s.role == "vae"       ? Component::kVae
                                              : Component::kTextEncoder;
        slot(l, c).spec = std::move(s);
      }
      single_files.push_back(req.model);
    } else {
      return not_found(req.model + ": no such model folder or file");
    }
  }
  bool replaced = false;
  for (const auto& [path, c] : files) {
    if (path->empty()) continue;
    const Role& r = role_of(c);
    KLEIN_ASSIGN_OR_RETURN(auto specs, file_specs(*path, r.option));
    if (specs.size() != 1 || specs[0].role != r.name) {
      std::vector<std::string> what;
      for (const auto& s : specs) what.push_back(s.description);
      return invalid_argument(std::string(r.option) + " " + *path + ": expected a " + r.words +
                              ", but the file holds " + join(what, "; "));
    }
    replaced = replaced || slot(l, c).spec.has_value();
    slot(l, c).spec = std::move(specs[0]);
    single_files.push_back(*path);
  }
  if (l.folder && replaced) l.kind = "diffusers folder with parts replaced";
  else if (l.folder && !single_files.empty()) l.kind = "diffusers folder with parts added";
  else if (!l.folder && single_files.size() > 1) l.kind = "single files";
  if (mflux && !single_files.empty()) l.kind = replaced ? "mflux pack with parts replaced" : "mflux pack with parts added";

  // A missing part: which one, what was given, and the option that supplies it.
  for (const Role& r : kRoles) {
    ComponentSlot& s = slot(l, r.component);
    if (s.spec || !s.error.ok()) continue;
    s.error = not_found(std::string("no ") + r.words + ": " + l.given + " holds none; give it with " + r.option +
                        " FILE");
  }
  KLEIN_RETURN_IF_ERROR(check_pairing(l));

  // Scheduler and tokenizer: the folder's when its model_index.json names them (then they must be
  // there); else a tokenizer.json beside a model file, else the ones built into the library.
  if (l.folder && l.folder->has("scheduler")) {
    l.scheduler_where = (l.folder->root() / "scheduler" / "scheduler_config.json").string();
    auto sc = l.folder->config("scheduler");
    if (sc.ok()) l.scheduler = std::move(sc).value();
    else l.scheduler_error = sc.status();
  } else {
    l.scheduler_where = "the built-in FLUX.2 [klein] scheduler config";
    l.scheduler = nlohmann::json::parse(kFlux2KleinSchedulerJson);
  }
  if (l.folder && l.folder->has("tokenizer")) {
    auto t = l.folder->component("tokenizer");
    if (t.ok()) l.tokenizer = t->dir;
    else l.tokenizer_error = t.status();
  } else {
    for (const fs::path& f : single_files)
      if (l.tokenizer.empty() && fs::is_regular_file(f.parent_path() / "tokenizer.json", ec))
        l.tokenizer = f.parent_path() / "tokenizer.json";
  }

  // The variant is the transformer's: a folder's says it in model_index.json; a transformer file
  // does not (distilled and base have the same tensors), so it is the caller's word or distilled.
  const ComponentSpec* dit = l.transformer.spec ? &*l.transformer.spec : nullptr;
  if (l.folder && (!dit || dit->from_folder)) {
    l.distilled = l.folder->is_distilled();
    l.kv = l.folder->pipeline_class() == "Flux2KleinKVPipeline";
    l.variant_source = l.kv ? "model_index.json Flux2KleinKVPipeline" : "model_index.json is_distilled";
    const std::string index = (l.folder->root() / "model_index.json").string();
    if (req.variant == Variant::kDistilled && !l.distilled)
      return invalid_argument("--variant distilled: " + index + " says is_distilled false (a base model)");
    if (req.variant == Variant::kKv && !l.kv)
      return invalid_argument("--variant kv: " + index + " names pipeline \"" + l.folder->pipeline_class() +
                              "\", not Flux2KleinKVPipeline (the KV variant is its own distill)");
    if (l.kv && !l.distilled)
      return unsupported(index + ": a Flux2KleinKVPipeline with is_distilled false (the KV variant is a distill)");
  } else if (req.variant != Variant::kAuto) {
    l.distilled = req.variant != Variant::kBase;
    l.kv = req.variant == Variant::kKv;
    l.variant_source = "--variant";
  } else {
    l.distilled = true;
    l.variant_source = "default for single files";
    // An mflux pack's transformer is its folder transformer/: the pack's name says the variant.
    const fs::path named = dit && dit->scheme == NamingScheme::kMflux ? dit->path.parent_path() : fs::path();
    const fs::path& said = named.empty() && dit ? dit->path : named;
    if (dit && name_says_base(said))
      l.notes.push_back(said.filename().string() +
                        ": the file name suggests a base (undistilled) model; running it as distilled (4 steps, no "
                        "guidance); --variant distilled silences this note");
  }
  return l;
}

}  // namespace klein::api
