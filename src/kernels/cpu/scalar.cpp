// kScalar linear / attention: the double-accumulating references, split over threads along an
// axis they compute independently (rows of x; kv-head groups), so results do not depend on the
// thread count and the scalar fallback still uses every core.
#include "kernels/cpu/scalar_kernels.h"

namespace klein::kernels::scalar {

namespace {
// The f32 bias as a Weight view (empty without one): the form the references take.
Weight bias_view(const Weight& W, const float* bias_f32) {
  Weight b;
  if (bias_f32) {
    b.name = W.name + ".bias";
    b.dtype = DType::kF32;
    b.shape = {W.rows()};
    b.data = bias_f32;
    b.nbytes = static_cast<size_t>(W.rows()) * sizeof(float);
  }
  return b;
}
}  // namespace

// Runs a ref:: linear on blocks of ≥ 16 rows of x (ref::linear expands each weight row once per
// call, which that amortises; the quantizing references quantize rows independently, so the
// split changes nothing).
template <auto RefLinear>
void row_blocks(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const Weight b = bias_view(W, bias_f32);
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    RefLinear(x + m0 * ldx, m1 - m0, K, W, bias_f32 ? &b : nullptr, y + m0 * ldy, ldx, ldy);
  }, 16);
}

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy) {
  row_blocks<ref::linear>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

void linear_w8a8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  row_blocks<ref::linear_w8a8>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

void linear_w4a8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  row_blocks<ref::linear_w4a8>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  row_blocks<ref::linear_ggml>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk,
               int Hq, int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool,
               int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo) {
  const int group = Hq / Hkv;  // query heads per kv head
  pool.parallel_for(Hkv, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t qo = g * group * D, ko = g * D;
      ref::attention(q + qo, k + ko, v + ko, out + qo, Sq, Sk, group, 1, D, scale, mask, ldq, ldk, ldv, ldo);
    }
  });
}

}  // namespace klein::kernels::scalar
