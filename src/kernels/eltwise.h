// The element-wise kernels (norms, RoPE, SwiGLU / SiLU, modulation, residuals) as one table of
// row primitives per ISA, registered in the kernel registry as Op::kElementwise (format F32)
// and chosen once per KernelSet like the GEMMs. The CPU backend checks the views, splits rows
// over its thread pool and calls these per row, so a kernel never sees strides or threads.
//
// The kScalar table is the portable reference of kernels/ref/elementwise.h (statistics in
// double); the AVX2 and AVX-512 tables (cpu/eltwise_avx2.cpp, cpu/eltwise_avx512.cpp, one
// template in cpu/eltwise_simd.h) compute the same formulas with these differences only:
//   * norm statistics are still summed in double, in another order (8 or 16 partial sums):
//     after rounding to float, the mean / rstd / rms factor differ by at most 1 ulp;
//   * products that the reference rounds before an add are fused (FMA): ≤ 1 ulp of the product;
//   * exp is vectorised (exp_cephes in cpu/eltwise_simd.h: the Cephes expf polynomial after an
//     FMA range reduction): ≤ 1.01 ulp from the exact e^x, measured over every float in
//     [-104, 89] (2.24e9 values; 22 of them above 1 ulp), overflow to inf, subnormals rounded
//     once, NaN kept — so ≤ 2 ulp from libm's expf, and silu / swiglu stay within ~8 ulp
//     (relative 2^-21) of the reference's x / (1 + expf(−x)).
//   * nothing else: the SiLU divides (no reciprocal estimate), the norms round mean / rstd to
//     float where the reference does.
// tests/test_eltwise.cpp checks each ISA against the kScalar table with bounds derived from these.
#pragma once

#include <cstdint>

#include "kernels/ref/elementwise.h"

namespace klein::kernels {

using ops::Moments;  // mean and M2 = Σ(x − mean)², two passes in double (GroupNorm's statistics)

struct EltwiseFns {
  // y = x · rsqrt(mean(x²) + eps) · w (w null: no weight). x may equal y. n ≥ 1.
  void (*rms_norm)(const float* x, float* y, const float* w, int64_t n, float eps);
  // LayerNorm without affine, biased variance, then y = n · w + b (w / b null: 1 / 0). Also the
  // modulated LayerNorm (w = 1 + scale, b = shift). x may equal y. n ≥ 1.
  void (*layer_norm)(const float* x, float* y, const float* w, const float* b, int64_t n, float eps);
  Moments (*moments)(const float* x, int64_t n);  // n ≥ 1
  // One token's heads [heads · D] in place. Half-split (Qwen): cos/sin [D/2] per token;
  // interleaved (FLUX): cos/sin [D], each angle repeated for its pair. D even.
  void (*rope_half)(float* x, int64_t heads, int64_t D, const float* cos, const float* sin);
  void (*rope_interleaved)(float* x, int64_t heads, int64_t D, const float* cos, const float* sin);
  // Per head: RMSNorm over D with weight w [D], then interleaved RoPE — one pass per head.
  void (*qk_norm_rope)(float* x, int64_t heads, int64_t D, const float* w, float eps, const float* cos,
                       const float* sin);
  // out = silu(a) · b (out may equal a); silu(v) = v / (1 + exp(−v)).
  void (*silu_mul)(const float* a, const float* b, float* out, int64_t n);
  void (*silu)(float* x, int64_t n);                                   // in place
  void (*gated_add)(float* h, const float* o, const float* g, int64_t n);  // h += g · o
  void (*add)(float* y, const float* x, int64_t n);                        // y += x
  void (*add_scalar)(const float* x, float c, float* y, int64_t n);       // y = x + c
  // y = x · scale[i] + shift[i] (per column) / y = x · s + t (one pair for the row).
  void (*scale_shift)(const float* x, float* y, const float* scale, const float* shift, int64_t n);
  void (*scale_shift1)(const float* x, float* y, float s, float t, int64_t n);
  void (*exp)(const float* x, float* y, int64_t n);  // y = e^x (the vector exp silu uses; tests)
};

namespace scalar {
const EltwiseFns& eltwise();  // the reference loops (kernels/ref/elementwise.h)
}
#if defined(KLEIN_X86)
namespace avx2 {
const EltwiseFns& eltwise();
}
namespace avx512 {
const EltwiseFns& eltwise();
}
#endif

}  // namespace klein::kernels
