// Activation tensors: the owning float32 Tensor and the non-owning TensorView that backend ops
// take. Weights are not Tensors: see core/weight.h.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace klein {

using Shape = std::vector<int64_t>;

// Where a buffer lives. Host code may only dereference kCpu data.
enum class Device : uint8_t { kCpu, kCuda };

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[1, 512, 7680]"

// A non-owning view of up to 4 dimensions with strides in elements. Ops see their operands as
// matrices [rows, cols]: the last dimension contiguous (stride 1) and the leading dimensions
// collapsible into rows at one row stride (ld). Slicing rows or columns keeps that form, which
// is how a model addresses the Q, K, V or gate parts of a fused projection without copying.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};

  // A contiguous row-major view.
  static TensorView contiguous(void* data, const Shape& shape, DType dt = DType::kF32,
                               Device dev = Device::kCpu);
  // A [rows, cols] matrix at row stride ld (0: cols).
  static TensorView matrix(float* data, int64_t rows, int64_t cols, int64_t ld = 0,
                           Device dev = Device::kCpu);

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Matrix form: rows = product of the leading dimensions, cols = the last one, ld = the row
  // stride. matrix_ok() is false when the leading dimensions cannot be collapsed.
  bool matrix_ok() const;
  int64_t rows() const;
  int64_t cols() const { return ndim ? shape[ndim - 1] : 1; }
  int64_t ld() const { return ndim >= 2 ? stride[ndim - 2] : cols(); }
  float* f32() const { return static_cast<float*>(data); }

  // Matrix slices (2-D view of the matrix form): rows [r0, r1), columns [c0, c1).
  TensorView row_range(int64_t r0, int64_t r1) const;
  TensorView col_range(int64_t c0, int64_t c1) const;
  // The matrix form as an explicit 2-D view.
  TensorView as_matrix() const;
  // Same data, new shape (the view must be contiguous).
  TensorView reshaped(const Shape& s) const;
  Shape shape_vec() const { return Shape(shape.begin(), shape.begin() + ndim); }
};

// Owning, 64-byte aligned, zero-initialised float32 buffer with a shape, on a device. Host
// tensors come from the constructor or Tensor::alloc; device tensors from a Backend.
class Tensor {
 public:
  Tensor() = default;
  // Host tensor. Throws std::bad_alloc on failure or on a shape whose size overflows: library
  // code allocates through alloc() (or a Backend), which reports "out of memory" as a Status
  // instead; the few small fixed-size uses left are behind the API's catch-all (api/guard.h).
  explicit Tensor(Shape shape);
  Tensor(std::initializer_list<int64_t> shape) : Tensor(Shape(shape)) {}
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;  // copies are explicit: clone()
  Tensor& operator=(const Tensor&) = delete;

  // Host tensor, or "out of memory: N GiB needed for <what>".
  static Result<Tensor> alloc(Shape shape, const std::string& what);
  // Adopts `data` (numel floats on `device`), released with `release(data, ctx)`.
  using Release = void (*)(void* data, void* ctx);
  static Tensor adopt(float* data, Shape shape, Device device, Release release, void* ctx);

  Tensor clone() const;  // host tensors only
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  Device device() const { return device_; }
  float* data() { return buf_.get(); }
  const float* data() const { return buf_.get(); }
  // Same data, new shape with the same element count (else an internal error, the tensor unchanged).
  Status reshape(Shape s);

  TensorView view() const;
  operator TensorView() const { return view(); }  // NOLINT: tensors pass where views are taken

 private:
  struct Free {
    Free() noexcept {}  // (user-provided: a nested class's initialisers are not usable earlier)
    Free(Release r, void* c) noexcept : release(r), ctx(c) {}
    Release release = nullptr;
    void* ctx = nullptr;
    void operator()(float* p) const;
  };
  Shape shape_;
  int64_t numel_ = 0;
  Device device_ = Device::kCpu;
  std::unique_ptr<float[], Free> buf_;
};

// Returns false if any element is NaN or +-Inf.
bool all_finite(const float* x, int64_t n);

}  // namespace klein
