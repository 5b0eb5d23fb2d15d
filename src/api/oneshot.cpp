// The free functions of the public API: one-shot generate, save_png, cpu_info, version.
#include "api/components.h"
#include "api/guard.h"
#include "core/checked.h"
#include "io/npy.h"
#include "io/png_writer.h"
#include "klein/klein.h"

namespace klein {

const char* version() { return KLEIN_VERSION; }

Result<std::string> cpu_info(const std::string& isa) {
  return api::guarded("cpu info", [&]() -> Result<std::string> { return api::cpu_report(isa); });
}

Result<GenerateResult> generate(const GenerateOptions& opt) {
  return api::guarded("generate", [&]() -> Result<GenerateResult> {
    LoadOptions lo;
    lo.threads = opt.threads;
    lo.precision = opt.precision;
    lo.memory = MemoryPolicy::kLow;
    lo.loras = opt.loras;
    lo.lora_mode = opt.lora_mode;
    KLEIN_ASSIGN_OR_RETURN(auto model, Model::open(opt.model_dir, lo));
    GenerateRequest req;
    req.prompt = opt.prompt;
    req.width = opt.width;
    req.height = opt.height;
    req.steps = opt.steps;
    req.seed = opt.seed;
    req.guidance_scale = opt.guidance_scale;
    req.negative_prompt = opt.negative_prompt;
    req.noise_npy = opt.noise_npy;
    req.bf16_noise = opt.bf16_noise;
    req.reference_images = opt.reference_images;
    req.dump = {opt.dump_dir, opt.dump_filter};
    Callbacks cb;
    cb.progress = opt.on_progress;
    cb.cancel = opt.should_cancel;
    cb.log = opt.on_log;
    return model->generate(req, cb);
  });
}

Status save_png(const std::string& path, const Image& image,
                const std::vector<std::pair<std::string, std::string>>& metadata) {
  return api::guarded("save_png", [&]() -> Status {
    if (image.width <= 0 || image.height <= 0 ||
        image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
      return invalid_argument("save_png: image buffer does not match its size");
    return write_png(path, image.width, image.height, image.rgb.data(), metadata);
  });
}

Status save_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  return api::guarded("save_npy", [&]() -> Status {
    int64_t n = 0;
    if (!checked_numel(shape, &n) || static_cast<uint64_t>(n) != data.size())
      return invalid_argument("save_npy: data does not match the shape " + shape_str(shape));
    return write_npy(path, DType::kF32, shape, data.data());
  });
}

Result<FloatArray> load_npy(const std::string& path) {
  return api::guarded("load_npy", [&]() -> Result<FloatArray> {
    KLEIN_ASSIGN_OR_RETURN(NpyArray arr, read_npy(path));
    FloatArray out;
    out.shape.assign(arr.shape.begin(), arr.shape.end());
    out.data = arr.to_f32();
    return out;
  });
}

}  // namespace klein
