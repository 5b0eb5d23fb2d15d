// Entry point of the AVX2/FMA conv2d (conv2d_avx2.cpp). x86-64 only; the kernel
// registry's Isa::kAvx2 conv2d row, called by run_conv2d with validated arguments.
#pragma once

#include <cstdint>

#include "kernels/conv2d.h"

namespace klein::kernels::avx2 {

// Arguments as kernels::conv2d; OH/OW precomputed and ≥ 1; Cin, H, W ≥ 1.
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool);

}  // namespace klein::kernels::avx2
