// Host-side preparation of weights for the CUDA backend: any stored format of core/format.h →
// the format the device computes with, row-major. Pure host code with no CUDA dependency, so it
// is compiled (and tested against the CPU's dequantisation) in every build, the default one too.
//
// The device formats are deliberately few: the GEMMs read bf16 (Precision::kFast: tensor cores,
// fp32 accumulation) or f32 (Precision::kFp32: the exact path) matrices, and every 1-D tensor
// (biases, norm weights) stays f32 so epilogues and norms add exact values. Quantized weights
// (Q8_ROW, Q4_G64) are dequantised here, once, with the format table's row → f32 — the same
// values the CPU's fp32 kernels compute with — and rounded to bf16 where bf16 is the target.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/thread_pool.h"
#include "core/weight.h"

namespace klein::cuda_pack {

enum class Target : uint8_t { kF32, kBF16 };

// The device format of `w`: f32 for 1-D tensors (and everything under fp32), bf16 for
// matrices (2-D, or 4-D conv kernels seen as [Cout, Cin·kh·kw]) when `bf16_matrices`.
Target target_for(const Weight& w, bool bf16_matrices);
// Bytes of one packed element / of all of `w` packed as `t`.
int64_t target_size(Target t);
int64_t packed_bytes(const Weight& w, Target t);
// DType a packed weight carries afterwards (kF32 or kBF16).
DType target_dtype(Target t);

// Why `w` cannot be packed (a status naming the tensor), or Ok: host memory, row-major layout,
// a format with row → f32, byte size consistent with the shape.
Status check_packable(const Weight& w);

// Writes rows [r0, r1) of `w` (outer dimension; all trailing dimensions as one row) packed as
// `t` to `out` ((r1 − r0) · cols elements). BF16 → bf16 and F32 → f32 are copies (bit-exact);
// everything else goes through weight_to_f32 (the CPU's dequantisation) and, for bf16, round to
// nearest even (f32_to_bf16, torch's .to(bfloat16)). Rows are split over `pool` when given.
Status pack_rows(const Weight& w, int64_t r0, int64_t r1, Target t, void* out, ThreadPool* pool = nullptr);

// Rows per chunk so that one chunk of packed rows is about `chunk_bytes` (at least 1 row).
int64_t rows_per_chunk(const Weight& w, Target t, int64_t chunk_bytes);

}  // namespace klein::cuda_pack
