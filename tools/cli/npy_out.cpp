// .npy output for `klein encode` through the public save_npy (atomic, like save_png).
#include "common.h"
#include "klein/klein.h"

namespace klein::cli {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  return save_npy(path, shape, data);  // atomic, like save_png
}

}  // namespace klein::cli
