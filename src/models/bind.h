// The bind step every model's load() goes through: each tensor the config implies is asked for
// once (required or optional) with the shape the config gives it, checked, and stored into the
// model; norm vectors are converted to float32 once here; finish() then fails on any tensor of
// the source that no one asked for and that is not explicitly ignored — a file and a config.json
// that disagree (more layers, a bias the config turned off, another architecture) are a load
// error rather than silently unused weights.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/weight.h"
#include "io/tensor_source.h"

namespace klein {

class Binder {
 public:
  explicit Binder(const TensorSource& src) : src_(src) {}

  // The tensor must exist, have `expected` shape (unless empty) and a format the kernels compute
  // with (validate_weight). Errors name the file and the tensor.
  Status required(const std::string& name, const Shape& expected, Weight* out);
  // Like required, but an absent tensor leaves *out empty.
  Status optional(const std::string& name, const Shape& expected, Weight* out);
  // A required [n] tensor converted to float32 (norm weights, batch-norm statistics).
  Status vector_f32(const std::string& name, int64_t n, std::vector<float>* out);
  // Tensors whose names start with `prefix` may be present and are never used (Qwen3 layers past
  // the deepest tap, lm_head, counters such as bn.num_batches_tracked).
  void ignore_prefix(std::string prefix) { ignored_.push_back(std::move(prefix)); }

  // The unused-tensor check. `described_by` (e.g. "config.json (num_layers 5)") says what the
  // model was built from, appended to the message.
  Status finish(const std::string& described_by = "") const;

 private:
  bool ignored(const std::string& name) const;

  const TensorSource& src_;
  std::set<std::string> bound_;
  std::vector<std::string> ignored_;
};

// Why a component's output went non-finite: scans the source's weights (dequantised row by row;
// run only after a failure, so its cost does not matter) and returns a format error naming the
// file and the first tensor with NaN/Inf values, or — when every weight is finite — an error
// saying the `component` overflowed on finite weights.
// `used` (if given) limits the scan to the tensors the model reads (not the ignored ones).
Status non_finite_weight_status(const TensorSource& src, const std::string& component,
                                const std::function<bool(const std::string&)>& used = nullptr);

// A model component folder: config.json parsed, the weights opened as a SafetensorsSource and
// checked against the config's "quantization" entry. The path-based load() overloads of the
// models use it.
struct ComponentFiles {
  nlohmann::json config;
  std::string config_where;  // the config.json path, for messages
  std::shared_ptr<const TensorSource> source;
};
Result<ComponentFiles> open_component(const std::filesystem::path& dir);

}  // namespace klein
