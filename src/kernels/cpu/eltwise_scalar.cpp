// The kScalar element-wise table: the reference loops of kernels/ref/elementwise.h adapted to
// the row signatures of kernels/eltwise.h. Plain C++, so every CPU has it.
#include "kernels/eltwise.h"
#include "kernels/ref/elementwise.h"

namespace klein::kernels::scalar {
namespace {

void rms_norm(const float* x, float* y, const float* w, int64_t n, float eps) {
  ops::rms_norm(x, y, w, 1, n, eps);
}

void layer_norm(const float* x, float* y, const float* w, const float* b, int64_t n, float eps) {
  ops::layer_norm(x, y, w, b, 1, n, eps);
}

void rope_half(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  ops::rope_half(x, 1, heads, D, heads * D, cos, sin);
}

void rope_interleaved(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) ops::rope_interleaved_head(x + h * D, D, cos, sin);
}

void qk_norm_rope(float* x, int64_t heads, int64_t D, const float* w, float eps, const float* cos,
                  const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    ops::rms_norm_head(x + h * D, D, w, eps);
    ops::rope_interleaved_head(x + h * D, D, cos, sin);
  }
}

const EltwiseFns kFns = {
    .rms_norm = rms_norm,
    .layer_norm = layer_norm,
    .moments = ops::moments,
    .rope_half = rope_half,
    .rope_interleaved = rope_interleaved,
    .qk_norm_rope = qk_norm_rope,
    .silu_mul = ops::silu_mul,
    .silu = ops::silu,
    .gated_add = ops::gated_add,
    .add = ops::add,
    .add_scalar = ops::add_scalar,
    .scale_shift = ops::scale_shift,
    .scale_shift1 = ops::scale_shift1,
    .exp = ops::exp,
};

}  // namespace

const EltwiseFns& eltwise() { return kFns; }

}  // namespace klein::kernels::scalar
