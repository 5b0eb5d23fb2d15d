// The validated entry points over a KernelSet (run_linear, run_attention): check and resolve
// strides once here, then call the kernel the set chose for the weight's format.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/registry.h"

namespace klein::kernels {

namespace {

// A linear's operands checked (W's inputs = K, the bias [N] or empty), and its bias as float32
// (empty for none).
std::vector<float> checked_bias_f32(const Weight& W, int64_t K, const Weight* bias) {
  const int64_t N = W.rows();
  if (W.cols() != K)
    throw std::invalid_argument("linear: " + W.name + " has " + std::to_string(W.cols()) +
                                " inputs, x has " + std::to_string(K));
  if (bias && !bias->empty() && bias->numel() != N)
    throw std::invalid_argument("linear: bias " + bias->name + " size != " + std::to_string(N));
  std::vector<float> b;
  if (bias && !bias->empty()) {
    b.resize(N);
    weight_to_f32(*bias, 0, N, b.data());
  }
  return b;
}

// x's rows rotated as W's were (Weight::act_rotation_group: ComfyUI convrot), [M, K] packed.
std::vector<float> rotated_rows(const float* x, int64_t M, int64_t K, int64_t ldx, const Weight& W, ThreadPool& pool) {
  const int64_t g = W.act_rotation_group;
  if (g < 4 || K % g != 0)
    throw std::invalid_argument("linear: " + W.name + " rotates groups of " + std::to_string(g) + ", K is " +
                                std::to_string(K));
  std::vector<float> r(static_cast<size_t>(M * K));
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      std::copy(x + m * ldx, x + m * ldx + K, r.data() + m * K);
      ref::hadamard_groups(r.data() + m * K, K, g);
    }
  });
  return r;
}

}  // namespace

void run_linear(const KernelSet& set, const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias,
                float* y, ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  const std::vector<float> b = checked_bias_f32(W, K, bias);  // [N] or empty
  if (ldx == 0) ldx = K;
  std::vector<float> rotated;
  if (W.act_rotation_group > 0 && M > 0 && K > 0) {
    rotated = rotated_rows(x, M, K, ldx, W, pool);
    x = rotated.data();
    ldx = K;
  }
  if (ldy == 0) ldy = N;
  if (M <= 0 || N <= 0) return;
  const LinearFn fn = set.get(Op::kLinear, W.dtype).linear;
  if (K == 0) {  // an empty sum: y = bias (the kernels need K ≥ 1)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * ldy + n] = b.empty() ? 0.0f : b[n];
    return;
  }
  fn(x, M, K, W, b.empty() ? nullptr : b.data(), y, pool, ldx, ldy);
}

void run_linear_swiglu(const KernelSet& set, const float* x, int64_t M, int64_t K, const Weight& W,
                       const Weight* bias, float* out, float* u, ThreadPool& pool, int64_t ldx, int64_t ldo,
                       int64_t ldu) {
  const int64_t N = W.rows(), F = N / 2;
  if (N % 2 != 0)
    throw std::invalid_argument("linear_swiglu: " + W.name + " has " + std::to_string(N) +
                                " rows, expected [gate; up] (an even count)");
  if (ldo == 0) ldo = F;
  if (ldu == 0) ldu = N;
  const LinearSwigluFn fused = set.get(Op::kLinear, W.dtype).linear_swiglu;
  const auto silu_mul = set.eltwise().silu_mul;
  const auto unfused = [&] {
    run_linear(set, x, M, K, W, bias, u, pool, ldx, ldu);
    pool.parallel_for(std::max<int64_t>(M, 0), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) silu_mul(u + r * ldu, u + r * ldu + F, out + r * ldo, F);
    });
  };
  if (!fused || K == 0 || M <= 0 || W.act_rotation_group > 0) return unfused();
  const std::vector<float> b = checked_bias_f32(W, K, bias);  // [2F] or empty
  if (ldx == 0) ldx = K;
  if (!fused(x, M, K, W, b.empty() ? nullptr : b.data(), out, pool, ldx, ldo, silu_mul)) unfused();
}

void run_attention(const KernelSet& set, const float* q, const float* k, const float* v, float* out, int64_t Sq,
                   int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool,
                   int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo) {
  if (Hkv <= 0 || Hq <= 0 || Hq % Hkv != 0)
    throw std::invalid_argument("attention: Hq (" + std::to_string(Hq) +
                                ") must be a multiple of Hkv (" + std::to_string(Hkv) + ")");
  if (ldq == 0) ldq = static_cast<int64_t>(Hq) * D;
  if (ldo == 0) ldo = static_cast<int64_t>(Hq) * D;
  if (ldk == 0) ldk = static_cast<int64_t>(Hkv) * D;
  if (ldv == 0) ldv = static_cast<int64_t>(Hkv) * D;
  if (Sq <= 0 || D <= 0) return;
  set.get(Op::kAttention, DType::kF32).attention(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, pool, ldq, ldk,
                                                  ldv, ldo);
}

}  // namespace klein::kernels
