// Dense row-major float32 tensors for activations. Weights are not Tensors: see core/weight.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace klein {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[1, 512, 7680]"

// Owning, 64-byte aligned, zero-initialised float32 buffer with a shape.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape);
  Tensor(std::initializer_list<int64_t> shape) : Tensor(Shape(shape)) {}
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;  // copies are explicit: clone()
  Tensor& operator=(const Tensor&) = delete;

  Tensor clone() const;
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  float* data() { return buf_.get(); }
  const float* data() const { return buf_.get(); }
  // Same data, new shape with the same element count.
  void reshape(Shape s);

 private:
  struct Free {
    void operator()(float* p) const;
  };
  Shape shape_;
  int64_t numel_ = 0;
  std::unique_ptr<float[], Free> buf_;
};

// Returns false if any element is NaN or +-Inf.
bool all_finite(const float* x, int64_t n);

}  // namespace klein
