// The scalar references of the dense kernels (src/kernels/ref/): the plainest correct code, the
// yardstick every fast kernel is tested against and the kScalar rows of the kernel registry
// (kernels/registry.h; the validated entry points run_linear / run_attention are there).
//
// linear:    y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]), W in any weight format; ldx / ldy are the
//            row strides of x and y in floats (0 = K / N).
// attention: multi-head SDPA, token-major q [Sq, Hq, D] at row stride ldq, k/v [Sk, Hkv, D] at
//            ldk/ldv, out [Sq, Hq, D] at ldo (0 = H·D); GQA: query head h reads kv head
//            h / (Hq / Hkv); a query row with no visible key gives zeros.
#pragma once

#include <cstdint>

#include "core/attn_mask.h"
#include "core/weight.h"

namespace klein::kernels {

using klein::AttnMask;  // core/attn_mask.h

namespace ref {
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
            int64_t ldx = 0, int64_t ldy = 0);
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               int64_t ldq = 0, int64_t ldk = 0, int64_t ldv = 0, int64_t ldo = 0);
}  // namespace ref

}  // namespace klein::kernels
