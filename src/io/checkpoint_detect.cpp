#include "io/checkpoint_detect.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "io/mapped_source.h"

namespace klein {

namespace {

using ShapeMap = std::map<std::string, Shape, std::less<>>;

// ComfyUI's all-in-one checkpoints (supported_models.py: Flux / Flux2 keep the DiT under
// "model.diffusion_model.", the VAE under "vae.", each text encoder under
// "text_encoders.<name>." with its transformers model below ".transformer."); older
// checkpoints name the VAE "first_stage_model.".
std::string prefix_of(const std::string& name) {
  for (const char* p : {"model.diffusion_model.", "vae.", "first_stage_model."})
    if (name.starts_with(p)) return p;
  static const std::string kTe = "text_encoders.";
  if (name.starts_with(kTe)) {
    const size_t dot = name.find('.', kTe.size());
    if (dot == std::string::npos) return kTe;
    static const std::string kInner = "transformer.";
    if (name.compare(dot + 1, kInner.size(), kInner) == 0) return name.substr(0, dot + 1 + kInner.size());
    return name.substr(0, dot + 1);
  }
  return "";
}

ShapeMap shape_map(const std::vector<TensorInfo>& t) {
  ShapeMap m;
  for (const TensorInfo& i : t) m.emplace(i.name, i.shape);
  return m;
}

// Distinct values of the index right after `prefix` ("transformer_blocks." → 0, 1, …).
std::set<int64_t> indices(const ShapeMap& m, const std::string& prefix) {
  std::set<int64_t> out;
  for (auto it = m.lower_bound(prefix); it != m.end() && it->first.starts_with(prefix); ++it) {
    int64_t v = 0;
    size_t k = prefix.size(), digits = 0;
    while (k < it->first.size() && it->first[k] >= '0' && it->first[k] <= '9' && digits < 9)
      v = v * 10 + (it->first[k++] - '0'), ++digits;
    if (digits > 0 && k < it->first.size() && it->first[k] == '.') out.insert(v);
  }
  return out;
}

// Detection and presets read shapes through this: a missing tensor or one of another rank is
// an error naming it.
class Shapes {
 public:
  Shapes(const std::vector<TensorInfo>& t, std::string where) : m_(shape_map(t)), where_(std::move(where)) {}
  bool has(const std::string& n) const { return m_.count(n) != 0; }
  Result<int64_t> dim(const std::string& n, size_t rank, size_t d) const {
    auto it = m_.find(n);
    if (it == m_.end()) return not_found(where_ + ": tensor '" + n + "' is missing (the model's sizes are read from it)");
    if (it->second.size() != rank || it->second[d] <= 0)
      return format_error(where_ + ": tensor '" + n + "' has shape " + shape_str(it->second) + ", expected " +
                          std::to_string(rank) + " positive dimensions");
    return it->second[d];
  }
  // The count of blocks under `prefix`, whose indices must run 0..count-1.
  Result<int64_t> blocks(const std::string& prefix) const {
    const std::set<int64_t> ix = indices(m_, prefix);
    if (!ix.empty() && *ix.rbegin() + 1 != static_cast<int64_t>(ix.size()))
      return format_error(where_ + ": " + std::to_string(ix.size()) + " blocks '" + prefix + "N' are present, but N runs to " +
                          std::to_string(*ix.rbegin()) + " (a block is missing)");
    return static_cast<int64_t>(ix.size());
  }
  const std::string& where() const { return where_; }

 private:
  ShapeMap m_;
  std::string where_;
};

std::string join(const std::vector<int64_t>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

const char* scheme_words(NamingScheme s) {
  switch (s) {
    case NamingScheme::kDiffusers: return "diffusers names";
    case NamingScheme::kBfl: return "BFL names";
    case NamingScheme::kLdm: return "LDM names";
    case NamingScheme::kHfTransformers: return "transformers names";
    case NamingScheme::kLlamaCpp: return "llama.cpp names";
    case NamingScheme::kMflux: return "mflux names";
    case NamingScheme::kUnknown: break;
  }
  return "unknown names";
}

// Fills family and description of a FLUX.2 transformer part from its (diffusers-named) tensors.
Status describe_dit(CheckpointPart* p, const std::string& where) {
  const Shapes s(p->tensors, where);
  KLEIN_ASSIGN_OR_RETURN(int64_t d, s.dim("x_embedder.weight", 2, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t ctx, s.dim("context_embedder.weight", 2, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t nd, s.blocks("transformer_blocks."));
  KLEIN_ASSIGN_OR_RETURN(int64_t ns, s.blocks("single_transformer_blocks."));
  // The released sizes: BFL's Klein4BParams / Klein9BParams and FLUX.2 [dev] (ComfyUI tells
  // them apart by txt_in's width; the block counts confirm).
  struct Known {
    int64_t d, ctx, nd, ns;
    Family f;
  };
  static constexpr Known kKnown[] = {{3072, 7680, 5, 20, Family::kFlux2Klein4B},
                                     {4096, 12288, 8, 24, Family::kFlux2Klein9B},
                                     {6144, 15360, 8, 48, Family::kFlux2Dev}};
  p->family = Family::kFlux2Other;
  for (const Known& k : kKnown)
    if (k.d == d && k.ctx == ctx && k.nd == nd && k.ns == ns) p->family = k.f;
  p->description = std::string(family_name(p->family)) + " transformer, " + scheme_words(p->scheme) + " (D " +
                   std::to_string(d) + ", text width " + std::to_string(ctx) + ", " + std::to_string(nd) +
                   " double + " + std::to_string(ns) + " single blocks)";
  return Status::Ok();
}

Status describe_vae(CheckpointPart* p, const std::string& where) {
  const Shapes s(p->tensors, where);
  KLEIN_ASSIGN_OR_RETURN(int64_t levels, s.blocks("encoder.down_blocks."));
  std::vector<int64_t> ch;
  for (int64_t i = 0; i < levels; ++i) {
    KLEIN_ASSIGN_OR_RETURN(int64_t c, s.dim("encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.weight", 4, 0));
    ch.push_back(c);
  }
  KLEIN_ASSIGN_OR_RETURN(int64_t latent, s.dim("decoder.conv_in.weight", 4, 1));
  p->description = std::string(family_name(p->family)) + ", " + scheme_words(p->scheme) + " (channels " +
                   join(ch, "/") + ", " + std::to_string(latent) + " latent channels)";
  return Status::Ok();
}

Status describe_qwen3(CheckpointPart* p, const std::string& where) {
  const Shapes s(p->tensors, where);
  KLEIN_ASSIGN_OR_RETURN(int64_t hidden, s.dim("model.embed_tokens.weight", 2, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t layers, s.blocks("model.layers."));
  // Qwen3-4B feeds klein 4B (3 × 2560 = 7680), Qwen3-8B klein 9B (3 × 4096 = 12288).
  const std::string which = hidden == 2560 ? "Qwen3-4B" : hidden == 4096 ? "Qwen3-8B" : "Qwen3";
  p->description = which + " text encoder, " + scheme_words(p->scheme) + " (hidden " + std::to_string(hidden) + ", " +
                   std::to_string(layers) + " layers)";
  return Status::Ok();
}

// Classifies the tensors of one prefix.
Result<CheckpointPart> classify(std::string prefix, std::vector<TensorInfo> tensors, const std::string& file) {
  CheckpointPart p;
  p.prefix = std::move(prefix);
  const std::string where = file + (p.prefix.empty() ? "" : " (tensors under '" + p.prefix + "')");
  const ShapeMap m = shape_map(tensors);
  auto has = [&m](const char* n) { return m.count(n) != 0; };
  auto adopt = [&](Component c, NamingScheme s, Family f, const NameMap* map) -> Status {
    p.component = c, p.scheme = s, p.family = f, p.map = map;
    if (!map) {
      p.tensors = std::move(tensors);
      std::sort(p.tensors.begin(), p.tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
      return Status::Ok();
    }
    KLEIN_ASSIGN_OR_RETURN(p.tensors, map_tensor_infos(*map, tensors, where));
    return Status::Ok();
  };
  // FLUX.2 is told from FLUX.1 by its shared modulations (sd.cpp model_loader, ComfyUI,
  // InvokeAI); diffusers' single-file loader keys on single_stream_modulation.
  if (has("double_stream_modulation_img.lin.weight") || has("single_stream_modulation.lin.weight")) {
    KLEIN_RETURN_IF_ERROR(adopt(Component::kTransformer, NamingScheme::kBfl, Family::kFlux2Other, &bfl_flux2_dit_map()));
    KLEIN_RETURN_IF_ERROR(describe_dit(&p, where));
  } else if (has("double_stream_modulation_img.linear.weight") || has("single_stream_modulation.linear.weight")) {
    KLEIN_RETURN_IF_ERROR(adopt(Component::kTransformer, NamingScheme::kDiffusers, Family::kFlux2Other, nullptr));
    KLEIN_RETURN_IF_ERROR(describe_dit(&p, where));
  } else if (has("double_blocks.0.img_mod.lin.weight") || has("time_text_embed.timestep_embedder.linear_1.weight")) {
    // FLUX.1 (per-block modulation; guidance_in and a 64-channel img_in in dev/schnell).
    const bool bfl = has("double_blocks.0.img_mod.lin.weight");
    KLEIN_RETURN_IF_ERROR(adopt(Component::kTransformer, bfl ? NamingScheme::kBfl : NamingScheme::kDiffusers,
                                Family::kFlux1, nullptr));
    p.description = std::string("FLUX.1 transformer, ") + scheme_words(p.scheme) + " (klein runs FLUX.2 models only)";
  } else if (has("encoder.down.0.block.0.conv1.weight")) {
    const bool bn = has("bn.running_mean");
    const int64_t levels = static_cast<int64_t>(indices(m, "encoder.down.").size());
    if (bn && levels == 4) {
      KLEIN_RETURN_IF_ERROR(adopt(Component::kVae, NamingScheme::kLdm, Family::kFlux2Vae, &ldm_flux2_vae_map()));
      KLEIN_RETURN_IF_ERROR(describe_vae(&p, where));
    } else {
      KLEIN_RETURN_IF_ERROR(adopt(Component::kVae, NamingScheme::kLdm, Family::kFlux1Vae, nullptr));
      p.description = bn ? "an LDM autoencoder with " + std::to_string(levels) + " levels (FLUX.2's has 4)"
                         : "an LDM autoencoder without FLUX.2's latent batch norm (a FLUX.1 / SD VAE)";
    }
  } else if (has("encoder.down_blocks.0.resnets.0.conv1.weight")) {
    const bool bn = has("bn.running_mean");
    KLEIN_RETURN_IF_ERROR(
        adopt(Component::kVae, NamingScheme::kDiffusers, bn ? Family::kFlux2Vae : Family::kFlux1Vae, nullptr));
    if (bn) KLEIN_RETURN_IF_ERROR(describe_vae(&p, where));
    else p.description = "a diffusers autoencoder without FLUX.2's latent batch norm (a FLUX.1 / SD VAE)";
  } else if (has("model.embed_tokens.weight") && has("model.layers.0.self_attn.q_proj.weight")) {
    // Qwen3 has per-head q/k RMSNorms; Qwen2 and Llama do not (ComfyUI detect_te_model).
    const bool qwen3 = has("model.layers.0.self_attn.q_norm.weight");
    KLEIN_RETURN_IF_ERROR(adopt(Component::kTextEncoder, NamingScheme::kHfTransformers,
                                qwen3 ? Family::kQwen3 : Family::kUnknown, qwen3 ? &hf_qwen3_single_file_map() : nullptr));
    if (qwen3) KLEIN_RETURN_IF_ERROR(describe_qwen3(&p, where));
    else p.description = "a transformers language model without q/k norms (not Qwen3)";
  } else if (has("token_embd.weight") || has("blk.0.attn_q.weight")) {
    // llama.cpp's Qwen3 has attn_q_norm / attn_k_norm (its Qwen2 and Llama do not).
    const bool qwen3 = has("blk.0.attn_q_norm.weight");
    KLEIN_RETURN_IF_ERROR(adopt(Component::kTextEncoder, NamingScheme::kLlamaCpp,
                                qwen3 ? Family::kQwen3 : Family::kUnknown, qwen3 ? &llama_cpp_qwen3_map() : nullptr));
    if (qwen3) KLEIN_RETURN_IF_ERROR(describe_qwen3(&p, where));
    else p.description = "a language model in llama.cpp names without q/k norms (not Qwen3)";
  } else {
    KLEIN_RETURN_IF_ERROR(adopt(Component::kUnknown, NamingScheme::kUnknown, Family::kUnknown, nullptr));
    p.description = std::to_string(p.tensors.size()) + " tensors in no known naming scheme" +
                    (p.tensors.empty() ? std::string() : " (first: '" + p.tensors.front().name + "')");
  }
  if (!p.prefix.empty()) p.description += " under '" + p.prefix + "'";
  return p;
}

}  // namespace

bool CheckpointPart::supported() const {
  switch (family) {
    case Family::kFlux2Klein4B:
    case Family::kFlux2Klein9B:
    case Family::kFlux2Dev:
    case Family::kFlux2Other:
    case Family::kFlux2Vae:
    case Family::kQwen3:
      return true;
    default:
      return false;
  }
}

const char* family_name(Family f) {
  switch (f) {
    case Family::kFlux2Klein4B: return "FLUX.2 [klein] 4B";
    case Family::kFlux2Klein9B: return "FLUX.2 [klein] 9B";
    case Family::kFlux2Dev: return "FLUX.2 [dev]";
    case Family::kFlux2Other: return "FLUX.2-architecture";
    case Family::kFlux2Vae: return "FLUX.2 VAE";
    case Family::kQwen3: return "Qwen3";
    case Family::kFlux1: return "FLUX.1";
    case Family::kFlux1Vae: return "FLUX.1 / SD VAE";
    case Family::kUnknown: break;
  }
  return "unknown";
}

Result<CheckpointInfo> detect_checkpoint(const std::vector<TensorInfo>& tensors, const std::string& where) {
  std::map<std::string, std::vector<TensorInfo>> groups;
  for (const TensorInfo& t : tensors) {
    std::string prefix = prefix_of(t.name);
    if (t.name.size() == prefix.size()) prefix.clear();  // a tensor named like a prefix stays whole
    groups[prefix].push_back({t.name.substr(prefix.size()), t.shape});
  }
  CheckpointInfo info;
  for (auto& [prefix, group] : groups) {
    KLEIN_ASSIGN_OR_RETURN(CheckpointPart p, classify(prefix, std::move(group), where));
    info.description += (info.description.empty() ? "" : "; ") + p.description;
    info.parts.push_back(std::move(p));
  }
  if (info.parts.empty()) info.description = "no tensors";
  return info;
}

Result<CheckpointInfo> detect_checkpoint(const TensorSource& src) {
  KLEIN_ASSIGN_OR_RETURN(auto infos, tensor_infos(src));
  return detect_checkpoint(infos, src.origin());
}

namespace {

Result<nlohmann::json> dit_preset(const Shapes& s) {
  const std::string& where = s.where();
  KLEIN_ASSIGN_OR_RETURN(int64_t d, s.dim("x_embedder.weight", 2, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t in, s.dim("x_embedder.weight", 2, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t ctx, s.dim("context_embedder.weight", 2, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t nd, s.blocks("transformer_blocks."));
  KLEIN_ASSIGN_OR_RETURN(int64_t ns, s.blocks("single_transformer_blocks."));
  // Head size from the q RMSNorm, MLP width from an output projection's input.
  const std::string blk = nd > 0 ? "transformer_blocks.0." : "single_transformer_blocks.0.";
  KLEIN_ASSIGN_OR_RETURN(int64_t head, s.dim(blk + "attn.norm_q.weight", 1, 0));
  int64_t mlp = 0;
  if (nd > 0) {
    KLEIN_ASSIGN_OR_RETURN(mlp, s.dim("transformer_blocks.0.ff.linear_out.weight", 2, 1));
  } else {
    KLEIN_ASSIGN_OR_RETURN(int64_t cat, s.dim("single_transformer_blocks.0.attn.to_out.weight", 2, 1));
    mlp = cat - d;
  }
  // FLUX.2 splits each head into 4 rope axes of equal size.
  if (d % head != 0 || head % 4 != 0 || mlp <= 0)
    return format_error(where + ": head size " + std::to_string(head) + " (from attn.norm_q) does not divide D " +
                        std::to_string(d) + " into heads of 4 rope axes, or the MLP width " + std::to_string(mlp) +
                        " is not positive");
  KLEIN_ASSIGN_OR_RETURN(int64_t tgc, s.dim("time_guidance_embed.timestep_embedder.linear_1.weight", 2, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t out, s.dim("proj_out.weight", 2, 0));
  nlohmann::json j;
  j["_class_name"] = "Flux2Transformer2DModel";
  j["attention_head_dim"] = head;
  j["axes_dims_rope"] = std::vector<int64_t>(4, head / 4);
  j["eps"] = 1e-6;
  j["guidance_embeds"] = s.has("time_guidance_embed.guidance_embedder.linear_1.weight");
  j["in_channels"] = in;
  j["joint_attention_dim"] = ctx;
  j["mlp_ratio"] = static_cast<double>(mlp) / static_cast<double>(d);
  j["num_attention_heads"] = d / head;
  j["num_layers"] = nd;
  j["num_single_layers"] = ns;
  j["out_channels"] = out == in ? nlohmann::json(nullptr) : nlohmann::json(out);
  j["patch_size"] = 1;
  j["rope_theta"] = 2000;
  j["timestep_guidance_channels"] = tgc;
  return j;
}

Result<nlohmann::json> vae_preset(const Shapes& s) {
  KLEIN_ASSIGN_OR_RETURN(int64_t levels, s.blocks("encoder.down_blocks."));
  KLEIN_ASSIGN_OR_RETURN(int64_t up_levels, s.blocks("decoder.up_blocks."));
  KLEIN_ASSIGN_OR_RETURN(int64_t layers, s.blocks("encoder.down_blocks.0.resnets."));
  std::vector<int64_t> enc, dec;
  for (int64_t i = 0; i < levels; ++i) {
    KLEIN_ASSIGN_OR_RETURN(int64_t c, s.dim("encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.weight", 4, 0));
    enc.push_back(c);
  }
  // The decoder's up_blocks run from the deepest level up; reversed they compare with the encoder's.
  for (int64_t i = up_levels - 1; i >= 0; --i) {
    KLEIN_ASSIGN_OR_RETURN(int64_t c, s.dim("decoder.up_blocks." + std::to_string(i) + ".resnets.0.conv1.weight", 4, 0));
    dec.push_back(c);
  }
  KLEIN_ASSIGN_OR_RETURN(int64_t in, s.dim("encoder.conv_in.weight", 4, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t out, s.dim("decoder.conv_out.weight", 4, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t latent, s.dim("decoder.conv_in.weight", 4, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t bn, s.dim("bn.running_mean", 1, 0));
  // The batch norm runs on patchified latents: latent × p² channels.
  const auto p = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(bn) / static_cast<double>(latent))));
  if (p <= 0 || latent * p * p != bn)
    return format_error(s.where() + ": bn.running_mean has " + std::to_string(bn) + " entries, not " +
                        std::to_string(latent) + " latent channels times a square patch");
  nlohmann::json j;
  j["_class_name"] = "AutoencoderKLFlux2";
  j["act_fn"] = "silu";
  j["batch_norm_eps"] = 1e-4;
  j["batch_norm_momentum"] = 0.1;
  j["block_out_channels"] = enc;
  j["decoder_block_out_channels"] = dec == enc ? nlohmann::json(nullptr) : nlohmann::json(dec);
  j["down_block_types"] = std::vector<std::string>(static_cast<size_t>(levels), "DownEncoderBlock2D");
  j["up_block_types"] = std::vector<std::string>(static_cast<size_t>(up_levels), "UpDecoderBlock2D");
  j["in_channels"] = in;
  j["out_channels"] = out;
  j["latent_channels"] = latent;
  j["layers_per_block"] = layers;
  j["mid_block_add_attention"] = s.has("encoder.mid_block.attentions.0.to_q.weight");
  // Not in the weights (GroupNorm has one weight per channel, whatever the groups): every
  // released FLUX.2 VAE uses 32.
  j["norm_num_groups"] = 32;
  j["patch_size"] = {p, p};
  j["sample_size"] = 1024;
  j["use_quant_conv"] = s.has("quant_conv.weight");
  j["use_post_quant_conv"] = s.has("post_quant_conv.weight");
  return j;
}

Result<nlohmann::json> qwen3_preset(const Shapes& s) {
  KLEIN_ASSIGN_OR_RETURN(int64_t vocab, s.dim("model.embed_tokens.weight", 2, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t hidden, s.dim("model.embed_tokens.weight", 2, 1));
  KLEIN_ASSIGN_OR_RETURN(int64_t layers, s.blocks("model.layers."));
  KLEIN_ASSIGN_OR_RETURN(int64_t head, s.dim("model.layers.0.self_attn.q_norm.weight", 1, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t q, s.dim("model.layers.0.self_attn.q_proj.weight", 2, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t kv, s.dim("model.layers.0.self_attn.k_proj.weight", 2, 0));
  KLEIN_ASSIGN_OR_RETURN(int64_t inter, s.dim("model.layers.0.mlp.gate_proj.weight", 2, 0));
  if (q % head != 0 || kv % head != 0)
    return format_error(s.where() + ": q_proj (" + std::to_string(q) + " rows) or k_proj (" + std::to_string(kv) +
                        " rows) is not a whole number of heads of " + std::to_string(head) + " (from q_norm)");
  nlohmann::json j;
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["attention_bias"] = s.has("model.layers.0.self_attn.q_proj.bias");
  j["head_dim"] = head;
  j["hidden_act"] = "silu";
  j["hidden_size"] = hidden;
  j["intermediate_size"] = inter;
  j["max_position_embeddings"] = 40960;
  j["num_attention_heads"] = q / head;
  j["num_hidden_layers"] = layers;
  j["num_key_value_heads"] = kv / head;
  j["rms_norm_eps"] = 1e-6;
  j["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  j["tie_word_embeddings"] = !s.has("lm_head.weight");
  j["vocab_size"] = vocab;
  return j;
}

}  // namespace

Result<nlohmann::json> preset_config(const CheckpointPart& part, const std::string& where) {
  if (!part.supported())
    return unsupported(where + ": no config preset for " + part.description);
  const Shapes s(part.tensors, where + (part.prefix.empty() ? "" : " (tensors under '" + part.prefix + "')"));
  switch (part.component) {
    case Component::kTransformer: return dit_preset(s);
    case Component::kVae: return vae_preset(s);
    case Component::kTextEncoder: return qwen3_preset(s);
    case Component::kUnknown: break;
  }
  return unsupported(where + ": no config preset for " + part.description);
}

}  // namespace klein
