// The Backend interface's default compositions: ops a backend may leave to the host (one download,
// host arithmetic, one upload) until it has a kernel of its own.
#include "backend/backend.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/dtype.h"

namespace klein {

namespace bf16_pack {

// Row r of a [R, C] pack holds the bf16 values of src row r (2C of them) in order, two per float
// slot; memcpy keeps the bytes as they are (no float arithmetic touches a packed slot).
void pack_row(const float* src, float* dst, int64_t C) {
  uint16_t buf[256];
  for (int64_t c0 = 0; c0 < 2 * C; c0 += 256) {
    const int64_t n = std::min<int64_t>(256, 2 * C - c0);
    for (int64_t i = 0; i < n; ++i) buf[i] = f32_to_bf16(src[c0 + i]);
    std::memcpy(reinterpret_cast<char*>(dst) + c0 * sizeof(uint16_t), buf, static_cast<size_t>(n) * sizeof(uint16_t));
  }
}

void unpack_row(const float* src, float* dst, int64_t C) {
  uint16_t buf[256];
  for (int64_t c0 = 0; c0 < 2 * C; c0 += 256) {
    const int64_t n = std::min<int64_t>(256, 2 * C - c0);
    std::memcpy(buf, reinterpret_cast<const char*>(src) + c0 * sizeof(uint16_t), static_cast<size_t>(n) * sizeof(uint16_t));
    for (int64_t i = 0; i < n; ++i) dst[c0 + i] = bf16_to_f32(buf[i]);
  }
}

Status check(const char* op, const TensorView& wide, const TensorView& packed) {
  if (!wide.matrix_ok() || !packed.matrix_ok() || wide.rows() != packed.rows() || wide.cols() != 2 * packed.cols())
    return invalid_argument(std::string(op) + ": expected float32 [R, 2C] and packed [R, C], got " +
                            shape_str(wide.shape_vec()) + " and " + shape_str(packed.shape_vec()));
  return Status::Ok();
}

}  // namespace bf16_pack

Status Backend::pack_bf16(const TensorView& src, const TensorView& dst) {
  KLEIN_RETURN_IF_ERROR(bf16_pack::check("pack_bf16", src, dst));
  KLEIN_ASSIGN_OR_RETURN(Tensor h, download(src));
  const int64_t R = dst.rows(), C = dst.cols();
  KLEIN_ASSIGN_OR_RETURN(Tensor p, Tensor::alloc({R, C}, "a bf16 pack"));
  for (int64_t r = 0; r < R; ++r) bf16_pack::pack_row(h.data() + r * 2 * C, p.data() + r * C, C);
  KLEIN_ASSIGN_OR_RETURN(Tensor d, upload(p.data(), {R, C}, "a bf16 pack"));
  return copy(d, dst);
}

Status Backend::unpack_bf16(const TensorView& src, const TensorView& dst) {
  KLEIN_RETURN_IF_ERROR(bf16_pack::check("unpack_bf16", dst, src));
  KLEIN_ASSIGN_OR_RETURN(Tensor h, download(src));
  const int64_t R = src.rows(), C = src.cols();
  KLEIN_ASSIGN_OR_RETURN(Tensor w, Tensor::alloc({R, 2 * C}, "an unpacked bf16 tensor"));
  for (int64_t r = 0; r < R; ++r) bf16_pack::unpack_row(h.data() + r * C, w.data() + r * 2 * C, C);
  KLEIN_ASSIGN_OR_RETURN(Tensor d, upload(w.data(), {R, 2 * C}, "an unpacked bf16 tensor"));
  return copy(d, dst);
}

}  // namespace klein
