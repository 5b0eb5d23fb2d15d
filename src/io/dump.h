// Writes named intermediate tensors as .npy so a divergence from the reference can be located.
// Names are stable and documented (README "Debugging"); other tools compare by name.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace klein {

class Dumper {
 public:
  Dumper() = default;  // disabled: every call is a no-op
  // Dumps into `dir` (created). `filter`: comma-separated substrings; empty = dump everything.
  Dumper(std::filesystem::path dir, std::string filter = "");

  bool enabled() const { return enabled_; }
  bool wants(std::string_view name) const;
  // Writes <dir>/<name>.npy as float32 with `shape`. The first failure is kept in status().
  void dump(const std::string& name, const float* data, const Shape& shape);
  void dump(const std::string& name, const Tensor& t) { dump(name, t.data(), t.shape()); }
  const Status& status() const { return status_; }

 private:
  bool enabled_ = false;
  std::filesystem::path dir_;
  std::string filter_;
  Status status_;
};

}  // namespace klein
