// The CUDA backend's kernels, as host-callable launchers (implemented in the *.cu files beside
// this header). Every launcher enqueues on `stream` and returns the launch's cudaError_t
// (cudaGetLastError), which the backend turns into a Status naming the op; faults inside a
// kernel surface at the next synchronisation (download, all_finite, sync).
//
// Matrices are float32 rows × cols at a row stride `ld` (elements), as TensorView's matrix form;
// every element-wise launcher takes the strides of each operand. The arithmetic of each kernel
// follows the CPU reference it replaces (src/kernels/ref/elementwise_ref.cpp, conv2d_ref.cpp,
// attention_ref.cpp) operation by operation — float products and sums rounded as written there
// (the __f*_rn intrinsics keep nvcc from contracting them into FMAs), statistics in double — so
// the element-wise ops agree with the CPU to the last bit or two; only expf differs by an ulp.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace klein::cuda_kernels {

// cudaSuccess if this build's kernels can run on the current device (they are compiled for
// CMAKE_CUDA_ARCHITECTURES only); cudaErrorNoKernelImageForDevice or similar otherwise.
cudaError_t kernels_available();

// ---- conversions
// y[r·cols + c] = bf16(x[r·ldx + c]) (round to nearest even): a GEMM's activations, contiguous.
cudaError_t f32_to_bf16(const float* x, int64_t rows, int64_t cols, int64_t ldx, void* y, cudaStream_t s);
// y[r, c] = bias ? bias[c] : 0 (a linear with K = 0).
cudaError_t fill_bias_rows(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias, cudaStream_t s);

// ---- row normalisations (one warp per row; statistics in double)
enum class RowNorm { kRms, kLayer, kModulated };
// kRms: y = w·(x·rsqrt(mean(x²) + eps)) (w may be null); kLayer: LN(x)·w + b (each may be null);
// kModulated: y = a·LN(x) + b with a = onep, b = shift (both required). x may alias y.
cudaError_t row_norm(RowNorm kind, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows, int64_t cols,
                     const float* a, const float* b, float eps, cudaStream_t s);

// ---- GroupNorm statistics of x [groups, n] (contiguous; n = C/groups · H·W)
// Per group and chunk of the group's n values: {count, mean, M2} in double, two passes per
// chunk, into partial[(g·chunks + j)·3 + {0, 1, 2}].
cudaError_t group_moments(const float* x, int64_t groups, int64_t n, int chunks, double* partial, cudaStream_t s);
// Merges a group's chunks (Chan et al.) and writes the channel affine of its cpg channels:
// scale[c] = gamma[c]·rstd, shift[c] = beta[c] − mean·scale[c], mean and rstd rounded to float as
// the CPU's mean_rstd does.
cudaError_t group_affine(const double* partial, int64_t groups, int chunks, int64_t cpg, double eps,
                         const float* gamma, const float* beta, float* scale, float* shift, cudaStream_t s);

// ---- position encodings (in place on x [rows, heads·D] at row stride ld)
cudaError_t rope_half(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* cos, const float* sin,
                      cudaStream_t s);
cudaError_t rope_interleaved(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* cos,
                             const float* sin, cudaStream_t s);
// RMSNorm over each head's D values (weight w [D]) then interleaved RoPE; one warp per (row, head).
cudaError_t qk_norm_rope(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* w, float eps,
                         const float* cos, const float* sin, cudaStream_t s);

// ---- element-wise
cudaError_t swiglu(const float* gate, int64_t ldg, const float* up, int64_t ldu, float* out, int64_t ldo,
                   int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t gated_add(float* h, int64_t ldh, const float* o, int64_t ldo, const float* gate, int64_t rows,
                      int64_t cols, cudaStream_t s);
cudaError_t add(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t add_scalar(const float* x, int64_t ldx, float c, float* y, int64_t ldy, int64_t rows, int64_t cols,
                       cudaStream_t s);
cudaError_t silu(float* x, int64_t ldx, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t scale_shift(const float* x, int64_t ldx, float* y, int64_t ldy, const float* scale, const float* shift,
                        bool per_row, int64_t rows, int64_t cols, cudaStream_t s);

// ---- data movement
// dst[c, r] (+)= src[r, c]; 32×32 tiles through shared memory.
cudaError_t transpose(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows, int64_t cols,
                      bool accumulate, cudaStream_t s);
// out[i, :] = table row ids[i] as float; table f32 or bf16 (`bf16`), rows of `cols`; ids on the device.
cudaError_t gather_rows(const void* table, bool bf16, int64_t cols, const int32_t* ids, int64_t n, float* out,
                        int64_t ldo, cudaStream_t s);
// *flag = 0 if any element of x is NaN or ±Inf (the caller sets it to 1 first).
cudaError_t all_finite(const float* x, int64_t ldx, int64_t rows, int64_t cols, int* flag, cudaStream_t s);

// ---- attention (kernels_attention.cu)
struct AttentionArgs {
  const float *q, *k, *v;
  float* out;
  int64_t ldq, ldk, ldv, ldo;  // row strides (tokens)
  int64_t Sq, Sk;
  int heads, kv_heads, D;
  float scale;
  bool causal;
  const uint8_t* key_valid;  // device [Sk] or null
};
// The largest head dimension the kernel handles.
constexpr int kMaxAttentionHeadDim = 512;
// Shared memory the kernel needs for head dim D (bytes); the caller checks it against the device.
size_t attention_smem_bytes(int D);
cudaError_t attention(const AttentionArgs& a, cudaStream_t s);

// The softmax of the bf16 attention path (cuda_attention.cpp): scores s [rows, Sk] (row stride
// lds; the rows are queries i0, i0 + 1, ...) → p = softmax(scale · s) over the visible keys
// (AttnMask's rule), as bf16 at row stride ldp; a row with no visible key is zeros.
cudaError_t masked_softmax_bf16(const float* s, int64_t lds, void* p, int64_t ldp, int64_t rows, int64_t Sk,
                                int64_t i0, float scale, bool causal, const uint8_t* key_valid, cudaStream_t st);

// ---- convolution pieces (kernels_conv.cu)
struct Im2colArgs {
  const float* in;   // [Cin, H, W] (one batch item)
  int64_t Cin, H, W, KH, KW, OH, OW;
  int stride, pad_top, pad_left;
  bool upsample2x;
  const float* in_scale;  // [Cin] or null
  const float* in_shift;  // [Cin] or null (0)
  bool in_silu;
};
// col[k·pc + (p − p0)] for k in [0, Cin·KH·KW), output pixels p in [p0, p0 + pc): the transformed
// input (prologue on in-bounds values, ×2 nearest upsampling, zero padding), as f32 or bf16.
cudaError_t im2col(const Im2colArgs& a, int64_t p0, int64_t pc, void* col, bool bf16, cudaStream_t s);
// out[co, p] = (accumulate ? out[co, p] : 0) + bias[co] over [Cout, P] (contiguous).
cudaError_t channel_bias(float* out, int64_t Cout, int64_t P, const float* bias, bool accumulate, cudaStream_t s);

}  // namespace klein::cuda_kernels
