// The public quantize_model / compare_images / compare_arrays: thin wrappers over pipeline/, behind the catch-all.
#include "api/guard.h"
#include "io/image_reader.h"
#include "klein/klein.h"
#include "pipeline/image_compare.h"
#include "pipeline/quantize_model.h"

namespace klein {

Status quantize_model(const QuantizeOptions& o, const Callbacks& cb) {
  return api::guarded("quantize", [&]() -> Status {
    if (o.model.empty()) return invalid_argument("quantize: give the input model folder (--model)");
    if (o.threads < 0 || o.threads > kMaxThreads)
      return invalid_argument("quantize: threads " + std::to_string(o.threads) + ": expected 0 (all cores) to " +
                              std::to_string(kMaxThreads));
    QuantizeSpec s;
    s.input = o.model;
    s.output = o.output;
    s.type = o.type;
    s.keep = o.keep;
    s.threads = o.threads;
    s.progress = cb.progress;
    s.cancel = cb.cancel;
    s.log = cb.log;
    return quantize_model_folder(s);
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
