// Scalar dequantisation of ggml's block formats (GGUF files), rows of the format table
// (core/format.h). Transcribed from ggml's dequantize_row_* (ggml/src/ggml-quants.c) with the
// same float operations in the same order, so that a row equals ggml's and gguf-py's
// dequantisation bit for bit (this file builds with -ffp-contract=off: no fused multiply-add).
//
// Each function has FormatTraits::row_to_f32's contract: elements [c0, c0 + n) of row r of w,
// c0 and n multiples of the block size; a row is row_bytes() bytes of whole blocks.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace klein {

struct Weight;

namespace ggml_rows {

inline constexpr int64_t kQK = 32;    // elements per block of Q4_0 ... Q8_0
inline constexpr int64_t kQKK = 256;  // elements per K-quant super-block

void q8_0(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q4_0(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q4_1(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q5_0(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q5_1(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q2_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q3_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q4_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q5_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);
void q6_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out);

// Byte offsets of the fp16 fields (d, and dmin / m where the format has one) inside one block of
// a ggml block format, written to offs; returns how many (0 for other formats). Test and writer
// code that makes valid blocks from random bytes needs them.
int half_fields(DType t, int offs[2]);

}  // namespace ggml_rows
}  // namespace klein
