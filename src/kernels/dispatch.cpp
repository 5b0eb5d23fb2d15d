// Runtime dispatch of the kernel entry points: validate and resolve strides once here, then run
// the AVX2/FMA path when it is compiled in (x86-64) and this CPU has it, else the scalar ref.
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"

#if defined(KLEIN_X86)
#include "kernels/cpu/avx2_kernels.h"
#endif

namespace klein::kernels {

bool cpu_has_avx2() {
#if defined(KLEIN_X86)
  // F16C is needed by the f16 weight loads; every AVX2 CPU has it, but check rather than assume.
  // KLEIN_DISABLE_AVX2=1 forces the scalar references (to test or time the fallback).
  static const bool ok = [] {
    const char* off = std::getenv("KLEIN_DISABLE_AVX2");
    if (off && *off && std::string(off) != "0") return false;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return ok;
#else
  return false;
#endif
}

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  if (W.cols() != K)
    throw std::invalid_argument("linear: " + W.name + " has " + std::to_string(W.cols()) +
                                " inputs, x has " + std::to_string(K));
  if (bias && !bias->empty() && bias->numel() != N)
    throw std::invalid_argument("linear: bias " + bias->name + " size != " + std::to_string(N));
  if (ldx == 0) ldx = K;
  if (ldy == 0) ldy = N;
  if (M <= 0 || N <= 0) return;
  const bool has_bias = bias && !bias->empty();
  if (!cpu_has_avx2() || K == 0) {
    ref::linear(x, M, K, W, has_bias ? bias : nullptr, y, ldx, ldy);
    return;
  }
#if defined(KLEIN_X86)
  std::vector<float> b;  // [N] bias as f32
  if (has_bias) {
    b.resize(N);
    weight_to_f32(*bias, 0, N, b.data());
  }
  avx2::linear(x, M, K, W, has_bias ? b.data() : nullptr, y, pool, ldx, ldy);
#endif
}

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               ThreadPool& pool, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo) {
  if (Hkv <= 0 || Hq <= 0 || Hq % Hkv != 0)
    throw std::invalid_argument("attention: Hq (" + std::to_string(Hq) +
                                ") must be a multiple of Hkv (" + std::to_string(Hkv) + ")");
  if (ldq == 0) ldq = static_cast<int64_t>(Hq) * D;
  if (ldo == 0) ldo = static_cast<int64_t>(Hq) * D;
  if (ldk == 0) ldk = static_cast<int64_t>(Hkv) * D;
  if (ldv == 0) ldv = static_cast<int64_t>(Hkv) * D;
  if (Sq <= 0 || D <= 0) return;
  if (!cpu_has_avx2()) {
    ref::attention(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, ldq, ldk, ldv, ldo);
    return;
  }
#if defined(KLEIN_X86)
  avx2::attention(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, pool, ldq, ldk, ldv, ldo);
#endif
}

}  // namespace klein::kernels
