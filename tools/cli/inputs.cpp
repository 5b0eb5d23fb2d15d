// Option values the CLI checks itself: seeds, prompt files, output paths that would overwrite an
// input (each error names the option), the load options as the library checks them; the note on
// --precision fp32 with quantized weights.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <CLI/CLI.hpp>

#include "common.h"

namespace fs = std::filesystem;

namespace klein::cli {

Status parse_seed(const std::string& text, uint64_t* seed) {
  // CLI11 would read "-1" as 2^64-1 and saturate 2^64: only plain decimal digits in range pass.
  const Status bad = invalid_argument("--seed " + text + ": expected an integer from 0 to 18446744073709551615");
  if (text.empty() || text.size() > 20) return bad;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return bad;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return bad;
    v = v * 10 + d;
  }
  *seed = v;
  return Status::Ok();
}

namespace {
// The byte offset of the first invalid UTF-8 sequence, or npos.
size_t invalid_utf8_at(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return i;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return i;
    i += len;
  }
  return std::string::npos;
}
}  // namespace

Status read_prompt_file(const std::string& path, std::string* prompt) {
  constexpr size_t kMax = size_t{16} << 20;  // far above any prompt the 512-token encoder reads
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::error_code ec;
    if (fs::is_directory(path, ec)) return invalid_argument("--prompt-file " + path + ": is a folder");
    std::ifstream f(path, std::ios::binary);
    if (!f) return not_found("--prompt-file " + path + ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  const std::string what = "--prompt-file " + (path == "-" ? std::string("- (stdin)") : path);
  if (text.size() > kMax) return invalid_argument(what + ": larger than 16 MiB");
  if (const size_t at = invalid_utf8_at(text); at != std::string::npos)
    return invalid_argument(what + ": not UTF-8 text (invalid byte at offset " + std::to_string(at) + ")");
  // One trailing newline is the file's, not the prompt's (editors add it).
  if (text.ends_with("\r\n")) text.resize(text.size() - 2);
  else if (text.ends_with("\n")) text.pop_back();
  *prompt = std::move(text);
  return Status::Ok();
}

Status resolve_prompt(const std::string& prompt, bool prompt_given, const std::string& prompt_file,
                      std::string* out) {
  if (prompt_given && !prompt_file.empty())
    return invalid_argument("--prompt and --prompt-file: give one of them, not both");
  if (!prompt_file.empty()) return read_prompt_file(prompt_file, out);
  if (!prompt_given) return invalid_argument("--prompt: required (or --prompt-file FILE, '-' for stdin)");
  *out = prompt;
  return Status::Ok();
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  return fs::weakly_canonical(fs::absolute(a), ec) == fs::weakly_canonical(fs::absolute(b), ec);
}

Status check_output_path(const std::string& option, const std::string& out,
                         const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [opt, in] : inputs)
    if (!in.empty() && same_file(out, in))
      return invalid_argument(option + " " + out + ": is the " + opt + " input " + in + "; refusing to overwrite an input");
  std::error_code ec;
  if (fs::is_directory(out, ec)) return invalid_argument(option + " " + out + ": is a folder");
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    return not_found(option + " " + out + ": output folder " + parent.string() + " does not exist");
  return Status::Ok();
}

std::string default_model_dir() {
  const std::string source_tree = std::string(KLEIN_SOURCE_DIR) + "/tests/data/tiny";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return source_tree;  // no /proc: only a build-folder binary can know where its model is
  const fs::path bin = exe.parent_path();
  if (fs::equivalent(bin, KLEIN_BUILD_BIN_DIR, ec)) return source_tree;
  return (bin / KLEIN_MODEL_FROM_BIN).lexically_normal().string();
}

void note_quantized_fp32(Precision precision, const std::function<Result<ModelInfo>()>& get_info) {
  if (precision != Precision::kFp32) return;
  auto info = get_info();
  if (!info.ok()) return;  // a note only; loading reports real problems
  std::string formats;
  for (const ComponentSummary& c : info->components) {
    if (c.name != "text_encoder" && c.name != "transformer") continue;
    for (const auto& d : c.by_dtype)
      if ((d.dtype == "Q8_ROW" || d.dtype == "Q4_G64") && formats.find(d.dtype) == std::string::npos)
        formats += (formats.empty() ? "" : " and ") + d.dtype;
  }
  if (!formats.empty())
    std::fprintf(stderr,
                 "note: %s weights under --precision fp32 are dequantized and computed in float32; "
                 "--precision fast runs them on the int8 kernels\n",
                 formats.c_str());
}

Status check_load_options_cli(const LoadOptions& options) {
  Status st = klein::check_load_options(options);
  if (st.ok()) return st;
  static const std::pair<const char*, const char*> kFlag[] = {
      {"threads ", "--threads "}, {"isa ", "--isa "}, {"vae_tile ", "--vae-tile "}, {"max_memory_gib ", "--max-memory "}};
  for (const auto& [field, flag] : kFlag)
    if (st.message().starts_with(field))
      return Status(st.code(), flag + st.message().substr(std::string_view(field).size()));
  return st;
}

void ModelArgs::add(CLI::App* s, const char* model_help) {
  s->add_option("--model,-m", model, model_help);
  // stable-diffusion.cpp's option names, so that its users' command lines carry over.
  s->add_option("--diffusion-model", diffusion_model,
                "Transformer (DiT) .safetensors or .gguf file: BFL / ComfyUI names (with or without "
                "'model.diffusion_model.'; ComfyUI-GGUF and stable-diffusion.cpp GGUFs) or diffusers names; replaces "
                "--model's or supplies it");
  s->add_option("--text-encoder", text_encoder,
                "Qwen3 text encoder .safetensors file (transformers names, e.g. ComfyUI's qwen_3_4b.safetensors) or "
                "llama.cpp .gguf (Qwen3-4B-*.gguf); replaces --model's or supplies it");
  s->add_option("--vae", vae,
                "VAE .safetensors or .gguf file (BFL ae.safetensors / ComfyUI flux2-vae LDM names, or diffusers names); replaces "
                "--model's or supplies it");
  s->add_option("--variant", variant,
                "distilled, base or kv: what single files hold (they do not say; a diffusers folder's "
                "model_index.json does). Default: distilled, with a note when a file name contains 'base'. base: "
                "classifier-free guidance (--guidance-scale, default 4.0) and 50 steps by default. kv: the 9B-KV "
                "editing distill (references run once, their keys and values cached for the later steps)")
      ->check(CLI::IsMember({"distilled", "base", "kv"}));
  s->add_option("--verify", verify,
                "Check the files against this manifest (from `klein manifest`) first: the same files, sizes and "
                "SHA-256; any difference is an error before anything loads");
}

void ModelArgs::apply(LoadOptions& lo) const {
  lo.diffusion_model = diffusion_model;
  lo.text_encoder = text_encoder;
  lo.vae = vae;
  lo.verify_manifest = verify;
  lo.variant = variant == "base"        ? Variant::kBase
               : variant == "distilled" ? Variant::kDistilled
               : variant == "kv"        ? Variant::kKv
                                        : Variant::kAuto;
}

void LoraArgs::add(CLI::App* s) {
  s->add_option("--lora", specs,
                "LoRA FILE[:SCALE] (repeatable, applied in order; SCALE default 1): safetensors from diffusers/PEFT, "
                "ai-toolkit / fal / ComfyUI (BFL names), kohya / musubi-tuner (lora_unet_, alpha) or LyCORIS "
                "(LoKr, LoHa); for the transformer and the text encoder");
  s->add_option("--lora-mode", mode,
                "How LoRAs apply: auto (default: merged into float weights at load, at run time beside quantized "
                "ones), merge (float weights only; no per-step cost), runtime (y += s*(x*A^T)*B^T beside each "
                "changed linear; CPU backend)")
      ->check(CLI::IsMember({"auto", "merge", "runtime"}));
}

Status LoraArgs::apply(LoadOptions& lo) const {
  for (const std::string& spec : specs) {
    // FILE[:SCALE]: a suffix after the last ':' that reads as a number is the scale.
    LoraSpec l{spec, 1.0f};
    const size_t colon = spec.rfind(':');
    if (colon != std::string::npos && colon + 1 < spec.size()) {
      const std::string tail = spec.substr(colon + 1);
      char* end = nullptr;
      const double v = std::strtod(tail.c_str(), &end);
      if (end != tail.c_str() && *end == '\0') {
        l.path = spec.substr(0, colon);
        l.scale = static_cast<float>(v);
        if (!std::isfinite(v) || std::fabs(v) > 100.0)
          return invalid_argument("--lora " + spec + ": the scale must be a number from -100 to 100");
      }
    }
    if (l.path.empty()) return invalid_argument("--lora " + spec + ": no file");
    lo.loras.push_back(std::move(l));
  }
  lo.lora_mode = mode == "merge" ? LoraMode::kMerge : mode == "runtime" ? LoraMode::kRuntime : LoraMode::kAuto;
  return Status::Ok();
}

std::string ModelArgs::path(bool default_tiny) const { return default_tiny && !any() ? default_model_dir() : model; }

Status ModelArgs::none_given(const char* command) {
  return invalid_argument(std::string(command) +
                          ": give --model (a diffusers folder or a safetensors / GGUF file) or --diffusion-model / "
                          "--text-encoder / --vae files");
}

void print_notes(const std::vector<std::string>& notes) {
  for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
}

BackendKind parse_backend(const std::string& name) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  return BackendKind::kAuto;
}

}  // namespace klein::cli
