#include "core/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace klein {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

void Tensor::Free::operator()(float* p) const { std::free(p); }

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), numel_(shape_numel(shape_)) {
  if (numel_ > 0) {
    size_t bytes = (static_cast<size_t>(numel_) * sizeof(float) + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    buf_.reset(static_cast<float*>(p));
  }
}

Tensor Tensor::clone() const {
  Tensor t(shape_);
  if (numel_) std::memcpy(t.data(), data(), numel_ * sizeof(float));
  return t;
}

void Tensor::reshape(Shape s) {
  if (shape_numel(s) != numel_)
    throw std::logic_error("Tensor::reshape " + shape_str(shape_) + " -> " + shape_str(s));
  shape_ = std::move(s);
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

}  // namespace klein
