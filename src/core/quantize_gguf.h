// ggml's reference quantizers (ggml/src/ggml-quants.c quantize_row_*_ref: the recipes
// llama-quantize, stable-diffusion.cpp's convert and gguf-py use without an importance matrix),
// transcribed with the same float operations in the same order so that the blocks equal ggml's
// byte for byte (this file builds with -ffp-contract=off, as ggml's base library, built for
// baseline x86-64, has no fused multiply-add to contract into). The K-quants keep ggml's helper
// searches (make_qkx2_quants for Q2_K / Q4_K / Q5_K, make_q3_quants for Q3_K, make_qx_quants
// for Q6_K).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace klein::ggml_quant {

// Whether `t` is a ggml type this file writes (the block formats of core/format_gguf.h, and
// F32 / F16 / BF16).
bool writable(DType t);
// Elements per block of `t` (32, 256, or 1 for F32 / F16 / BF16) and bytes per block.
int64_t block_elems(DType t);
int64_t block_bytes(DType t);
// Bytes of a row of n elements (n a multiple of block_elems(t)).
inline int64_t row_bytes(DType t, int64_t n) { return n / block_elems(t) * block_bytes(t); }

// Quantizes n floats (a multiple of block_elems(t)) into row_bytes(t, n) bytes at out: ggml's
// quantize_row_<t>_ref, or ggml's fp32 → fp16 / bf16 conversions (round to nearest even; bf16
// keeps NaNs quiet, as ggml_compute_fp32_to_bf16).
void quantize_row(DType t, const float* x, int64_t n, uint8_t* out);

}  // namespace klein::ggml_quant
