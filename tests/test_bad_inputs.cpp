// The bad-input corpus: each case builds one bad input at run time from the tiny model (a copy
// of one folder or file with one thing corrupted), runs the `klein` CLI on it, and checks the
// exit code, that the FIRST stderr line names the file / tensor / option at fault, and that no
// output or temporary file is left behind. Runs with -q: progress lines are not errors.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "io/safetensors_writer.h"
#include "corrupt.h"
#include "testing.h"

namespace klein::testing {
namespace {

struct Ctx {
  fs::path dir;    // the case's scratch folder
  fs::path model;  // dir/model: the tiny model, files symlinked until own()ed
  fs::path out;    // dir/out/x.png (dir/out must stay empty)
  fs::path file(const std::string& rel) const { return model / rel; }
  // `klein generate` on the scratch model, 32x32, 1 step, quiet; `extra` appended.
  std::string gen(const std::string& extra = "") const {
    return "generate --model " + q(model) + " -W 32 -H 32 --steps 1 -q -o " + q(out) + " --prompt hi " + extra;
  }
  std::string gen_no_prompt(const std::string& extra) const {
    return "generate --model " + q(model) + " -W 32 -H 32 --steps 1 -q -o " + q(out) + " " + extra;
  }
  std::string img(const std::string& name) const { return q(data_dir() / "images" / name); }
};

struct Case {
  const char* name;
  int exit_code;
  const char* first_line_has;  // a substring of the first stderr line
  std::function<std::string(const Ctx&)> setup;  // builds the bad input, returns the CLI arguments
  const char* also = nullptr;  // a second substring of that line (e.g. the tensor beside the file)
};

// A copy of the independent writer's single file `name` in the case's folder, its header's
// tensor names passed through `rename` (an empty result drops the tensor from the header).
fs::path single_copy(const Ctx& x, const std::string& name, const std::function<std::string(const std::string&)>& rename) {
  const fs::path p = x.dir / name;
  StFile f = st_read(data_dir() / "single_file" / name);
  auto h = nlohmann::json::parse(f.header);
  nlohmann::json out = nlohmann::json::object();
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string n = it.key() == "__metadata__" ? it.key() : rename(it.key());
    if (!n.empty()) out[n] = it.value();
  }
  st_write(p, out.dump(), f.data);
  return p;
}
// A Qwen3 shaped like an 8B beside a 4B (hidden 32, where the tiny transformer takes 3 x 16): the
// tensors detection and the config preset read, zeros.
fs::path wide_qwen3(const Ctx& x) {
  static const std::vector<float> zeros(64 * 64, 0.0f);
  const fs::path p = x.dir / "qwen3-wide.safetensors";
  EXPECT_TRUE(write_safetensors(p, {{"model.embed_tokens.weight", DType::kF32, {64, 32}, zeros.data()},
                                    {"model.layers.0.self_attn.q_proj.weight", DType::kF32, {32, 32}, zeros.data()},
                                    {"model.layers.0.self_attn.k_proj.weight", DType::kF32, {16, 32}, zeros.data()},
                                    {"model.layers.0.self_attn.q_norm.weight", DType::kF32, {8}, zeros.data()},
                                    {"model.layers.0.mlp.gate_proj.weight", DType::kF32, {64, 32}, zeros.data()}})
                  .ok());
  return p;
}

const std::string kTe = "text_encoder/model.safetensors";
const std::string kDit = "transformer/diffusion_pytorch_model.safetensors";
const std::string kVae = "vae/diffusion_pytorch_model.safetensors";
constexpr uint16_t kBf16NaN = 0x7FC0, kBf16Inf = 0x7F80, kBf16NegInf = 0xFF80;
constexpr uint16_t kBf16Huge = 0x7CF0;  // 9.97e36: a q4 weight of 15 · it is still a float32

std::vector<Case> cases() {
  std::vector<Case> c;
  auto add = [&](const char* n, int rc, const char* has, std::function<std::string(const Ctx&)> f,
                 const char* also = nullptr) { c.push_back({n, rc, has, std::move(f), also}); };
  // ---- model folders
  add("ModelMissing", 1, "nowhere", [](const Ctx& x) { return "generate -q --prompt a -o " + q(x.out) + " --model " + q(x.dir / "nowhere"); });
  add("ModelIsAFile", 2, "model_index.json", [](const Ctx& x) { return "generate -q --prompt a -o " + q(x.out) + " --model " + q(x.file("model_index.json")); });
  add("NoModelIndex", 1, "model_index.json", [](const Ctx& x) { fs::remove(x.file("model_index.json")); return x.gen(); });
  add("ModelIndexNotJson", 1, "model_index.json", [](const Ctx& x) { spit_file(own(x.file("model_index.json")), "{nope"); return x.gen(); });
  add("ModelIndexNoVae", 1, "\"vae\"", [](const Ctx& x) { edit_json(x.file("model_index.json"), [](auto& j) { j.erase("vae"); }); return x.gen(); });
  add("VaeFolderMissing", 1, "vae", [](const Ctx& x) { fs::remove_all(x.file("vae")); return x.gen(); });
  add("IsDistilledNotABool", 1, "is_distilled", [](const Ctx& x) { edit_json(x.file("model_index.json"), [](auto& j) { j["is_distilled"] = "no"; }); return x.gen(); });
  add("OtherPipeline", 1, "model_index.json", [](const Ctx& x) { edit_json(x.file("model_index.json"), [](auto& j) { j["_class_name"] = "FluxPipeline"; }); return x.gen(); });
  add("TextEncoderClass", 1, "model_index.json", [](const Ctx& x) { edit_json(x.file("model_index.json"), [](auto& j) { j["text_encoder"][1] = "T5EncoderModel"; }); return x.gen(); });
  add("EntryNotAPair", 1, "model_index.json", [](const Ctx& x) { edit_json(x.file("model_index.json"), [](auto& j) { j["vae"] = {"diffusers"}; }); return x.gen(); });
  // ---- scheduler
  add("SchedulerConfigMissing", 1, "scheduler/scheduler_config.json", [](const Ctx& x) { fs::remove(x.file("scheduler/scheduler_config.json")); return x.gen(); });
  add("SchedulerConfigNotJson", 1, "scheduler_config.json", [](const Ctx& x) { spit_file(own(x.file("scheduler/scheduler_config.json")), "[1,"); return x.gen(); });
  add("SchedulerClass", 1, "scheduler_config.json", [](const Ctx& x) { edit_json(x.file("scheduler/scheduler_config.json"), [](auto& j) { j["_class_name"] = "DDIMScheduler"; }); return x.gen(); });
  add("SchedulerShiftText", 1, "scheduler_config.json", [](const Ctx& x) { edit_json(x.file("scheduler/scheduler_config.json"), [](auto& j) { j["shift"] = "big"; }); return x.gen(); });
  // ---- text encoder config
  auto te_cfg = [](const Ctx& x, const char* key, nlohmann::json v) {
    edit_json(x.file("text_encoder/config.json"), [&](auto& j) { j[key] = v; });
    return x.gen();
  };
  add("TeConfigMissing", 1, "text_encoder/config.json", [](const Ctx& x) { fs::remove(x.file("text_encoder/config.json")); return x.gen(); });
  add("TeLayersBillion", 1, "num_hidden_layers", [=](const Ctx& x) { return te_cfg(x, "num_hidden_layers", 1000000000); });
  add("TeLayers20", 1, "num_hidden_layers", [=](const Ctx& x) { return te_cfg(x, "num_hidden_layers", 20); });
  add("TeLayers28FileHas30", 1, "model.layers.28", [=](const Ctx& x) { return te_cfg(x, "num_hidden_layers", 28); });
  add("TeHeadsHuge", 1, "text_encoder/config.json", [=](const Ctx& x) { return te_cfg(x, "num_attention_heads", int64_t{1} << 31); });
  add("TeHiddenHugeUnsigned", 1, "hidden_size", [=](const Ctx& x) { return te_cfg(x, "hidden_size", uint64_t{1} << 63); });
  add("TeHiddenText", 1, "hidden_size", [=](const Ctx& x) { return te_cfg(x, "hidden_size", "sixteen"); });
  add("TeHiddenAct", 1, "hidden_act", [=](const Ctx& x) { return te_cfg(x, "hidden_act", "gelu"); });
  add("TeKvHeads3", 1, "num_key_value_heads", [=](const Ctx& x) { return te_cfg(x, "num_key_value_heads", 3); });
  add("TeHiddenMismatch", 1, "joint_attention_dim", [=](const Ctx& x) { return te_cfg(x, "hidden_size", 32); });
  // ---- transformer config
  auto dit_cfg = [](const Ctx& x, const char* key, nlohmann::json v) {
    edit_json(x.file("transformer/config.json"), [&](auto& j) { j[key] = v; });
    return x.gen();
  };
  add("DitAxesHuge", 1, "axes_dims_rope", [=](const Ctx& x) { return dit_cfg(x, "axes_dims_rope", {int64_t{1} << 62, int64_t{1} << 62, 2, 2}); });
  add("DitAxesSum", 1, "axes_dims_rope", [=](const Ctx& x) { return dit_cfg(x, "axes_dims_rope", {2, 2}); });
  add("DitMlpRatioHuge", 1, "mlp_ratio", [=](const Ctx& x) { return dit_cfg(x, "mlp_ratio", 1e300); });
  add("DitHeadsHuge", 1, "transformer/config.json", [=](const Ctx& x) { return dit_cfg(x, "num_attention_heads", int64_t{1} << 40); });
  add("DitPatch2", 1, "patch_size", [=](const Ctx& x) { return dit_cfg(x, "patch_size", 2); });
  add("DitInChannels64", 1, "in_channels", [=](const Ctx& x) { return dit_cfg(x, "in_channels", 64); });
  add("DitClass", 1, "_class_name", [=](const Ctx& x) { return dit_cfg(x, "_class_name", "FluxTransformer2DModel"); });
  add("DitLayers3", 1, "transformer_blocks.2", [=](const Ctx& x) { return dit_cfg(x, "num_layers", 3); });
  // ---- VAE config
  auto vae_cfg = [](const Ctx& x, const std::function<void(nlohmann::json&)>& fn) {
    edit_json(x.file("vae/config.json"), fn);
    return x.gen();
  };
  add("VaeThreeBlocks", 1, "block_out_channels", [=](const Ctx& x) {
    return vae_cfg(x, [](auto& j) {
      j["block_out_channels"] = {8, 16, 32};
      j["down_block_types"] = {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"};
      j["up_block_types"] = {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"};
    });
  });
  add("VaeLatent16", 1, "latent_channels", [=](const Ctx& x) { return vae_cfg(x, [](auto& j) { j["latent_channels"] = 16; }); });
  add("VaeChannelsHuge", 1, "block_out_channels", [=](const Ctx& x) {
    return vae_cfg(x, [](auto& j) { j["block_out_channels"] = {8, 16, int64_t{1} << 40, 32}; j["norm_num_groups"] = 4; });
  });
  add("VaeGroups5", 1, "norm_num_groups", [=](const Ctx& x) { return vae_cfg(x, [](auto& j) { j["norm_num_groups"] = 5; }); });
  add("VaeActRelu", 1, "act_fn", [=](const Ctx& x) { return vae_cfg(x, [](auto& j) { j["act_fn"] = "relu"; }); });
  add("VaeOutChannels4", 1, "out_channels", [=](const Ctx& x) { return vae_cfg(x, [](auto& j) { j["out_channels"] = 4; }); });
  // ---- option values and configs (issue 41)
  const std::string z2x2 = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 2, 2), }";
  auto decode_with = [=](const Ctx& x, const std::string& extra) {
    write_raw_npy(x.dir / "z.npy", z2x2, std::string(512 * 4, '\0'));
    return "decode --model " + q(x.model) + " -q --latents " + q(x.dir / "z.npy") + " -o " + q(x.out) + " " + extra;
  };
  auto serve_with = [](const Ctx& x, const std::string& extra) { return "serve --model " + q(x.model) + " --port 0 " + extra; };
  add("MaxMemoryNaN", 2, "--max-memory nan", [](const Ctx& x) { return x.gen("--max-memory nan"); });
  add("MaxMemoryInf", 2, "--max-memory", [](const Ctx& x) { return x.gen("--max-memory inf"); });
  add("EncodeMaxMemoryNaN", 2, "--max-memory nan", [](const Ctx& x) {
    return "encode --model " + q(x.model) + " -q --prompt a -o " + q(x.dir / "out" / "e.npy") + " --max-memory nan";
  });
  add("DecodeMaxMemoryNaN", 2, "--max-memory nan", [=](const Ctx& x) { return decode_with(x, "--max-memory nan"); });
  add("ServeMaxMemoryNaN", 2, "--max-memory nan", [=](const Ctx& x) { return serve_with(x, "--max-memory nan"); });
  add("VaeTile100", 2, "--vae-tile 100: must be a multiple of 8", [](const Ctx& x) { return x.gen("--vae-tile 100"); });
  add("DecodeVaeTile12", 2, "--vae-tile 12", [=](const Ctx& x) { return decode_with(x, "--vae-tile 12"); });
  add("ServeVaeTile100", 2, "--vae-tile 100", [=](const Ctx& x) { return serve_with(x, "--vae-tile 100"); });
  // An ISA this CPU lacks (the first one, found at run time; none on a CPU that has them all).
  static const std::string lacked = [] {
    for (int i = 0; i < static_cast<int>(Isa::kCount); ++i)
      if (!CpuFeatures::host().has(static_cast<Isa>(i))) return std::string(isa_name(static_cast<Isa>(i)));
    return std::string();
  }();
  static const std::string lacked_line = "--isa \"" + lacked + "\": this CPU does not have it (it has scalar";
  if (!lacked.empty()) {
    add("IsaTheCpuLacks", 2, lacked_line.c_str(), [](const Ctx& x) { return x.gen("--isa " + lacked); });
    add("InfoCpuIsaTheCpuLacks", 2, lacked_line.c_str(), [](const Ctx&) { return "info --cpu --isa " + lacked; });
  }
  add("InfoIsaWithoutCpu", 2, "--isa scalar: only with --cpu", [](const Ctx& x) { return "info --model " + q(x.model) + " --isa scalar"; });
  // ---- single files (the layout resolver): the files are the independent writer's, renamed
  const std::string kBfl = "tiny-flux2-bfl.safetensors", kAio = "tiny-flux2-all-in-one.safetensors";
  const std::string kLdm = "tiny-flux2-vae-ldm.safetensors";
  add("SingleFileWrongPrefix", 1, "not a FLUX.2 [klein] component: it looks like", [=](const Ctx& x) {
    // "diffusion_model." is no prefix ComfyUI writes: the names are in no known scheme.
    const fs::path p = single_copy(x, "tiny-flux2-bfl-comfy.safetensors", [](const std::string& n) {
      return n.substr(std::string("model.").size());
    });
    return "generate -q --prompt a -o " + q(x.out) + " --model " + q(p);
  }, "no known naming scheme");
  add("AllInOneWithoutVae", 1, "no VAE: --model", [=](const Ctx& x) {
    const fs::path p = single_copy(x, kAio, [](const std::string& n) { return n.starts_with("vae.") ? "" : n; });
    return "generate -q --prompt a -o " + q(x.out) + " --model " + q(p);
  }, "--vae FILE");
  add("InfoAllInOneWithoutVae", 1, "vae: missing: no VAE", [=](const Ctx& x) {
    const fs::path p = single_copy(x, kAio, [](const std::string& n) { return n.starts_with("vae.") ? "" : n; });
    return "info --model " + q(p);
  });
  add("MismatchedTextEncoder", 2, "wrong pairing: transformer", [=](const Ctx& x) {
    return "generate -q --prompt a -o " + q(x.out) + " --model " + q(data_dir() / "single_file" / kBfl) +
           " --vae " + q(data_dir() / "single_file" / kLdm) + " --text-encoder " + q(wide_qwen3(x));
  }, "gives 3 x 32 = 96");
  add("MismatchedVae", 2, "wrong pairing: VAE", [=](const Ctx& x) {
    // The folder's VAE, told it has 16 latent channels, beside a transformer file taking 128.
    edit_json(x.file("vae/config.json"), [](auto& j) { j["latent_channels"] = 16; });
    return x.gen("--diffusion-model " + q(data_dir() / "single_file" / kBfl));
  }, "takes 128");
  add("VariantDistilledOverBaseFolder", 2, "--variant distilled", [](const Ctx& x) {
    edit_json(x.file("model_index.json"), [](auto& j) { j["is_distilled"] = false; });
    return x.gen("--variant distilled");
  }, "says is_distilled false");
  add("Flux1Transformer", 1, "it looks like FLUX.1 transformer, BFL names", [=](const Ctx& x) {
    // FLUX.1 modulates per block (double_blocks.N.img_mod) where FLUX.2 shares its modulations.
    const fs::path p = single_copy(x, kBfl, [](const std::string& n) {
      if (n == "double_stream_modulation_img.lin.weight") return std::string("double_blocks.0.img_mod.lin.weight");
      if (n == "single_stream_modulation.lin.weight") return std::string("single_blocks.0.modulation.lin.weight");
      return n;
    });
    return x.gen("--diffusion-model " + q(p));
  });
  add("VaeNotSafetensors", 2, "--vae", [=](const Ctx& x) { return x.gen("--vae " + x.img("jpg_444.jpg")); },
      "expected a .safetensors or .gguf file");
  add("TransformerGivenAsVae", 2, "--vae", [=](const Ctx& x) {
    return x.gen("--vae " + q(data_dir() / "single_file" / kBfl));
  }, "expected a VAE, but the file holds FLUX.2-architecture transformer");
  add("InfoVaeFolderMissing", 1, "component folder \"vae\" is missing", [](const Ctx& x) {
    fs::remove_all(x.file("vae"));
    return "info --model " + q(x.model);
  });
  add("DecodeLatentsZeroSize", 2, "z.npy: shape [1, 128, 0, 4]", [](const Ctx& x) {
    write_raw_npy(x.dir / "z.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 0, 4), }", "");
    return "decode --model " + q(x.model) + " -q --latents " + q(x.dir / "z.npy") + " -o " + q(x.out);
  });
  const std::string kToOut = "single_transformer_blocks.0.attn.to_out.weight";  // [32, 128]
  auto quant_cfg = [](const Ctx& x, nlohmann::json qz) {
    edit_json(x.file("transformer/config.json"), [&](auto& j) { j["quantization"] = qz; });
  };
  add("QuantConfigQ8OverBf16", 1, "transformer/config.json: \"quantization\" says q8", [=](const Ctx& x) {
    quant_cfg(x, {{"type", "q8"}, {"kept", nlohmann::json::array()}});
    return x.gen();
  }, "'context_embedder.weight'");
  add("QuantConfigMlxOverBf16", 1, "transformer/config.json: \"quantization\" says MLX 4-bit", [=](const Ctx& x) {
    quant_cfg(x, {{"group_size", 64}, {"bits", 4}});
    return x.gen();
  }, "no weight is quantized");
  add("QuantConfigUnknownType", 1, "transformer/config.json: \"quantization\" type \"q3\"", [=](const Ctx& x) {
    quant_cfg(x, {{"type", "q3"}});
    return x.gen();
  });
  add("QuantConfigMxfp4", 1, "\"mode\" \"mxfp4\": unknown scheme", [=](const Ctx& x) {
    quant_cfg(x, {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}});
    return x.gen();
  });
  add("QuantConfigOtherBits", 1, "says 8-bit with groups of 64", [=](const Ctx& x) {
    st_make_mlx(x.file(kDit), kToOut, 4, 64);
    quant_cfg(x, {{"group_size", 64}, {"bits", 8}});
    return x.gen();
  }, "'single_transformer_blocks.0.attn.to_out.weight'");
  add("QuantConfigOtherGroup", 1, "says 4-bit with groups of 32", [=](const Ctx& x) {
    st_make_mlx(x.file(kDit), kToOut, 4, 64);
    quant_cfg(x, {{"group_size", 32}, {"bits", 4}});
    return x.gen();
  }, "'single_transformer_blocks.0.attn.to_out.weight'");
  add("QuantConfigQ4OverQ8Name", 1, "says q8", [=](const Ctx& x) {
    st_make_mlx(x.file(kDit), kToOut, 4, 64);
    quant_cfg(x, {{"type", "q8"}});
    return x.gen();
  }, "MLX-packed");
  add("Mlx8BitGroups32", 1, "'single_transformer_blocks.0.attn.to_out.weight': MLX 8-bit with groups of 32", [=](const Ctx& x) {
    st_make_mlx(x.file(kDit), kToOut, 8, 32);
    return x.gen();
  }, "4-bit with groups of 64");
  add("Mlx8BitGroups32WithConfig", 1, "MLX 8-bit with groups of 32 (as ", [=](const Ctx& x) {
    st_make_mlx(x.file(kDit), kToOut, 8, 32);
    quant_cfg(x, {{"group_size", 32}, {"bits", 8}});
    return x.gen();
  }, "transformer/config.json");
  // ---- weights
  // ---- mflux packs (tests/data/mflux, written by mlx), copied into the case's folder
  auto mflux_pack = [](const Ctx& x) {
    fs::copy(data_dir() / "mflux" / "q4", x.dir / "pack", fs::copy_options::recursive);
    return "generate --model pack -W 32 -H 32 --steps 1 -q -o out/x.png --prompt hi";
  };
  add("MfluxShardMissing", 1, "1.safetensors", [=](const Ctx& x) {
    const std::string args = mflux_pack(x);
    fs::remove(x.dir / "pack" / "transformer" / "1.safetensors");
    return args;
  }, "transformer");
  add("MfluxScalesMissing", 1, "'x_embedder.weight' is a quantized weight, but its companion 'x_embedder.scales' is missing", [=](const Ctx& x) {
    const std::string args = mflux_pack(x);
    const fs::path dir = x.dir / "pack" / "transformer";
    for (const char* shard : {"0.safetensors", "1.safetensors"}) {
      StFile f = st_read(dir / shard);
      auto h = nlohmann::json::parse(f.header);
      h.erase("x_embedder.scales");
      st_write(dir / shard, h.dump(), f.data);
    }
    fs::remove(dir / "model.safetensors.index.json");  // the shards alone
    return args;
  }, "1.safetensors");
  add("DitWeightsMissing", 1, "transformer", [](const Ctx& x) { fs::remove(x.file(kDit)); return x.gen(); });
  add("DitTruncated", 1, kDit.c_str(), [](const Ctx& x) {
    const std::string s = slurp_file(x.file(kDit));
    spit_file(own(x.file(kDit)), s.substr(0, s.size() / 2));
    return x.gen();
  });
  add("DitHeaderLengthHuge", 1, kDit.c_str(), [](const Ctx& x) {
    std::string s = slurp_file(own(x.file(kDit)));
    s[6] = '\x7f';
    spit_file(x.file(kDit), s);
    return x.gen();
  });
  add("DitHeaderNotJson", 1, kDit.c_str(), [](const Ctx& x) {
    StFile f = st_read(own(x.file(kDit)));
    f.header[0] = '[';
    st_write(x.file(kDit), f.header, f.data);
    return x.gen();
  });
  add("DitDuplicateTensor", 1, "'x_embedder.weight' is named twice", [](const Ctx& x) {
    StFile f = st_read(own(x.file(kDit)));
    auto h = nlohmann::json::parse(f.header);
    const std::string dup = "\"x_embedder.weight\":" + h["x_embedder.weight"].dump();
    st_write(x.file(kDit), "{" + dup + "," + f.header.substr(1), f.data);
    return x.gen();
  });
  add("DitTensorMissing", 1, "'proj_out.weight'", [](const Ctx& x) { st_edit(x.file(kDit), [](auto& h) { h.erase("proj_out.weight"); }); return x.gen(); });
  add("DitTensorShape", 1, "'context_embedder.weight'", [](const Ctx& x) {
    st_edit(x.file(kDit), [](auto& h) { h["context_embedder.weight"]["shape"] = {48, 32}; });
    return x.gen();
  });
  add("DitUnknownDtype", 1, "'x_embedder.weight'", [](const Ctx& x) { st_edit(x.file(kDit), [](auto& h) { h["x_embedder.weight"]["dtype"] = "Q9"; }); return x.gen(); });
  add("DitI64Weight", 1, "'context_embedder.weight'", [](const Ctx& x) {
    st_edit(x.file(kDit), [](auto& h) { h["context_embedder.weight"]["dtype"] = "I64"; h["context_embedder.weight"]["shape"] = {32, 12}; });
    return x.gen();
  });
  add("DitOffsetsOutOfBounds", 1, "'x_embedder.weight'", [](const Ctx& x) {
    st_edit(x.file(kDit), [](auto& h) { h["x_embedder.weight"]["data_offsets"] = {uint64_t{1} << 62, (uint64_t{1} << 62) + 8192}; });
    return x.gen();
  });
  add("DitShapeHuge", 1, "'x_embedder.weight'", [](const Ctx& x) {
    st_edit(x.file(kDit), [](auto& h) { h["x_embedder.weight"]["shape"] = {uint64_t{1} << 40, uint64_t{1} << 40}; });
    return x.gen();
  });
  add("DitOverlap", 1, "overlap", [](const Ctx& x) {
    st_edit(x.file(kDit), [](auto& h) { h["context_embedder.weight"]["data_offsets"] = h["x_embedder.weight"]["data_offsets"]; h["context_embedder.weight"]["shape"] = h["x_embedder.weight"]["shape"]; });
    return x.gen();
  });
  add("DitExtraTensor", 1, "'extra.weight'", [](const Ctx& x) {
    st_edit(x.file(kDit), [](auto& h) { h["extra.weight"] = h["x_embedder.weight"]; });
    return x.gen();
  });
  add("DitNaNInNorm", 1, "'single_transformer_blocks.0.attn.norm_q.weight'", [](const Ctx& x) {
    st_poke_bf16(x.file(kDit), "single_transformer_blocks.0.attn.norm_q.weight", 3, kBf16NaN);
    return x.gen();
  });
  add("DitInfInMatrix", 1, "'proj_out.weight'", [](const Ctx& x) { st_poke_bf16(x.file(kDit), "proj_out.weight", 5, kBf16Inf); return x.gen(); });
  add("TeNaNInMatrix", 1, "'model.layers.3.mlp.down_proj.weight'", [](const Ctx& x) {
    st_poke_bf16(x.file(kTe), "model.layers.3.mlp.down_proj.weight", 0, kBf16NaN);
    return x.gen();
  });
  add("TeNaNInMatrixAndUnusedLayer", 1, "'model.layers.3.mlp.down_proj.weight'", [](const Ctx& x) {
    st_poke_bf16(x.file(kTe), "model.layers.28.mlp.down_proj.weight", 0, kBf16NaN);  // never read: not named
    st_poke_bf16(x.file(kTe), "model.layers.3.mlp.down_proj.weight", 0, kBf16NaN);
    return x.gen();
  });
  add("TeNaNInNorm", 1, "'model.layers.0.input_layernorm.weight'", [](const Ctx& x) {
    st_poke_bf16(x.file(kTe), "model.layers.0.input_layernorm.weight", 1, kBf16NaN);
    return x.gen();
  });
  add("VaeNaNInConv", 1, "'decoder.conv_out.weight'", [](const Ctx& x) { st_poke_bf16(x.file(kVae), "decoder.conv_out.weight", 7, kBf16NaN); return x.gen(); });
  add("VaeNaNInBias", 1, "'decoder.conv_in.bias'", [](const Ctx& x) { st_poke_bf16(x.file(kVae), "decoder.conv_in.bias", 0, kBf16NaN); return x.gen(); });
  add("VaeEncoderNaNWithRef", 1, "'encoder.conv_in.weight'", [](const Ctx& x) {
    st_poke_bf16(x.file(kVae), "encoder.conv_in.weight", 4, kBf16NaN);
    return x.gen("--ref " + x.img("size_64x64.png"));
  });
  add("VaeTensorMissing", 1, "'decoder.conv_out.weight'", [](const Ctx& x) { st_edit(x.file(kVae), [](auto& h) { h.erase("decoder.conv_out.weight"); }); return x.gen(); });
  // ---- non-finite attention (issue 41)
  // A NaN / Inf that reaches only the attention scores (a Q or K projection) used to become a
  // masked key, so the run exited 0 with a wrong image; now the softmax propagates it and the
  // output check names the weight, in both precisions. Quantized weights can only carry it in
  // their scales / biases, which load checks; scales that pass load but overflow the products
  // fail at run time naming the component.
  auto gen_fast = [](const Ctx& x) { return x.gen("--precision fast"); };
  auto encode = [](const Ctx& x, const std::string& extra) {
    return "encode --model " + q(x.model) + " -q --prompt a -o " + q(x.dir / "out" / "e.npy") + " " + extra;
  };
  // The tiny model quantized by `klein quantize --type type` into dir/type, as the context of a
  // case. q4 quantizes a copy of it whose text encoder and transformer are tiny_q4's (Linear
  // inputs of 64, so that q4 quantizes their attention projections).
  auto quantized = [](const Ctx& x, const std::string& type) {
    fs::path src = tiny_model_dir();
    if (type == "q4") {
      src = x.dir / "tiny_q4_full";
      fs::copy(tiny_model_dir(), src, fs::copy_options::recursive);
      for (const char* comp : {"text_encoder", "transformer"})
        fs::copy(data_dir() / "tiny_q4" / comp, src / comp,
                 fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    }
    Ctx y = x;
    y.model = x.dir / type;
    const CliResult r = run_cli("quantize -q --model " + q(src) + " --type " + type + " -o " + q(y.model));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return y;
  };
  const std::string q_blk0 = "transformer_blocks.0.attn.";
  add("DitNaNInToQ", 1, "'transformer_blocks.0.attn.to_q.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kDit), q_blk0 + "to_q.weight", 5, kBf16NaN);
    return x.gen();
  });
  add("DitNaNInToKFast", 1, "'transformer_blocks.1.attn.to_k.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kDit), "transformer_blocks.1.attn.to_k.weight", 40, kBf16NaN);
    return gen_fast(x);
  });
  add("DitInfInAddQProj", 1, "'transformer_blocks.0.attn.add_q_proj.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kDit), q_blk0 + "add_q_proj.weight", 7, kBf16Inf);
    return x.gen();
  });
  add("DitNegInfInAddKProjFast", 1, "'transformer_blocks.0.attn.add_k_proj.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kDit), q_blk0 + "add_k_proj.weight", 3, kBf16NegInf);
    return gen_fast(x);
  });
  add("DitNaNInSingleBlockQFast", 1, "'single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kDit), "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight", 1, kBf16NaN);  // row 0: q
    return gen_fast(x);
  });
  add("TeNaNInQProj", 1, "'model.layers.2.self_attn.q_proj.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kTe), "model.layers.2.self_attn.q_proj.weight", 4, kBf16NaN);
    return x.gen();
  });
  add("EncodeTeInfInKProjFast", 1, "'model.layers.7.self_attn.k_proj.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kTe), "model.layers.7.self_attn.k_proj.weight", 1, kBf16Inf);
    return encode(x, "--precision fast");
  });
  add("DitQ8NaNScale", 1, "'transformer_blocks.0.attn.to_q.weight_scale'", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q8");
    st_poke_f32(y.file(kDit), q_blk0 + "to_q.weight_scale", 3, std::numeric_limits<float>::quiet_NaN());
    return y.gen();
  });
  add("DitQ8ScaleOverflowsItsWeight", 1, "'transformer_blocks.0.attn.to_k.weight_scale'", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q8");
    st_poke_f32(y.file(kDit), q_blk0 + "to_k.weight_scale", 0, 1e37f);  // 127 · 1e37 is past float32
    return gen_fast(y);
  });
  // Finite scales whose weights are representable, but whose products are not.
  auto huge_scales = [](const fs::path& file, const std::string& tensor, float s) {
    const int64_t rows = nlohmann::json::parse(st_read(file).header)[tensor]["shape"][0].get<int64_t>();
    for (int64_t r = 0; r < rows; ++r) st_poke_f32(file, tensor, r, s);
  };
  add("DitQ8HugeScale", 1, "transformer produced non-finite values", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q8");
    huge_scales(y.file(kDit), q_blk0 + "to_k.weight_scale", 2.5e36f);
    return y.gen();
  });
  add("DitQ8HugeScaleFast", 1, "transformer produced non-finite values", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q8");
    huge_scales(y.file(kDit), q_blk0 + "add_q_proj.weight_scale", 2.5e36f);
    return gen_fast(y);
  });
  add("EncodeTeQ8HugeScaleFast", 1, "text encoder produced non-finite values", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q8");
    huge_scales(y.file(kTe), "model.layers.4.self_attn.q_proj.weight_scale", 2.5e36f);
    return encode(y, "--precision fast");
  });
  add("DitQ4NaNScale", 1, "'transformer_blocks.0.attn.to_q.scales'", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q4");
    st_poke_bf16(y.file(kDit), q_blk0 + "to_q.scales", 0, kBf16NaN);
    return gen_fast(y);
  });
  add("DitQ4InfBias", 1, "'transformer_blocks.1.attn.add_k_proj.biases'", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q4");
    st_poke_bf16(y.file(kDit), "transformer_blocks.1.attn.add_k_proj.biases", 9, kBf16Inf);
    return y.gen();
  });
  add("DitQ4HugeScalesFast", 1, "transformer produced non-finite values", [=](const Ctx& x) {
    const Ctx y = quantized(x, "q4");
    for (int64_t i = 0; i < 64; ++i) st_poke_bf16(y.file(kDit), q_blk0 + "to_q.scales", i, kBf16Huge);  // [64, 1]
    return gen_fast(y);
  });
  // ---- tokenizer
  add("TokenizerJsonMissing", 1, "tokenizer", [](const Ctx& x) { fs::remove(x.file("tokenizer/tokenizer.json")); return x.gen(); });
  add("TokenizerNotJson", 1, "tokenizer.json", [](const Ctx& x) { spit_file(own(x.file("tokenizer/tokenizer.json")), "{\"model\": "); return x.gen(); });
  add("TokenizerNoModel", 1, "tokenizer.json", [](const Ctx& x) { spit_file(own(x.file("tokenizer/tokenizer.json")), "{\"version\": \"1.0\"}"); return x.gen(); });
  add("TokenizerFolderMissing", 1, "tokenizer", [](const Ctx& x) { fs::remove_all(x.file("tokenizer")); return x.gen(); });
  // ---- reference images
  add("RefMissing", 1, "nothere.png", [](const Ctx& x) { return x.gen("--ref " + q(x.dir / "nothere.png")); });
  add("RefNotAnImage", 1, "bad_not_an_image.png", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_not_an_image.png")); });
  add("RefTruncatedPng", 1, "bad_truncated.png", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_truncated.png")); });
  add("RefTruncatedJpeg", 1, "bad_truncated.jpg", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_truncated.jpg")); });
  add("RefTruncatedWebp", 1, "bad_truncated.webp", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_truncated.webp")); });
  add("RefHugeHeaderPng", 2, "bad_huge_header.png", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_huge_header.png")); });
  add("RefHugeHeaderJpeg", 2, "bad_huge_header.jpg", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_huge_header.jpg")); });
  add("RefEmpty", 1, "bad_empty.jpg", [](const Ctx& x) { return x.gen("--ref " + x.img("bad_empty.jpg")); });
  add("RefIsAFolder", 2, "refdir", [](const Ctx& x) { fs::create_directory(x.dir / "refdir"); return x.gen("--ref " + q(x.dir / "refdir")); });
  // ---- .npy noise
  auto noise = [](const Ctx& x, const std::string& dict, const std::string& data) {
    write_raw_npy(x.dir / "n.npy", dict, data);
    return x.gen_no_prompt("--prompt hi --noise " + q(x.dir / "n.npy"));
  };
  const std::string f32x512(512 * 4, '\0');
  add("NoiseMissing", 1, "none.npy", [](const Ctx& x) { return x.gen("--noise " + q(x.dir / "none.npy")); });
  add("NoiseBadMagic", 1, "n.npy", [](const Ctx& x) { spit_file(x.dir / "n.npy", "PK\x03\x04 not a npy"); return x.gen("--noise " + q(x.dir / "n.npy")); });
  add("NoiseShape23Digits", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (12345678901234567890123,), }", f32x512); });
  add("NoiseShapeHuge", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }", f32x512); });
  add("NoiseShapeOverflow", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 1000000000000, 1000000000000), }", f32x512); });
  add("NoiseWrongShape", 2, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 4, 1), }", f32x512); });
  add("NoiseNaN", 2, "n.npy", [=](const Ctx& x) {
    std::string d = f32x512;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(d.data() + 40, &nan, 4);
    return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 2, 2), }", d);
  });
  add("NoiseTruncated", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 2, 2), }", f32x512.substr(0, 100)); });
  add("NoiseFortran", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 128, 2, 2), }", f32x512); });
  add("NoiseComplex", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<c8', 'fortran_order': False, 'shape': (1, 128, 2, 2), }", f32x512 + f32x512); });
  add("NoiseShapeLetters", 1, "n.npy", [=](const Ctx& x) { return noise(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, x), }", f32x512); });
  // ---- klein decode: latents from a .npy
  auto decode = [](const Ctx& x, const std::string& dict, const std::string& data) {
    write_raw_npy(x.dir / "z.npy", dict, data);
    return "decode --model " + q(x.model) + " -q --latents " + q(x.dir / "z.npy") + " -o " + q(x.out);
  };
  add("DecodeLatentsMissing", 1, "none.npy", [](const Ctx& x) { return "decode --model " + q(x.model) + " -q --latents " + q(x.dir / "none.npy") + " -o " + q(x.out); });
  add("DecodeLatentsWrongChannels", 2, "z.npy", [=](const Ctx& x) { return decode(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 32, 4, 4), }", f32x512); });
  add("DecodeLatentsNaN", 2, "z.npy", [=](const Ctx& x) {
    std::string d = f32x512;
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(d.data() + 44, &inf, 4);
    return decode(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 2, 2), }", d);
  });
  add("DecodeOutIsLatents", 2, "-o", [=](const Ctx& x) {
    write_raw_npy(x.dir / "out" / "z.png", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 2, 2), }", f32x512);
    return "decode --model " + q(x.model) + " -q --latents " + q(x.dir / "out" / "z.png") + " -o " + q(x.dir / "out" / "z.png");
  });
  add("DecodeVaeNaN", 1, "'decoder.conv_out.weight'", [=](const Ctx& x) {
    st_poke_bf16(x.file(kVae), "decoder.conv_out.weight", 7, kBf16NaN);
    return decode(x, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128, 2, 2), }", f32x512);
  });
  // ---- options
  add("SeedNegative", 2, "--seed", [](const Ctx& x) { return x.gen("--seed -1"); });
  add("SeedTwoTo64", 2, "--seed", [](const Ctx& x) { return x.gen("--seed 18446744073709551616"); });
  add("SeedText", 2, "--seed", [](const Ctx& x) { return x.gen("--seed 12ab"); });
  add("SeedEmpty", 2, "--seed", [](const Ctx& x) { return x.gen("--seed ''"); });
  add("SeedAndNoise", 2, "--noise", [](const Ctx& x) { return x.gen("--seed 1 --noise " + q(x.dir / "n.npy")); });
  add("Steps0", 2, "--steps", [](const Ctx& x) { return x.gen("--steps 0"); });
  add("Width8", 2, "--width", [](const Ctx& x) { return x.gen("-W 8"); });
  add("ThreadsNegative", 2, "--threads", [](const Ctx& x) { return x.gen("--threads -1"); });
  add("MemoryHuge", 2, "--memory", [](const Ctx& x) { return x.gen("--memory huge"); });
  add("IsaUnknown", 2, "isa", [](const Ctx& x) { return x.gen("--isa avx9000"); });
  add("NoPrompt", 2, "--prompt", [](const Ctx& x) { return x.gen_no_prompt(""); });
  add("PromptAndPromptFile", 2, "--prompt", [](const Ctx& x) { spit_file(x.dir / "p.txt", "a cat"); return x.gen("--prompt-file " + q(x.dir / "p.txt")); });
  add("PromptFileMissing", 1, "--prompt-file", [](const Ctx& x) { return x.gen_no_prompt("--prompt-file " + q(x.dir / "nope.txt")); });
  add("PromptFileNotUtf8", 2, "--prompt-file", [](const Ctx& x) { spit_file(x.dir / "p.txt", "caf\xe9 au lait"); return x.gen_no_prompt("--prompt-file " + q(x.dir / "p.txt")); });
  add("PromptFileIsAFolder", 2, "--prompt-file", [](const Ctx& x) { return x.gen_no_prompt("--prompt-file " + q(x.dir)); });
  add("DumpIsAFile", 1, "dumpfile", [](const Ctx& x) { spit_file(x.dir / "dumpfile", "x"); return x.gen("--dump " + q(x.dir / "dumpfile")); });
  // ---- output paths
  add("OutFolderMissing", 1, "-o", [](const Ctx& x) { return "generate --model " + q(x.model) + " -q --prompt a -o " + q(x.dir / "no" / "x.png"); });
  add("OutNotPng", 2, "-o", [](const Ctx& x) { return "generate --model " + q(x.model) + " -q --prompt a -o " + q(x.dir / "out" / "x.jpg"); });
  add("OutIsAFolder", 2, "-o", [](const Ctx& x) { fs::create_directory(x.dir / "out" / "d.png"); return "generate --model " + q(x.model) + " -q --prompt a -o " + q(x.dir / "out" / "d.png"); });
  add("OutIsTheRef", 2, "-o", [](const Ctx& x) {
    fs::copy_file(data_dir() / "images" / "size_64x64.png", x.out);
    return x.gen("--ref " + q(x.out));
  });
  add("OutIsTheRefViaDots", 2, "-o", [](const Ctx& x) {
    fs::copy_file(data_dir() / "images" / "size_64x64.png", x.out);
    return x.gen("--ref " + q(x.dir / "out" / ".." / "out" / "x.png"));
  });
  add("EncodeOutIsPromptFile", 2, "-o", [](const Ctx& x) {
    spit_file(x.dir / "out" / "p.npy", "a cat");
    return "encode --model " + q(x.model) + " -q --prompt-file " + q(x.dir / "out" / "p.npy") + " -o " + q(x.dir / "out" / "p.npy");
  });
  add("EncodeModelMissing", 1, "gone", [](const Ctx& x) { return "encode --model " + q(x.dir / "gone") + " -q --prompt a -o " + q(x.dir / "out" / "e.npy"); });
  add("EncodeTeNaN", 1, "'model.layers.5.mlp.up_proj.weight'", [](const Ctx& x) {
    st_poke_bf16(x.file(kTe), "model.layers.5.mlp.up_proj.weight", 2, kBf16NaN);
    return "encode --model " + q(x.model) + " -q --prompt a -o " + q(x.dir / "out" / "e.npy");
  });
  add("TokenizeModelMissing", 1, "gone", [](const Ctx& x) { return "tokenize --model " + q(x.dir / "gone") + " hi"; });
  add("InfoVaeConfigNotJson", 1, "vae/config.json", [](const Ctx& x) {
    spit_file(own(x.file("vae/config.json")), "{\"in_channels\": 3,,}");
    return "info --model " + q(x.model);
  });
  // ---- CLI (issue 41): misspelt names get the nearest valid one; relative paths (from the
  // case's folder) are checked as absolute ones are.
  add("TypoCommand", 2, "unknown command 'genrate'; did you mean 'generate'?", [](const Ctx& x) {
    return "genrate --model " + q(x.model) + " -q --prompt a -o " + q(x.out);
  });
  add("UnknownCommand", 2, "unknown command 'paint'", [](const Ctx& x) { return "paint -o " + q(x.out); });
  add("TypoOption", 2, "unknown option '--seeed' for 'generate'; did you mean '--seed'?", [](const Ctx& x) { return x.gen("--seeed 3"); });
  add("TypoOptionBeforeMissingOutput", 2, "did you mean '--seed'?", [](const Ctx& x) {
    return "generate --model " + q(x.model) + " -q --prompt a --sede 3";  // no -o: the typo is the error
  });
  add("TypoOptionWithValue", 2, "did you mean '--steps'?", [](const Ctx& x) { return x.gen("--setps=2"); });
  add("TypoQuantizeOption", 2, "unknown option '--tpye' for 'quantize'; did you mean '--type'?", [](const Ctx&) {
    return "quantize --model model --tpye q8 -o out/q8";
  });
  add("TypoTopLevelOption", 2, "did you mean '--version'?", [](const Ctx&) { return "--verison"; });
  add("RelOutFolderMissing", 1, "output folder nope does not exist", [](const Ctx&) {
    return "generate --model model -q --prompt a -o nope/x.png";
  });
  add("RelEncodeOutFolderMissing", 1, "-o nope/e.npy", [](const Ctx&) { return "encode --model model -q --prompt a -o nope/e.npy"; });
  add("RelOutIsTheRef", 2, "-o out/x.png: is the --ref input", [](const Ctx& x) {
    fs::copy_file(data_dir() / "images" / "size_64x64.png", x.out);
    return "generate --model model -W 32 -H 32 --steps 1 -q --prompt a -o out/x.png --ref ./out/../out/x.png";
  });
  add("RelQuantizeOutIsInput", 2, "is the input folder", [](const Ctx&) { return "quantize --model model --type q8 -q -o model/"; });
  add("RelQuantizeOutInsideInput", 2, "inside the input folder", [](const Ctx&) { return "quantize --model model --type q8 -q -o model/q8"; });
  add("RelQuantizeParentMissing", 1, "-o nope/q8: its parent folder does not exist", [](const Ctx&) {
    return "quantize --model model --type q8 -q -o nope/q8";
  });
  // A bare name is in the working folder: the error is the model's, not "no parent folder".
  add("RelQuantizeBareOutBadModel", 1, "model_index.json", [](const Ctx& x) {
    fs::remove(x.file("model_index.json"));
    return "quantize --model model --type q8 -q -o q8";
  });
  return c;
}

class BadInput : public ::testing::TestWithParam<Case> {};

// Files in `dir` (recursively) other than those in the model copy.
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> r;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp") != std::string::npos) r.push_back(e.path().string());
  }
  return r;
}

TEST_P(BadInput, NamesTheCulpritAndLeavesNothing) {
  const Case& k = GetParam();
  Ctx x;
  x.dir = make_temp_dir(std::string("bad_") + k.name);
  x.model = scratch_model(x.dir);
  fs::create_directory(x.dir / "out");
  x.out = x.dir / "out" / "x.png";
  const std::string args = k.setup(x);
  // What is in out/ before the run (an input placed there on purpose) must be there unchanged after.
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(x.dir / "out"))
    if (e.is_regular_file()) before[e.path().filename().string()] = slurp_file(e.path());
  const CliResult r = run_cli(args, x.dir);  // from the scratch folder: relative paths stay inside it
  const std::string first = r.err.substr(0, r.err.find('\n'));
  EXPECT_EQ(r.exit_code, k.exit_code) << args << "\n" << r.err;
  EXPECT_TRUE(first.starts_with("klein: ")) << r.err;
  EXPECT_NE(first.find(k.first_line_has), std::string::npos) << "first stderr line: " << first;
  if (k.also) EXPECT_NE(first.find(k.also), std::string::npos) << "first stderr line: " << first;
  std::map<std::string, std::string> after;
  for (const auto& e : fs::directory_iterator(x.dir / "out"))
    after[e.path().filename().string()] = e.is_regular_file() ? slurp_file(e.path()) : "<dir>";
  for (auto& [n, v] : before) EXPECT_EQ(after[n], v) << "input " << n << " changed";
  for (auto& [n, v] : after)
    if (!before.count(n) && v != "<dir>") ADD_FAILURE() << "left behind: " << n;
  EXPECT_TRUE(leftovers(x.dir).empty()) << leftovers(x.dir)[0];
  fs::remove_all(x.dir);
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadInput, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(BadInput, CorpusHasAtLeastSixtyCases) { EXPECT_GE(cases().size(), 60u); }

}  // namespace
}  // namespace klein::testing
