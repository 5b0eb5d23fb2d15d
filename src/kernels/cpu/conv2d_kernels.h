// Entry points of the x86 conv2d kernels: the AVX2/FMA implicit GEMM (conv2d_avx2.cpp) and float32
// Winograd form (conv2d_winograd_avx2.cpp), and the
// AVX-512 ones (conv2d_avx512*.cpp), and the AMX one (conv2d_amx.cpp). x86-64 only; the kernel registry's Isa::kAvx2 /
// kAvx512 / kAvx512Bf16 conv2d rows, called by run_conv2d with validated arguments:
// as kernels::conv2d, OH/OW precomputed and ≥ 1; Cin, H, W ≥ 1.
#pragma once

#include <cstdint>

#include "kernels/conv2d.h"

namespace klein::kernels {

namespace avx2 {  // Isa::kAvx2, exact: float32 FMA, any weight format (expanded to f32)
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool);
// Whether conv2d takes its direct path (few output channels, stride 1) rather than the implicit
// GEMM; the AVX-512 convs hand those convs to it.
bool conv2d_is_direct(int64_t Cout, const Conv2dParams& p);
// Isa::kAvx2, fast (conv2d_winograd_avx2.cpp): the convs conv2d_winograd_f32 accepts in the
// float32 Winograd form (ref::conv2d_winograd's arithmetic), the others as conv2d.
void conv2d_fast(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
                 ThreadPool& pool);
// Whether the fast convs (this one and avx512::conv2d_fast) take the Winograd form: a stride-1
// 3×3 conv with padding 1 (with or without upsampling), ≥ 16 input channels and more output
// channels than the direct path takes.
bool conv2d_winograd_f32(const Conv2dParams& p, int64_t Cin, int64_t Cout, int64_t KH, int64_t KW);
// The Winograd form itself (conv2d_winograd_f32 must hold); output [N, Cout, H·u, W·u].
void conv2d_winograd(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                     const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool);
}  // namespace avx2

namespace avx512 {  // Isa::kAvx512, exact: float32 FMA on 14×32 zmm tiles
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool);
// Isa::kAvx512, fast: avx2::conv2d_winograd where avx2::conv2d_winograd_f32 says so (the same
// ymm code, so the same bits as avx2::conv2d_fast there), conv2d otherwise.
void conv2d_fast(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
                 ThreadPool& pool);
}  // namespace avx512

namespace avx512bf16 {  // Isa::kAvx512Bf16, fast: input (after the prologue) and weights rounded to
                        // bf16, vdpbf16ps, float32 sums — ref::conv2d_bf16's arithmetic
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool);
// Whether conv2d (and amx::conv2d) computes this conv in its sub-pixel form
// (ref::conv2d_bf16_subpixel's arithmetic) rather than as ref::conv2d_bf16: a 3×3 upsampling conv
// with padding 1 and more output channels than the float32 direct path takes.
bool conv2d_subpixel(const Conv2dParams& p, int64_t Cout, int64_t KH, int64_t KW);
// Whether conv2d (and amx::conv2d) computes this conv in its Winograd form F(2×2, 3×3)
// (ref::conv2d_bf16_winograd's arithmetic): a stride-1 3×3 conv with padding 1, no upsampling,
// ≥ 16 input channels and more output channels than the float32 direct path takes.
bool conv2d_winograd(const Conv2dParams& p, int64_t Cin, int64_t Cout, int64_t KH, int64_t KW);
}  // namespace avx512bf16

namespace amx {  // Isa::kAmx, fast: avx512bf16::conv2d's arithmetic with tdpbf16ps tile products,
                 // in the same forms (direct, sub-pixel and Winograd where avx512bf16's predicates
                 // say so; conv2d_amx.cpp)
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool);
}  // namespace amx

}  // namespace klein::kernels
