// The weight quantization recipes of `klein quantize` (q8 → Q8_ROW, q4 → Q4_G64), written so a
// Python reference reproduces them bit for bit. Inputs are float32 (a bf16 / f16 weight widened
// exactly); every operation below is one float32 IEEE operation, round-to-nearest-even, no FMA.
#pragma once

#include <cstdint>

namespace klein {

// q8, one output row of n weights (symmetric, per row):
//   amax  = max_k |w[k]|                          (float32)
//   scale = amax / 127.0f                         (float32 division)
//   q[k]  = clamp(rne(w[k] / scale), -127, 127)   (float32 division; rne = round half to even)
// and scale = 0, q = 0 for an all-zero row. Returns the scale (stored f32 as X.weight_scale).
// PyTorch: s = w.float().abs().amax(1, keepdim=True) / 127;
//          q = torch.where(s > 0, (w.float() / s).round().clamp(-127, 127), 0).to(torch.int8)
float quantize_row_q8(const float* w, int64_t n, int8_t* q);

// q4, one group of 64 weights: MLX's affine quantization exactly as mlx::core::fast::Quantize
// computes it on the CPU (mlx/backend/cpu/quantized.cpp, `quantize`), n_bins = 15, eps = 1e-7:
//   lo, hi = min_k w[k], max_k w[k]
//   flip   = |lo| > |hi|
//   scale  = max((hi - lo) / 15, 1e-7);  scale = flip ? scale : -scale
//   edge   = flip ? lo : hi
//   q0     = rint(edge / scale)
//   bias   = 0;  if q0 != 0: scale = edge / q0, bias = edge
//   q[k]   = clamp(rint((w[k] - bias) / scale), 0, 15)
// (rint: round half to even). So the edge value is exact and 0 maps to an integer; when |hi| ≥
// |lo| the scale is negative and the bias is the maximum. Nibbles are packed low-first (element
// 2b in the low nibble of byte b: MLX's uint32 words on a little-endian machine). The float32
// scale and bias are what q was computed with; they are stored rounded to bf16 (RNE) as MLX
// stores them for a bf16 weight (X.scales, X.biases), and dequantisation is bias + scale · q.
void quantize_group_q4(const float* w, uint8_t packed[32], float* scale, float* bias);

}  // namespace klein
