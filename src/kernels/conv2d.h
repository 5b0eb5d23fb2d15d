// 2-D convolution, NCHW float32 activations, weights [Cout, Cin, kh, kw] in any stored dtype
// (f32/f16/bf16, and the quantized row formats through weight_row_to_f32) — the VAE's only
// heavy op. Besides stride and (asymmetric) zero padding, the kernel can fold in the cheap
// element-wise steps that surround every VAE conv, so no extra full-size tensor is needed:
//   - a per-input-channel prologue  v = scale[c]·x + shift[c], optionally followed by SiLU
//     (GroupNorm + SiLU expressed per channel), applied to in-bounds input only — the zero
//     padding is added after it, exactly as conv(pad(silu(gn(x)))) does;
//   - nearest-neighbour ×2 upsampling of the input (diffusers Upsample2D) before padding;
//   - accumulation into the output (out += conv(x)), for residual adds.
// The fast paths (x86: AVX2/FMA in src/kernels/cpu/conv2d_avx2.cpp, AVX-512F and AVX512_BF16 in
// conv2d_avx512*.cpp) pack im2col panels of ≤ 256 output pixels × 256 reduction units straight
// from the input (never a full im2col matrix) and multiply them with register-blocked
// micro-kernels (6×16 ymm, 14×32 zmm); for ≤ 6 output channels they convolve directly from
// padded input row strips. Under Precision::kFast on AVX512_BF16 CPUs the operands are rounded
// to bf16 (ref::conv2d_bf16); on the others the same-padded 3×3 convs run in the float32
// Winograd form (ref::conv2d_winograd).
// Without AVX2 a portable path (im2col in pixel blocks + the scalar linear) runs instead. Which
// one runs is chosen by the kernel registry (kernels/registry.h, run_conv2d).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "core/weight.h"

namespace klein::kernels {

struct Conv2dParams {
  int stride = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  // Read the input through nearest ×2 upsampling: the conv sees a [Cin, 2H, 2W] image with
  // up[y][x] = in[y/2][x/2]. Padding applies to the upsampled image.
  bool upsample2x = false;
  // Optional prologue per input channel c (both null = identity): v = in_scale[c]·x + in_shift[c]
  // (a null in_shift means 0), then v = silu(v) when in_silu. in_silu alone applies plain SiLU.
  const float* in_scale = nullptr;
  const float* in_shift = nullptr;
  bool in_silu = false;
  // out += conv(x) + bias instead of out = conv(x) + bias.
  bool accumulate = false;

  static Conv2dParams same(int k) {  // stride 1, symmetric "same" padding for odd k
    Conv2dParams p;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = k / 2;
    return p;
  }
};

// Output size along one axis: (in·(up ? 2 : 1) + pad_a + pad_b − k) / stride + 1 (≤ 0: empty).
int64_t conv2d_out_size(int64_t in, int64_t k, int stride, int pad_a, int pad_b, bool upsample2x);

// Arguments of the conv kernels (run_conv2d in kernels/registry.h validates them):
// in: [N, Cin, H, W] contiguous; w: [Cout, Cin, kh, kw]; bias: [Cout] (f32/f16/bf16) or null;
// out: [N, Cout, OH, OW] contiguous (sizes from conv2d_out_size). `out` must not overlap `in`.

// The sub-pixel form of a nearest ×2 upsampling followed by a 3×3 conv with padding 1 and stride 1
// (the VAE decoder's Upsample2D): output pixel (2a + dy, 2b + dx) reads input rows a − 1 + dy + ty
// and columns b − 1 + dx + tx only (ty, tx ∈ {0, 1}), so each of the four phases (dy, dx) is a 2×2
// conv of the input itself whose tap (ty, tx) is the sum of the 3×3 taps ky ∈ [subpixel_lo(dy, ty),
// subpixel_hi(dy, ty)], kx likewise — 4 products per output pixel and channel instead of 9. The
// AVX512_BF16 conv computes these convs so under Precision::kFast, the sums formed in float (ky
// then kx ascending, from 0) and rounded to bf16 (ref::conv2d_bf16_subpixel).
bool conv2d_subpixel_form(int64_t KH, int64_t KW, const Conv2dParams& p);
constexpr int subpixel_lo(int d, int t) { return t == 0 ? 0 : 1 + d; }
constexpr int subpixel_hi(int d, int t) { return t == 0 ? d : 2; }
// Tap (ty, tx) of phase (dy, dx) from one 3×3 kernel k[ky·3 + kx], summed as described above.
inline float subpixel_tap(const float* k, int dy, int dx, int ty, int tx) {
  float s = 0.0f;
  for (int ky = subpixel_lo(dy, ty); ky <= subpixel_hi(dy, ty); ++ky)
    for (int kx = subpixel_lo(dx, tx); kx <= subpixel_hi(dx, tx); ++kx) s += k[ky * 3 + kx];
  return s;
}

// The Winograd form F(2×2, 3×3) of a stride-1 3×3 conv with padding 1 (no upsampling): each 2×2
// block of output pixels (a tile) reads a 4×4 window d of the padded input, and
//   Y = Aᵀ [ Σ_ci (G g Gᵀ) ⊙ (Bᵀ d B) ] A
// with Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1], G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1] and
// Aᵀ = [1 1 1 0; 0 1 −1 −1]: 16 products per tile and channel pair where the direct form has 36.
// Under Precision::kFast the AVX512_BF16 conv computes these convs so, the transformed input
// V = Bᵀ d B and weight U = G g Gᵀ formed in float by the two functions below (which both it and
// ref::conv2d_bf16_winograd call, so the roundings agree) and rounded to bf16 once; the 16
// element-wise products are summed over channels, then Aᵀ M A.
bool conv2d_winograd_form(int64_t KH, int64_t KW, const Conv2dParams& p);
// The shapes the float32 Winograd conv takes (the AVX2 conv under Precision::kFast,
// ref::conv2d_winograd): conv2d_winograd_form's, and also with the ×2 upsampling, whose tiles then
// cover the upsampled image (16 products per 4 outputs either way, as the sub-pixel form's 4 per
// output). U and V stay float32: the form's only difference from the direct conv is the order
// and grouping of the float operations.
bool conv2d_winograd_f32_form(int64_t KH, int64_t KW, const Conv2dParams& p);
// The three transforms, on any arithmetic type T with +, − and × by a float: float and double
// (the references), or a GCC vector of floats (__m256, __m512: the kernels run them on 8 or 16
// tiles or kernels at once, lane l ↔ tile or kernel l) — the same operations in the same order
// whatever T, so a kernel's U and V have the reference's bits.
// v[i·4 + j] = (Bᵀ d B)[i][j] of a row-major 4×4 window d: along each row first, then down the
// columns, in this order of float operations.
template <class T>
inline void winograd_input_tile(const T* d, T* v) {
  T e[16];
  for (int r = 0; r < 4; ++r) {
    const T* x = d + 4 * r;
    e[4 * r + 0] = x[0] - x[2];
    e[4 * r + 1] = x[1] + x[2];
    e[4 * r + 2] = x[2] - x[1];
    e[4 * r + 3] = x[1] - x[3];
  }
  for (int j = 0; j < 4; ++j) {
    v[0 + j] = e[0 + j] - e[8 + j];
    v[4 + j] = e[4 + j] + e[8 + j];
    v[8 + j] = e[8 + j] - e[4 + j];
    v[12 + j] = e[4 + j] - e[12 + j];
  }
}
// u[i·4 + j] = (G g Gᵀ)[i][j] of a row-major 3×3 kernel g, down the columns first, then along the rows.
template <class T>
inline void winograd_weight_tile(const T* g, T* u) {
  T h[12];  // [4][3]
  for (int c = 0; c < 3; ++c) {
    h[0 + c] = g[c];
    h[3 + c] = (g[c] + g[3 + c] + g[6 + c]) * 0.5f;
    h[6 + c] = (g[c] - g[3 + c] + g[6 + c]) * 0.5f;
    h[9 + c] = g[6 + c];
  }
  for (int i = 0; i < 4; ++i) {
    const T* x = h + 3 * i;
    u[4 * i + 0] = x[0];
    u[4 * i + 1] = (x[0] + x[1] + x[2]) * 0.5f;
    u[4 * i + 2] = (x[0] - x[1] + x[2]) * 0.5f;
    u[4 * i + 3] = x[2];
  }
}
// y[dy·2 + dx] = (Aᵀ M A)[dy][dx] of a tile's 16 sums m[ξ]: M A first, then Aᵀ.
template <class T>
inline void winograd_output_tile(const T* m, T* y) {
  T s[8];  // [4][2]: M A
  for (int i = 0; i < 4; ++i) {
    s[2 * i] = m[4 * i] + m[4 * i + 1] + m[4 * i + 2];
    s[2 * i + 1] = m[4 * i + 1] - m[4 * i + 2] - m[4 * i + 3];
  }
  for (int k = 0; k < 2; ++k) {
    y[k] = s[k] + s[2 + k] + s[4 + k];
    y[2 + k] = s[2 + k] - s[4 + k] - s[6 + k];
  }
}

namespace ref {
// Scalar reference: materialises the transformed (upsampled, prologue-applied) input, then the
// plain 7-deep loop accumulating in double. The yardstick for the fast paths; slow.
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, const Conv2dParams& p);
// The arithmetic of the Precision::kFast conv (AVX512_BF16): the transformed input and the weight
// rounded to bf16 (round-to-nearest-even), then the same double sums; bias and output in float.
void conv2d_bf16(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, const Conv2dParams& p);
// conv2d_bf16's arithmetic on the sub-pixel form (conv2d_subpixel_form(3, 3, p) must hold): the
// transformed input and each phase's summed taps (subpixel_tap of the float weight) rounded to
// bf16, double sums. Equal to conv2d_bf16 up to the rounding of the summed taps.
void conv2d_bf16_subpixel(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                          const Weight* bias, float* out, const Conv2dParams& p);
// conv2d_bf16's arithmetic on the Winograd form (conv2d_winograd_form(3, 3, p) must hold): the
// transformed input in float (not rounded), each tile's V = winograd_input_tile and each kernel's
// U = winograd_weight_tile rounded to bf16, Σ_ci U ⊙ V and Aᵀ M A in double. Equal to
// conv2d up to those roundings.
void conv2d_bf16_winograd(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                          const Weight* bias, float* out, const Conv2dParams& p);
// The float32 Winograd form (conv2d_winograd_f32_form(3, 3, p) must hold): the transformed (and
// upsampled) input's V = winograd_input_tile and each kernel's U = winograd_weight_tile in float,
// Σ_ci U ⊙ V and Aᵀ M A in double. Equal to conv2d up to the float rounding of U and V.
void conv2d_winograd(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                     const Weight* bias, float* out, const Conv2dParams& p);
}  // namespace ref

namespace blocked {
// The portable path, the registry's scalar conv2d: im2col of a block of output pixels into
// [pixels, Cin·kh·kw] rows, the scalar linear against the weight, transposed store. Memory is
// bounded by the pixel block, not the image. Arguments validated by the caller (run_conv2d);
// OH/OW precomputed and ≥ 1.
void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool);
}  // namespace blocked

}  // namespace klein::kernels
