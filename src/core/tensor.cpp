#include "core/tensor.h"

#include "core/checked.h"
#include "core/format.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace klein {

int64_t shape_numel(const Shape& s) {
  // Saturating: a shape from a file is checked where it is read (checked_numel); this never
  // overflows into undefined behaviour even when it was not.
  int64_t n = 1;
  for (auto d : s)
    if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;
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

// ---- TensorView

TensorView TensorView::contiguous(void* data, const Shape& shape, DType dt, Device dev) {
  TensorView v;
  v.data = data;
  v.dtype = dt;
  v.device = dev;
  v.ndim = static_cast<int>(shape.size());
  int64_t st = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.stride[i] = st;
    st *= shape[i];
  }
  return v;
}

TensorView TensorView::matrix(float* data, int64_t rows, int64_t cols, int64_t ld, Device dev) {
  TensorView v = contiguous(data, {rows, cols}, DType::kF32, dev);
  v.stride[0] = ld ? ld : cols;
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != st) return false;
    st *= shape[i];
  }
  return true;
}

bool TensorView::matrix_ok() const {
  if (ndim == 0) return true;
  if (shape[ndim - 1] > 1 && stride[ndim - 1] != 1) return false;
  // Leading dims collapse if each one's stride is the next one's stride times its size.
  for (int i = 0; i + 2 < ndim; ++i)
    if (shape[i] > 1 && stride[i] != stride[i + 1] * shape[i + 1]) return false;
  return true;
}

int64_t TensorView::rows() const {
  int64_t r = 1;
  for (int i = 0; i + 1 < ndim; ++i) r *= shape[i];
  return r;
}

TensorView TensorView::as_matrix() const {
  TensorView v = *this;
  v.ndim = 2;
  v.shape = {rows(), cols(), 0, 0};
  v.stride = {ld(), 1, 0, 0};
  return v;
}

TensorView TensorView::row_range(int64_t r0, int64_t r1) const {
  TensorView v = as_matrix();
  v.data = static_cast<char*>(data) + r0 * v.stride[0] * static_cast<int64_t>(dtype_size(dtype));
  v.shape[0] = r1 - r0;
  return v;
}

TensorView TensorView::col_range(int64_t c0, int64_t c1) const {
  TensorView v = as_matrix();
  v.data = static_cast<char*>(data) + c0 * static_cast<int64_t>(dtype_size(dtype));
  v.shape[1] = c1 - c0;
  return v;
}

TensorView TensorView::reshaped(const Shape& s) const {
  return contiguous(data, s, dtype, device);
}

// ---- Tensor

// Host buffers come from calloc, 64-byte aligned by hand (the block's own pointer kept just
// below the aligned address), rather than aligned_alloc + memset: a large block is a fresh
// mapping whose pages the kernel supplies zeroed on first touch, so calloc skips the clearing
// and pages never written never become resident — the fused SwiGLU's unused [rows, 2F] scratch
// (57-75 MB at 256²), the rows a step leaves alone — while reused heap memory is still cleared.
void Tensor::Free::operator()(float* p) const {
  if (release) release(p, ctx);
  else if (p) std::free(reinterpret_cast<void**>(p)[-1]);
}

namespace {
float* host_alloc(int64_t numel) {
  const size_t bytes = (static_cast<size_t>(numel) * sizeof(float) + 63) & ~size_t{63};
  if (bytes > SIZE_MAX - 64) return nullptr;
  void* raw = std::calloc(bytes + 64, 1);
  if (!raw) return nullptr;
  // malloc's alignment (≥ 16) leaves ≥ 16 bytes below the aligned address for `raw`.
  auto* p = reinterpret_cast<void**>((reinterpret_cast<uintptr_t>(raw) + 64) & ~uintptr_t{63});
  p[-1] = raw;
  return reinterpret_cast<float*>(p);
}
}  // namespace

Tensor::Tensor(Shape shape) : shape_(std::move(shape)) {
  if (!checked_numel(shape_, &numel_) || numel_ > (int64_t{1} << 60)) throw std::bad_alloc();
  if (numel_ > 0) {
    float* p = host_alloc(numel_);
    if (!p) throw std::bad_alloc();
    buf_.reset(p);
  }
}

Result<Tensor> Tensor::alloc(Shape shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 60) / d))
      return invalid_argument("tensor for " + what + " has an invalid shape " + shape_str(shape));
    n *= d;
  }
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = n;
  if (n > 0) {
    float* p = host_alloc(n);
    if (!p) {
      char gib[32];
      std::snprintf(gib, sizeof gib, "%.2f", static_cast<double>(n) * 4.0 / (1024.0 * 1024.0 * 1024.0));
      return Status(Code::kOutOfMemory, std::string("out of memory: ") + gib + " GiB needed for " + what);
    }
    t.buf_.reset(p);
  }
  return t;
}

Tensor Tensor::adopt(float* data, Shape shape, Device device, Release release, void* ctx) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.device_ = device;
  t.buf_ = std::unique_ptr<float[], Free>(data, Free{release, ctx});
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape_);
  if (numel_) std::memcpy(t.data(), data(), numel_ * sizeof(float));
  return t;
}

Status Tensor::reshape(Shape s) {
  int64_t n = 0;
  if (!checked_numel(s, &n) || n != numel_)
    return internal_error("Tensor::reshape " + shape_str(shape_) + " -> " + shape_str(s));
  shape_ = std::move(s);
  return Status::Ok();
}

TensorView Tensor::view() const {
  return TensorView::contiguous(const_cast<float*>(buf_.get()), shape_, DType::kF32, device_);
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

}  // namespace klein
