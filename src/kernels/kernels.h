// The scalar references of the dense kernels (src/kernels/ref/): the plainest correct code, the
// yardstick every fast kernel is tested against and the kScalar rows of the kernel registry
// (kernels/registry.h; the validated entry points run_linear / run_attention are there).
//
// linear:    y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]), W in any weight format; ldx / ldy are the
//            row strides of x and y in floats (0 = K / N).
// attention: multi-head SDPA, token-major q [Sq, Hq, D] at row stride ldq, k/v [Sk, Hkv, D] at
//            ldk/ldv, out [Sq, Hq, D] at ldo (0 = H·D); GQA: query head h reads kv head
//            h / (Hq / Hkv); a query row with no visible key gives zeros. The mask alone says
//            which keys count: a NaN score among the visible ones, or scores whose softmax is
//            undefined (+inf, whose weight is inf/inf; every visible score −inf, 0/0), make the
//            row NaN in every kernel, so a corrupt Q or K weight reaches the output checks
//            instead of reading as a masked key.
#pragma once

#include <cstdint>

#include "core/attn_mask.h"
#include "core/weight.h"

namespace klein::kernels {

using klein::AttnMask;  // core/attn_mask.h

namespace ref {
// Each of the K / group groups of `row` (group a power of 4, ≥ 4) multiplied in place by the
// normalized Hadamard matrix H = h4^{⊗k} / 2^k, h4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]
// (comfy-kitchen's regular Hadamard for convrot; symmetric, so row and column forms agree):
// k stages of 4-point transforms, then one exact power-of-two scaling.
void hadamard_groups(float* row, int64_t K, int64_t group);
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
            int64_t ldx = 0, int64_t ldy = 0);
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               int64_t ldq = 0, int64_t ldk = 0, int64_t ldv = 0, int64_t ldo = 0);

// The arithmetic of the Precision::kFast attention (AVX512_BF16): q·scale·log2(e) and k rounded
// to bf16, scores s = Σ q'·k' in log2 units (double); then the flash kernel's online softmax over
// key blocks of kAttnBf16KeyBlock: per block m' = max(m, block max), the sums so far scaled by
// 2^(m − m'), p = 2^(s − m') added to l unrounded and as bf16(p)·bf16(v) to the output; out = o / l.
// The kernel sums in float32 and its exp2 is within 3e-7, so a p near a bf16 rounding boundary may
// round the other way there: |kernel − this| ≤ 2^-8·max|v| (one such p at most 2^-8 relative),
// typically float32 summation error. 512 keys: the kernels rescale O and reduce the row max and
// sum once per block, and the AMX kernel keeps O in its tiles for the block's keys (128 made the
// AMX attention ~10 % slower at S = 1792).
constexpr int64_t kAttnBf16KeyBlock = 512;
void attention_bf16(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
                    int Hkv, int D, float scale, const AttnMask& mask, int64_t ldq = 0, int64_t ldk = 0,
                    int64_t ldv = 0, int64_t ldo = 0);

// The references of the fast (reduced-precision) linear kernels (linear_lowp_ref.cpp).
//
// linear_bf16: the bf16 dot-product GEMM — x and W (any format, dequantised to f32) rounded to
// bf16 with round-to-nearest-even (f32_to_bf16, as torch's .to(bfloat16)), products summed in
// double, + bias, rounded to float.
void linear_bf16(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx = 0, int64_t ldy = 0);

// Per-token (per row) symmetric int8 quantization of activations, the W8A8 recipe. Exactly:
//   amax = max_k |x[k]|                       (float32)
//   s    = amax / 127.0f                      (float32 division, round-to-nearest-even)
//   q[k] = clamp(rne(x[k] / s), -127, 127)    (float32 division; rne = round half to even, as
//                                              torch.round / nearbyint in the default mode)
// and s = 0, q = 0 for an all-zero row. In PyTorch: s = x.abs().amax(-1, keepdim=True) / 127;
// q = torch.where(s > 0, (x / s).round().clamp(-127, 127), 0). A row with a NaN has s = NaN
// (amax keeps it, wherever it is), one with ±inf and no NaN s = +inf; both q = 0, so the row's
// outputs s · 0 · … are NaN, as a float GEMM's would be non-finite.
void quantize_row_int8(const float* x, int64_t K, int8_t* q, float* s);

// The int32 accumulators of the W8A8 GEMM: acc[m, n] = Σ_k q[m, k] · W[n, k] (exact), for
// q [M, K] int8 (row stride K) and W a Q8_ROW weight; acc is [M, N].
void int8_accumulators(const int8_t* q, int64_t M, int64_t K, const Weight& W, int32_t* acc);

// W8A8 linear for a Q8_ROW weight: x quantized per row (quantize_row_int8), int32 accumulators,
// then, each step rounded to float32 (no fused multiply-add):
//   y[m, n] = (float(acc[m, n]) · s_x[m]) · s_w[n] + bias[n]
// (s_w: the weight's row scale as float32; float(acc) rounds to nearest even). The fast int8
// kernels produce exactly these bits.
void linear_w8a8(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx = 0, int64_t ldy = 0);

// W4A8 linear for a Q4_G64 weight (nibbles w ∈ 0..15, per group g of 64 along K a scale s_g and
// offset o_g): x quantized per row as quantize_row_int8 (q, s_x), then per output n
//   A_g = Σ_{k∈g} q[k] · w[n, k]   (int32, exact)        X_g = Σ_{k∈g} q[k]   (int32)
//   y[m, n] = s_x · Σ_g (s_g · A_g + o_g · X_g) + bias[n]
// — x_q · dequant(W)ᵀ exactly, since dequant = o + s·w — summed here in double and rounded to
// float once; the kernels sum the groups in float32, so tests bound their error against this.
void linear_w4a8(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx = 0, int64_t ldy = 0);

// The fast linear of a ggml block weight (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K): x quantized
// per block as llama.cpp does (block_q8_0 / block_q8_K), int32 dot products per sub-block, the
// float32 steps of kernels/ggml_dot.h in order (fused multiply-adds). The SIMD kernels
// (gemm_ggml_*.cpp) produce exactly these bits. Throws std::invalid_argument for another format.
void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
                 int64_t ldx = 0, int64_t ldy = 0);
}  // namespace ref

}  // namespace klein::kernels
