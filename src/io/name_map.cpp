#include "io/name_map.h"

#include <algorithm>
#include <map>

namespace klein {

namespace {

// Values of a pattern's placeholders, by placeholder name ("i", "j", "*").
using Captures = std::map<std::string, std::string, std::less<>>;

constexpr size_t kMaxIndexDigits = 6;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Whether `s` matches `pat` as a whole; fills `caps`. Placeholders are well formed in the tables
// (checked by the tests), so a malformed one simply fails to match.
bool match(std::string_view pat, std::string_view s, Captures* caps) {
  caps->clear();
  size_t p = 0, k = 0;
  while (p < pat.size()) {
    if (pat[p] != '{') {
      if (k >= s.size() || s[k] != pat[p]) return false;
      ++p, ++k;
      continue;
    }
    const size_t close = pat.find('}', p);
    if (close == std::string_view::npos) return false;
    const std::string_view ph = pat.substr(p + 1, close - p - 1);
    p = close + 1;
    if (ph == "*") {
      if (p != pat.size() || k >= s.size()) return false;
      caps->emplace(std::string(ph), std::string(s.substr(k)));
      return true;
    }
    size_t d = k;
    while (d < s.size() && is_digit(s[d])) ++d;
    const size_t n = d - k;
    // One spelling per index, so that unmap_name gives back the name map_name was given.
    if (n == 0 || n > kMaxIndexDigits || (n > 1 && s[k] == '0')) return false;
    caps->emplace(std::string(ph), std::string(s.substr(k, n)));
    k = d;
  }
  return k == s.size();
}

std::string format(std::string_view pat, const Captures& caps) {
  std::string out;
  size_t p = 0;
  while (p < pat.size()) {
    if (pat[p] != '{') {
      out += pat[p++];
      continue;
    }
    const size_t close = pat.find('}', p);
    auto it = caps.find(pat.substr(p + 1, close - p - 1));
    if (it != caps.end()) out += it->second;
    p = close + 1;
  }
  return out;
}

std::string quoted_list(const std::vector<std::string>& names, size_t show) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < show; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > show) s += " and " + std::to_string(names.size() - show) + " more";
  return s;
}

NameRule rename(std::string from, std::string to) { return {std::move(from), {std::move(to)}, NameOp::kRename, 0}; }
NameRule split_rows(std::string from, std::vector<std::string> to) {
  return {std::move(from), std::move(to), NameOp::kSplitRows, 0};
}
NameRule swap_halves(std::string from, std::string to) {
  return {std::move(from), {std::move(to)}, NameOp::kSwapHalves, 0};
}
NameRule reshape(std::string from, std::string to, int rank) {
  return {std::move(from), {std::move(to)}, NameOp::kReshape, rank};
}
NameRule ohwi_to_oihw(std::string from, std::string to) {
  return {std::move(from), {std::move(to)}, NameOp::kOhwiToOihw, 0};
}

}  // namespace

std::vector<MappedName> map_name(const NameMap& map, std::string_view source) {
  Captures caps;
  for (size_t r = 0; r < map.rules.size(); ++r) {
    const NameRule& rule = map.rules[r];
    if (!match(rule.from, source, &caps)) continue;
    std::vector<MappedName> out;
    for (size_t part = 0; part < rule.to.size(); ++part)
      out.push_back({format(rule.to[part], caps), r, static_cast<int>(part)});
    return out;
  }
  return {};
}

std::optional<SourceName> unmap_name(const NameMap& map, std::string_view target) {
  Captures caps;
  for (size_t r = 0; r < map.rules.size(); ++r) {
    const NameRule& rule = map.rules[r];
    for (size_t part = 0; part < rule.to.size(); ++part) {
      if (!match(rule.to[part], target, &caps)) continue;
      // The candidate must map back to this target by this very rule: an earlier rule may claim
      // the source name first (first match wins).
      std::string source = format(rule.from, caps);
      std::vector<MappedName> fwd = map_name(map, source);
      if (part < fwd.size() && fwd[part].rule == r && fwd[part].target == target)
        return SourceName{std::move(source), r, static_cast<int>(part)};
    }
  }
  return std::nullopt;
}

Result<Shape> mapped_shape(const NameMap& map, const MappedName& m, const std::string& source, const Shape& shape) {
  const NameRule& rule = map.rules[m.rule];
  const std::string what = "tensor '" + source + "' " + shape_str(shape) + " (name map " + map.name + ")";
  switch (rule.op) {
    case NameOp::kRename:
      return shape;
    case NameOp::kSplitRows: {
      const int64_t parts = static_cast<int64_t>(rule.to.size());
      if (shape.empty() || shape[0] % parts != 0)
        return format_error(what + " is split by rows into " + std::to_string(parts) + " equal parts, but " +
                            (shape.empty() ? std::string("it has no rows") : "its " + std::to_string(shape[0]) +
                                                                                 " rows do not divide"));
      Shape s = shape;
      s[0] /= parts;
      return s;
    }
    case NameOp::kSwapHalves:
      if (shape.empty() || shape[0] % 2 != 0)
        return format_error(what + " has its row halves swapped, but has no even row count");
      return shape;
    case NameOp::kOhwiToOihw:
      if (shape.size() != 4)
        return format_error(what + " is a conv weight stored [O, H, W, I] (MLX), but it is not 4-D");
      return Shape{shape[0], shape[3], shape[1], shape[2]};
    case NameOp::kReshape: {
      Shape s = shape;
      const size_t rank = static_cast<size_t>(rule.rank);
      while (s.size() > rank) {
        if (s.back() != 1)
          return format_error(what + " is reshaped to rank " + std::to_string(rank) +
                              ", which drops only dimensions of size 1");
        s.pop_back();
      }
      s.resize(rank, 1);
      return s;
    }
  }
  return internal_error("name map " + map.name + ": unknown rule kind");
}

Result<std::vector<std::pair<std::string, MappedName>>> map_names(const NameMap& map,
                                                                  const std::vector<std::string>& names,
                                                                  const std::string& where) {
  std::vector<std::pair<std::string, MappedName>> out;
  std::vector<std::string> unmatched;
  for (const std::string& n : names) {
    std::vector<MappedName> targets = map_name(map, n);
    if (targets.empty()) unmatched.push_back(n);
    for (MappedName& t : targets) out.emplace_back(n, std::move(t));
  }
  if (!unmatched.empty())
    return format_error(where + ": " + std::to_string(unmatched.size()) + " tensor" +
                        (unmatched.size() == 1 ? "" : "s") + " match no rule of the name map " + map.name + ": " +
                        quoted_list(unmatched, 5));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second.target < b.second.target; });
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].second.target == out[i - 1].second.target)
      return format_error(where + ": tensors '" + out[i - 1].first + "' and '" + out[i].first +
                          "' both map to '" + out[i].second.target + "' (name map " + map.name + ")");
  return out;
}

Result<std::vector<TensorInfo>> map_tensor_infos(const NameMap& map, const std::vector<TensorInfo>& tensors,
                                                 const std::string& where) {
  std::vector<std::string> names;
  std::map<std::string, const Shape*, std::less<>> shapes;
  for (const TensorInfo& t : tensors) {
    if (!shapes.emplace(t.name, &t.shape).second)
      return format_error(where + ": tensor '" + t.name + "' is listed twice");
    names.push_back(t.name);
  }
  KLEIN_ASSIGN_OR_RETURN(auto mapped, map_names(map, names, where));
  std::vector<TensorInfo> out;
  out.reserve(mapped.size());
  for (const auto& [source, m] : mapped) {
    auto s = mapped_shape(map, m, source, *shapes.at(source));
    if (!s.ok()) return Status(s.status().code(), where + ": " + s.status().message());
    out.push_back({m.target, std::move(*s)});
  }
  return out;
}

const NameMap& bfl_flux2_dit_map() {
  // convert_flux2_transformer_checkpoint_to_diffusers: its rename dictionary (applied to any
  // parameter), its double- and single-block maps (.weight / .bias, and .scale → .weight for the
  // q/k RMSNorms), torch.chunk(qkv, 3, dim=0) and swap_scale_shift on the final modulation's
  // weight. FLUX.2 has no biases; the {*} rules pass one through as diffusers does.
  static const NameMap kMap{
      "bfl_flux2_dit",
      {
          rename("img_in.{*}", "x_embedder.{*}"),
          rename("txt_in.{*}", "context_embedder.{*}"),
          rename("time_in.in_layer.{*}", "time_guidance_embed.timestep_embedder.linear_1.{*}"),
          rename("time_in.out_layer.{*}", "time_guidance_embed.timestep_embedder.linear_2.{*}"),
          rename("guidance_in.in_layer.{*}", "time_guidance_embed.guidance_embedder.linear_1.{*}"),
          rename("guidance_in.out_layer.{*}", "time_guidance_embed.guidance_embedder.linear_2.{*}"),
          rename("double_stream_modulation_img.lin.{*}", "double_stream_modulation_img.linear.{*}"),
          rename("double_stream_modulation_txt.lin.{*}", "double_stream_modulation_txt.linear.{*}"),
          rename("single_stream_modulation.lin.{*}", "single_stream_modulation.linear.{*}"),
          rename("final_layer.linear.{*}", "proj_out.{*}"),
          // BFL computes (shift, scale), diffusers and klein's DiT (scale, shift).
          swap_halves("final_layer.adaLN_modulation.1.weight", "norm_out.linear.weight"),
          split_rows("double_blocks.{i}.img_attn.qkv.{*}",
                     {"transformer_blocks.{i}.attn.to_q.{*}", "transformer_blocks.{i}.attn.to_k.{*}",
                      "transformer_blocks.{i}.attn.to_v.{*}"}),
          split_rows("double_blocks.{i}.txt_attn.qkv.{*}",
                     {"transformer_blocks.{i}.attn.add_q_proj.{*}", "transformer_blocks.{i}.attn.add_k_proj.{*}",
                      "transformer_blocks.{i}.attn.add_v_proj.{*}"}),
          rename("double_blocks.{i}.img_attn.norm.query_norm.scale", "transformer_blocks.{i}.attn.norm_q.weight"),
          rename("double_blocks.{i}.img_attn.norm.key_norm.scale", "transformer_blocks.{i}.attn.norm_k.weight"),
          rename("double_blocks.{i}.img_attn.proj.{*}", "transformer_blocks.{i}.attn.to_out.0.{*}"),
          rename("double_blocks.{i}.img_mlp.0.{*}", "transformer_blocks.{i}.ff.linear_in.{*}"),
          rename("double_blocks.{i}.img_mlp.2.{*}", "transformer_blocks.{i}.ff.linear_out.{*}"),
          rename("double_blocks.{i}.txt_attn.norm.query_norm.scale",
                 "transformer_blocks.{i}.attn.norm_added_q.weight"),
          rename("double_blocks.{i}.txt_attn.norm.key_norm.scale", "transformer_blocks.{i}.attn.norm_added_k.weight"),
          rename("double_blocks.{i}.txt_attn.proj.{*}", "transformer_blocks.{i}.attn.to_add_out.{*}"),
          rename("double_blocks.{i}.txt_mlp.0.{*}", "transformer_blocks.{i}.ff_context.linear_in.{*}"),
          rename("double_blocks.{i}.txt_mlp.2.{*}", "transformer_blocks.{i}.ff_context.linear_out.{*}"),
          // The fused [Q|K|V|gate|up] input and [attn|mlp] output projections keep their layout;
          // diffusers names them as one tensor each too.
          rename("single_blocks.{i}.linear1.{*}", "single_transformer_blocks.{i}.attn.to_qkv_mlp_proj.{*}"),
          rename("single_blocks.{i}.linear2.{*}", "single_transformer_blocks.{i}.attn.to_out.{*}"),
          rename("single_blocks.{i}.norm.query_norm.scale", "single_transformer_blocks.{i}.attn.norm_q.weight"),
          rename("single_blocks.{i}.norm.key_norm.scale", "single_transformer_blocks.{i}.attn.norm_k.weight"),
      }};
  return kMap;
}

const NameMap& ldm_flux2_vae_map() {
  // convert_ldm_vae_checkpoint (+ DIFFUSERS_TO_LDM_MAPPING["vae"], update_vae_resnet_ldm_to_diffusers,
  // update_vae_attentions_ldm_to_diffusers, conv_attn_to_linear) for four levels: the decoder's
  // up.{b} is up_blocks.{3-b}, written out per level so that the table stays plain data. FLUX.2's
  // ae.safetensors keeps its quant convs inside the encoder / decoder; older LDM files at the top.
  static const NameMap kMap = [] {
  std::vector<NameRule> r = {
      rename("encoder.quant_conv.{*}", "quant_conv.{*}"),
      rename("decoder.post_quant_conv.{*}", "post_quant_conv.{*}"),
      rename("quant_conv.{*}", "quant_conv.{*}"),
      rename("post_quant_conv.{*}", "post_quant_conv.{*}"),
      rename("bn.{*}", "bn.{*}"),
  };
  for (const std::string part : {"encoder", "decoder"}) {
    r.push_back(rename(part + ".conv_in.{*}", part + ".conv_in.{*}"));
    r.push_back(rename(part + ".conv_out.{*}", part + ".conv_out.{*}"));
    r.push_back(rename(part + ".norm_out.{*}", part + ".conv_norm_out.{*}"));
    r.push_back(rename(part + ".mid.block_1.{*}", part + ".mid_block.resnets.0.{*}"));
    r.push_back(rename(part + ".mid.block_2.{*}", part + ".mid_block.resnets.1.{*}"));
    const std::string attn = part + ".mid.attn_1.", to = part + ".mid_block.attentions.0.";
    r.push_back(rename(attn + "norm.{*}", to + "group_norm.{*}"));
    // q, k, v and proj_out are 1×1 convs [C, C, 1, 1] in LDM files, Linear [C, C] in diffusers.
    for (const auto& [ldm, diff] : {std::pair<std::string, std::string>{"q", "to_q"}, {"k", "to_k"}, {"v", "to_v"},
                                    {"proj_out", "to_out.0"}}) {
      r.push_back(reshape(attn + ldm + ".weight", to + diff + ".weight", 2));
      r.push_back(rename(attn + ldm + ".bias", to + diff + ".bias"));
    }
  }
  r.push_back(rename("encoder.down.{i}.block.{j}.nin_shortcut.{*}", "encoder.down_blocks.{i}.resnets.{j}.conv_shortcut.{*}"));
  r.push_back(rename("encoder.down.{i}.block.{j}.{*}", "encoder.down_blocks.{i}.resnets.{j}.{*}"));
  r.push_back(rename("encoder.down.{i}.downsample.conv.{*}", "encoder.down_blocks.{i}.downsamplers.0.conv.{*}"));
  constexpr int kLevels = 4;
  for (int b = 0; b < kLevels; ++b) {
    const std::string up = "decoder.up." + std::to_string(b) + ".";
    const std::string to = "decoder.up_blocks." + std::to_string(kLevels - 1 - b) + ".";
    r.push_back(rename(up + "block.{j}.nin_shortcut.{*}", to + "resnets.{j}.conv_shortcut.{*}"));
    r.push_back(rename(up + "block.{j}.{*}", to + "resnets.{j}.{*}"));
    r.push_back(rename(up + "upsample.conv.{*}", to + "upsamplers.0.conv.{*}"));
  }
  return NameMap{"ldm_flux2_vae", std::move(r)};
  }();
  return kMap;
}

const NameMap& hf_qwen3_single_file_map() {
  static const NameMap kMap{"hf_qwen3_single_file", {rename("{*}", "{*}")}};
  return kMap;
}

const NameMap& mflux_flux2_dit_map() {
  // Flux2WeightMapping.get_transformer_mapping: only these three differ from diffusers' names.
  static const NameMap kMap{
      "mflux_flux2_dit",
      {
          rename("time_guidance_embed.linear_1.{*}", "time_guidance_embed.timestep_embedder.linear_1.{*}"),
          rename("time_guidance_embed.linear_2.{*}", "time_guidance_embed.timestep_embedder.linear_2.{*}"),
          rename("transformer_blocks.{i}.attn.to_out.{*}", "transformer_blocks.{i}.attn.to_out.0.{*}"),
          rename("{*}", "{*}"),
      }};
  return kMap;
}

const NameMap& llama_cpp_qwen3_map() {
  // llama.cpp's gguf-py tensor_mapping.py (MODEL_ARCH.QWEN3) names, from convert_hf_to_gguf.py's
  // Qwen3Model: a Qwen2Model, not a LlamaModel, so q / k rows are stored as transformers has them
  // (no rotary permutation to undo) and every rule is a rename.
  static const NameMap kMap{
      "llama_cpp_qwen3",
      {
          rename("token_embd.weight", "model.embed_tokens.weight"),
          rename("output_norm.weight", "model.norm.weight"),
          rename("output.weight", "lm_head.weight"),
          rename("blk.{i}.attn_q.{*}", "model.layers.{i}.self_attn.q_proj.{*}"),
          rename("blk.{i}.attn_k.{*}", "model.layers.{i}.self_attn.k_proj.{*}"),
          rename("blk.{i}.attn_v.{*}", "model.layers.{i}.self_attn.v_proj.{*}"),
          rename("blk.{i}.attn_output.{*}", "model.layers.{i}.self_attn.o_proj.{*}"),
          rename("blk.{i}.attn_q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight"),
          rename("blk.{i}.attn_k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"),
          rename("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
          rename("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
          rename("blk.{i}.ffn_gate.{*}", "model.layers.{i}.mlp.gate_proj.{*}"),
          rename("blk.{i}.ffn_up.{*}", "model.layers.{i}.mlp.up_proj.{*}"),
          rename("blk.{i}.ffn_down.{*}", "model.layers.{i}.mlp.down_proj.{*}"),
      }};
  return kMap;
}

const NameMap& mflux_flux2_vae_map() {
  // Flux2WeightMapping.get_vae_mapping: every Conv2d weight goes through
  // transpose_conv2d_weight (OIHW → OHWI), so each is listed; the attention's to_out.0 is to_out.
  static const NameMap kMap = [] {
    std::vector<NameRule> r;
    for (const std::string c : {"encoder.conv_in", "encoder.conv_out", "decoder.conv_in", "decoder.conv_out",
                                "quant_conv", "post_quant_conv"})
      r.push_back(ohwi_to_oihw(c + ".weight", c + ".weight"));
    for (const std::string part : {"encoder", "decoder"}) {
      for (const std::string conv : {"conv1", "conv2"})
        r.push_back(ohwi_to_oihw(part + ".mid_block.resnets.{i}." + conv + ".weight",
                                 part + ".mid_block.resnets.{i}." + conv + ".weight"));
      r.push_back(rename(part + ".mid_block.attentions.0.to_out.{*}", part + ".mid_block.attentions.0.to_out.0.{*}"));
    }
    for (const std::string blocks : {"encoder.down_blocks", "decoder.up_blocks"})
      for (const std::string conv : {"conv1", "conv2", "conv_shortcut"})
        r.push_back(ohwi_to_oihw(blocks + ".{i}.resnets.{j}." + conv + ".weight",
                                 blocks + ".{i}.resnets.{j}." + conv + ".weight"));
    r.push_back(ohwi_to_oihw("encoder.down_blocks.{i}.downsamplers.0.conv.weight",
                             "encoder.down_blocks.{i}.downsamplers.0.conv.weight"));
    r.push_back(ohwi_to_oihw("decoder.up_blocks.{i}.upsamplers.0.conv.weight",
                             "decoder.up_blocks.{i}.upsamplers.0.conv.weight"));
    r.push_back(rename("{*}", "{*}"));
    return NameMap{"mflux_flux2_vae", std::move(r)};
  }();
  return kMap;
}

const NameMap& mflux_qwen3_map() {
  // Flux2WeightMapping.get_text_encoder_mapping: model.X → X (mflux keeps no lm_head).
  static const NameMap kMap{"mflux_qwen3", {rename("{*}", "model.{*}")}};
  return kMap;
}

const NameMap* name_map_by_name(std::string_view name) {
  for (const NameMap* m : {&bfl_flux2_dit_map(), &ldm_flux2_vae_map(), &hf_qwen3_single_file_map(),
                           &mflux_flux2_dit_map(), &mflux_flux2_vae_map(), &mflux_qwen3_map(),
                           &llama_cpp_qwen3_map()})
    if (m->name == name) return m;
  return nullptr;
}

std::span<const CompanionRule> quant_companion_rules() {
  static constexpr CompanionRule kRules[] = {
      {"weight_scale", CompanionRole::kWeightScale}, {"scale_weight", CompanionRole::kWeightScale},
      {"input_scale", CompanionRole::kInputScale},   {"scale_input", CompanionRole::kInputScale},
      {"comfy_quant", CompanionRole::kQuantConfig},
  };
  return kRules;
}

}  // namespace klein
