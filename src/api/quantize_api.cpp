// The public quantize_model / compare_images / compare_arrays: thin wrappers over pipeline/, behind the catch-all.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "api/guard.h"
#include "api/layout.h"
#include "api/manifest.h"
#include "io/image_reader.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"
#include "klein/klein.h"
#include "pipeline/image_compare.h"
#include "pipeline/quantize_gguf.h"
#include "pipeline/quantize_model.h"
#include "pipeline/tokenizer.h"

namespace fs = std::filesystem;

namespace klein {

namespace {

Status write_text_file(const fs::path& p, std::string_view text) {
  std::ofstream f(p, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) return io_error(p.string() + ": write failed (disk full?)");
  return Status::Ok();
}

// The model that `l` resolves to, written as the diffusers folder quantize_model_folder reads:
// model_index.json, the scheduler and tokenizer, and each component's config.json and weights
// under diffusers / transformers names (BFL qkv split, halves swapped: what the models bind).
Status write_diffusers_folder(const api::Layout& l, const fs::path& dir) {
  KLEIN_RETURN_IF_ERROR(l.complete());
  const nlohmann::json index = {{"_class_name", "Flux2KleinPipeline"},
                                {"is_distilled", l.distilled},
                                {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                                {"text_encoder", {"transformers", "Qwen3ForCausalLM"}},
                                {"tokenizer", {"transformers", "Qwen2TokenizerFast"}},
                                {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
                                {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
  std::error_code ec;
  for (const char* sub : {"scheduler", "tokenizer", "text_encoder", "transformer", "vae"})
    if (fs::create_directories(dir / sub, ec); ec) return io_error((dir / sub).string() + ": cannot create (" + ec.message() + ")");
  KLEIN_RETURN_IF_ERROR(write_text_file(dir / "model_index.json", index.dump(2) + "\n"));
  KLEIN_RETURN_IF_ERROR(write_text_file(dir / "scheduler" / "scheduler_config.json", l.scheduler.dump(2) + "\n"));
  if (l.tokenizer.empty()) {
    KLEIN_RETURN_IF_ERROR(write_text_file(dir / "tokenizer" / "tokenizer.json", Tokenizer::builtin_json()));
  } else {
    if (fs::is_directory(l.tokenizer, ec)) fs::copy(l.tokenizer, dir / "tokenizer", fs::copy_options::recursive, ec);
    else fs::copy_file(l.tokenizer, dir / "tokenizer" / "tokenizer.json", ec);
    if (ec) return io_error(l.tokenizer.string() + ": cannot copy the tokenizer (" + ec.message() + ")");
  }
  for (const api::ComponentSlot* slot : {&l.text_encoder, &l.transformer, &l.vae}) {
    const api::ComponentSpec& spec = *slot->spec;
    const fs::path out = dir / spec.role;
    KLEIN_RETURN_IF_ERROR(write_text_file(out / "config.json", spec.config.dump(2) + "\n"));
    KLEIN_ASSIGN_OR_RETURN(auto src, spec.open());
    std::vector<Weight> held;  // swapped halves are copies the Weights own
    std::vector<TensorToWrite> tensors;
    for (const std::string& n : src->names()) {
      KLEIN_ASSIGN_OR_RETURN(Weight w, src->get(n));
      const bool plain = w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16 ||
                         w.dtype == DType::kI64;
      if (!plain || w.scales)
        return unsupported("quantize: " + src->file_of(n) + ": tensor '" + n + "' is already " +
                           std::string(w.format().name) + "; quantize from the full-precision files");
      held.push_back(std::move(w));
    }
    for (const Weight& w : held) tensors.push_back({w.name, w.dtype, w.shape, w.data});
    const char* file = spec.role == "text_encoder" ? "model.safetensors" : "diffusion_pytorch_model.safetensors";
    KLEIN_RETURN_IF_ERROR(write_safetensors(out / file, tensors));
  }
  return Status::Ok();
}

// --type gguf:<T>: the transformer of whatever `o` names as one GGUF file (pipeline/quantize_gguf.h).
Status quantize_to_gguf(const QuantizeOptions& o, const Callbacks& cb) {
  KLEIN_ASSIGN_OR_RETURN(DType type, parse_gguf_type(o.type));
  KLEIN_ASSIGN_OR_RETURN(GgufFlavor flavor, parse_gguf_flavor(o.flavor));
  if (!o.keep.empty()) return invalid_argument("--keep: not for --type gguf (the producer's rules decide what stays unquantized)");
  if (o.output.empty()) return invalid_argument("quantize: give the output .gguf file (-o)");
  std::error_code ec;
  const fs::path out = o.output;
  if (fs::exists(out, ec)) return invalid_argument("-o " + o.output + ": already exists; remove it or choose a new file");
  const fs::path parent = fs::absolute(out, ec).parent_path();
  if (!fs::is_directory(parent, ec)) return not_found("-o " + o.output + ": its folder does not exist");
  if (!out.has_filename()) return invalid_argument("-o " + o.output + ": give a file name (.gguf), not a folder");
  LoadOptions in;
  in.diffusion_model = o.diffusion_model;
  in.text_encoder = o.text_encoder;
  in.vae = o.vae;
  in.variant = o.variant;
  KLEIN_ASSIGN_OR_RETURN(auto layout, api::resolve_layout(api::layout_request(o.model, in)));
  if (!o.verify_manifest.empty()) KLEIN_RETURN_IF_ERROR(api::verify_layout(layout, o.verify_manifest, o.threads, cb.cancel));
  if (!layout.transformer.spec) return layout.transformer.error;
  KLEIN_ASSIGN_OR_RETURN(auto src, layout.transformer.spec->open());
  GgufDitSpec g;
  g.source = src;
  g.output = out;
  g.type = type;
  g.flavor = flavor;
  g.threads = o.threads;
  g.progress = cb.progress;
  g.cancel = cb.cancel;
  g.log = cb.log;
  return write_dit_gguf(g);
}

}  // namespace

Status quantize_model(const QuantizeOptions& o, const Callbacks& cb) {
  return api::guarded("quantize", [&]() -> Status {
    const bool files = !o.diffusion_model.empty() || !o.text_encoder.empty() || !o.vae.empty();
    if (o.model.empty() && !files)
      return invalid_argument("quantize: give the input model (--model, or --diffusion-model / --text-encoder / --vae)");
    if (o.threads < 0 || o.threads > kMaxThreads)
      return invalid_argument("quantize: threads " + std::to_string(o.threads) + ": expected 0 (all cores) to " +
                              std::to_string(kMaxThreads));
    if (o.type.starts_with("gguf:")) return quantize_to_gguf(o, cb);
    if (o.flavor != "comfy" && !o.flavor.empty())
      return invalid_argument("--flavor '" + o.flavor + "': applies to --type gguf:<TYPE> only");
    QuantizeSpec s;
    s.input = o.model;
    s.output = o.output;
    s.type = o.type;
    s.keep = o.keep;
    s.threads = o.threads;
    s.progress = cb.progress;
    s.cancel = cb.cancel;
    s.log = cb.log;
    // The output's manifest.json, written into the finished folder before it takes its name.
    s.finish = [&](const fs::path& folder) -> Status {
      KLEIN_ASSIGN_OR_RETURN(auto out, api::resolve_layout(api::layout_request(folder.string(), LoadOptions{})));
      LoadOptions lo;
      lo.threads = o.threads;
      KLEIN_ASSIGN_OR_RETURN(Manifest m, api::build_manifest(out, folder.string(), lo, o.threads, cb.cancel));
      return write_text_file(folder / "manifest.json", manifest_json(m));
    };
    LoadOptions in;
    in.diffusion_model = o.diffusion_model;
    in.text_encoder = o.text_encoder;
    in.vae = o.vae;
    in.variant = o.variant;
    if (!o.verify_manifest.empty()) {
      KLEIN_ASSIGN_OR_RETURN(auto layout, api::resolve_layout(api::layout_request(o.model, in)));
      KLEIN_RETURN_IF_ERROR(api::verify_layout(layout, o.verify_manifest, o.threads, cb.cancel));
    }
    std::error_code ec;
    if (!files && fs::is_directory(o.model, ec)) return quantize_model_folder(s);
    // Single files: written out as a diffusers folder beside the output first (quantize reads
    // stored tensors under their diffusers names), removed whatever happens.
    KLEIN_ASSIGN_OR_RETURN(auto layout, api::resolve_layout(api::layout_request(o.model, in)));
    KLEIN_RETURN_IF_ERROR(layout.complete());
    fs::path out = o.output;
    if (!out.has_filename()) out = out.parent_path();
    s.input = out.string() + ".in-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}());
    const fs::path staged = s.input;
    KLEIN_RETURN_IF_ERROR(check_quantize_spec(s));  // before the staged copy is written
    Status st = write_diffusers_folder(layout, staged);
    if (st.ok()) st = quantize_model_folder(s);
    fs::remove_all(staged, ec);
    return st;
  });
}

Result<ImageComparison> compare_images(const Image& a, const Image& b) {
  return api::guarded("compare", [&]() -> Result<ImageComparison> { return compare_rgb(a, b); });
}

Result<ImageComparison> compare_image_files(const std::string& a, const std::string& b) {
  return api::guarded("compare", [&]() -> Result<ImageComparison> {
    KLEIN_ASSIGN_OR_RETURN(Image ia, read_image(a));
    KLEIN_ASSIGN_OR_RETURN(Image ib, read_image(b));
    return compare_rgb(ia, ib);
  });
}

Result<ArrayComparison> compare_arrays(const FloatArray& a, const FloatArray& b) {
  return api::guarded("compare", [&]() -> Result<ArrayComparison> { return compare_float_arrays(a, b); });
}

Result<ArrayComparison> compare_npy_files(const std::string& a, const std::string& b) {
  return api::guarded("compare", [&]() -> Result<ArrayComparison> {
    KLEIN_ASSIGN_OR_RETURN(FloatArray fa, load_npy(a));
    KLEIN_ASSIGN_OR_RETURN(FloatArray fb, load_npy(b));
    return compare_float_arrays(fa, fb);
  });
}

}  // namespace klein
