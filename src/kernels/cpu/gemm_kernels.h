// Entry points of the wide / dot-product GEMMs (gemm_avx512*.cpp, gemm_int8_*.cpp). Only compiled on x86-64
// (KLEIN_X86) and only reached through the kernel registry's rows of their ISA, which a
// KernelSet selects only on CPUs that have it. Arguments validated and strides resolved (no
// zeros) by run_linear; bias_f32 is [N] float32 or null; M, N, K ≥ 1.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"

namespace klein::kernels {

namespace avx512 {  // Isa::kAvx512, exact: float32 FMA, any weight format (expanded to f32)
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy);
}

namespace avx512bf16 {  // Isa::kAvx512Bf16, fast: x and W rounded to bf16, vdpbf16ps, f32 sums
void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear with the SwiGLU fused (registry.h's LinearSwigluFn; gemm_direct.h), for BF16 weights with
// an even K; false otherwise.
bool linear_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                   ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
// Flash attention with bf16 Q·Kᵀ and P·V products (ref::attention_bf16's arithmetic); arguments
// as kernels::attention, validated and strides resolved by run_attention.
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
               int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool, int64_t ldq, int64_t ldk,
               int64_t ldv, int64_t ldo);
}

// Q8_ROW weights, W8A8 (fast): x quantized per row (ref::quantize_row_int8), int32 sums,
// y = (float(acc) · sx) · sw + bias — bit-identical to ref::linear_w8a8.
namespace avx512vnni {  // Isa::kAvx512Vnni: vpdpbusd on zmm
void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear_q8 with the SwiGLU fused (registry.h's LinearSwigluFn; gemm_direct.h).
bool linear_q8_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
// Q4_G64 weights, W4A8 (fast): x quantized per row, nibbles × int8 by vpdpbusd per group of 64,
// the group's scale and offset folded in float32 (ref::linear_w4a8's arithmetic, float sums).
void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear_q4 with the SwiGLU fused (gemm_w4a8_direct.h).
bool linear_q4_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
// ggml block weights (GGUF Q8_0 ... Q6_K), fast: x quantized per block as llama.cpp does, int8
// dot products per sub-block — bit-identical to ref::linear_ggml (gemm_ggml_avx512vnni.cpp).
void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy);
}
namespace amx {  // Isa::kAmx: tile products (gemm_amx.cpp)
// Q8_ROW, W8A8 with tdpbssd: bit-identical to ref::linear_w8a8, as avx512vnni::linear_q8.
void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// Float weight formats, bf16 with tdpbf16ps: x and W rounded to bf16, float32 sums
// (ref::linear_bf16's arithmetic, as avx512bf16::linear).
void linear_bf16(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear_q8 / linear_bf16 with the SwiGLU in the epilogue (registry.h's LinearSwigluFn): W =
// [gate; up], out [M, W.rows() / 2] at row stride ldo; the same bits as the linear followed by
// the AVX-512 element-wise silu_mul.
bool linear_q8_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
bool linear_bf16_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                        ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
// Q4_G64, W4A8 with tdpbusd per group of 64 and the VNNI kernel's float32 folding (the same bits
// as avx512vnni::linear_q4; gemm_w4a8_amx.cpp).
void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear_q4 with the SwiGLU in the epilogue, as linear_q8_swiglu.
bool linear_q4_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
// Flash attention with bf16 tile products (ref::attention_bf16's arithmetic, as
// avx512bf16::attention; attention_amx.cpp).
void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
               int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool, int64_t ldq, int64_t ldk,
               int64_t ldv, int64_t ldo);
}
namespace avxvnni {  // Isa::kAvxVnni: vpdpbusd on ymm (VEX)
void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear_q8 with the SwiGLU fused (registry.h's LinearSwigluFn; gemm_direct.h).
bool linear_q8_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
// Q4_G64 weights, W4A8 as avx512vnni::linear_q4 (the same bits; gemm_w4a8_avxvnni.cpp).
void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// linear_q4 with the SwiGLU fused (gemm_w4a8_direct.h).
bool linear_q4_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
}
namespace avx2 {  // Isa::kAvx2: vpmaddubsw + vpmaddwd
void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// Q4_G64 weights, W4A8 as avx512vnni::linear_q4 (the same bits) with vpmaddubsw int16 chains.
void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy);
// ggml block weights, as avx512vnni::linear_ggml (the same bits) with vpmaddubsw (gemm_ggml_avx2.cpp).
void linear_ggml(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy);
}

}  // namespace klein::kernels
