// The registry's kScalar linear and attention: the scalar references (src/kernels/ref/) adapted
// to the registry signatures and spread over the thread pool. Plain C++, so every CPU has them.
// Arguments validated and strides resolved by the caller (run_linear / run_attention).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/kernels.h"

namespace klein::kernels::scalar {

// ref::linear on blocks of rows of x; bias_f32 is [N] float32 or null. M, N ≥ 1.
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy);

// ref::linear_w8a8 on blocks of rows of x (Q8_ROW weights; the fast W8A8 reference).
void linear_w8a8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy);
// ref::linear_w4a8 on blocks of rows of x (Q4_G64 weights; the fast W4A8 reference).
void linear_w4a8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy);

// ref::linear_ggml on blocks of rows of x (ggml block weights; the fast GGUF reference).
void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy);

// ref::attention per kv head (with its group of query heads).
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk,
               int Hq, int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool,
               int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo);

}  // namespace klein::kernels::scalar
