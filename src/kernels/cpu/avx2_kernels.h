// Entry points of the AVX2/FMA/F16C implementations (src/kernels/cpu/*_avx2.cpp). Only compiled
// on x86-64 (KLEIN_X86) and only reached through the kernel registry's Isa::kAvx2 rows, which a
// KernelSet selects only on CPUs that have AVX2/FMA/F16C. Arguments are already validated and
// strides resolved (no zeros) by run_linear / run_attention.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/kernels.h"

namespace klein::kernels::avx2 {

// y[M, N] = x[M, K] · W[N, K]ᵀ + bias[N]; bias_f32 is [N] float32 or null. M, N, K ≥ 1.
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32,
            float* y, ThreadPool& pool, int64_t ldx, int64_t ldy);

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               ThreadPool& pool, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo);

}  // namespace klein::kernels::avx2
