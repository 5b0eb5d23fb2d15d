// Compute kernels used by the models. The implementations per weight format and ISA
// (src/kernels/cpu/, the scalar references in src/kernels/ref/) are listed in the kernel registry
// (kernels/registry.h); the free functions here run the process-wide best selection
// (host_kernels()) and remain only until the models call the CPU backend, which holds its own.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "backend/backend.h"
#include "core/weight.h"

namespace klein::kernels {

// y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]).  W may be any weight dtype (f32/f16/bf16, and the
// quantized ones once supported); bias is f32/f16/bf16 or null. Accumulation is float32.
// ldx / ldy: row strides of x and y in floats (0 = K / N).
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
            ThreadPool& pool, int64_t ldx = 0, int64_t ldy = 0);

using klein::AttnMask;  // backend/backend.h

// Multi-head scaled-dot-product attention without materialising the [H, Sq, Sk] score matrix
// (blocked online softmax). Token-major layouts, as produced by a Linear:
//   q: [Sq, Hq, D] at row stride ldq,  k/v: [Sk, Hkv, D] at strides ldk/ldv,
//   out: [Sq, Hq, D] at row stride ldo (strides in floats; 0 = H*D).
// GQA: query head h reads kv head h / (Hq / Hkv). A query row with no visible key gives zeros.
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               ThreadPool& pool, int64_t ldq = 0, int64_t ldk = 0, int64_t ldv = 0,
               int64_t ldo = 0);

namespace ref {
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias, float* y,
            int64_t ldx = 0, int64_t ldy = 0);
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               int64_t ldq = 0, int64_t ldk = 0, int64_t ldv = 0, int64_t ldo = 0);
}  // namespace ref

}  // namespace klein::kernels
