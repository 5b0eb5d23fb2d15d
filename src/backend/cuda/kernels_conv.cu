// The pieces of the CUDA backend's conv2d around its cuBLASLt GEMM (cuda_gemm.cpp): im2col of a
// chunk of output pixels with every element-wise step the VAE folds into a conv (the GroupNorm
// affine + SiLU prologue on in-bounds input, nearest ×2 upsampling, zero padding, stride), and
// the per-channel bias that the GEMM then accumulates onto (cuBLASLt's bias epilogue adds along
// the other dimension of this GEMM's output).
//
// im2col materialises K = Cin·kh·kw values per output pixel — 9× the input for a 3×3 conv —
// which is why the backend runs it per chunk of pixels into a bounded scratch buffer. An
// implicit GEMM (no col matrix) is the faster design; this is the simplest correct one.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_kernels.h"

namespace klein::cuda_kernels {

namespace {

constexpr int kBlock = 256;

template <bool BF16>
__global__ void im2col_kernel(Im2colArgs a, int64_t p0, int64_t pc, void* col) {
  const int64_t KK = a.KH * a.KW, total = a.Cin * KK * pc;
  const int64_t Hu = a.upsample2x ? 2 * a.H : a.H, Wu = a.upsample2x ? 2 * a.W : a.W;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = i / pc, p = p0 + i % pc;
    const int64_t ci = k / KK, kr = k % KK, ky = kr / a.KW, kx = kr % a.KW;
    const int64_t oy = p / a.OW, ox = p % a.OW;
    const int64_t iy = oy * a.stride - a.pad_top + ky, ix = ox * a.stride - a.pad_left + kx;
    float v = 0.0f;  // zero padding, added after the prologue (conv(pad(silu(gn(x)))))
    if (iy >= 0 && iy < Hu && ix >= 0 && ix < Wu) {
      const int64_t sy = a.upsample2x ? iy / 2 : iy, sx = a.upsample2x ? ix / 2 : ix;
      v = a.in[(ci * a.H + sy) * a.W + sx];
      if (a.in_scale || a.in_shift)
        v = __fadd_rn(__fmul_rn(a.in_scale ? a.in_scale[ci] : 1.0f, v), a.in_shift ? a.in_shift[ci] : 0.0f);
      if (a.in_silu) v = __fdiv_rn(v, __fadd_rn(1.0f, expf(-v)));
    }
    if constexpr (BF16) static_cast<__nv_bfloat16*>(col)[i] = __float2bfloat16_rn(v);
    else static_cast<float*>(col)[i] = v;
  }
}

__global__ void channel_bias_kernel(float* out, int64_t Cout, int64_t P, const float* bias, bool accumulate) {
  const int64_t total = Cout * P;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float b = bias[i / P];
    out[i] = accumulate ? __fadd_rn(out[i], b) : b;
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(b < (int64_t{1} << 20) ? (b > 0 ? b : 1) : (int64_t{1} << 20));
}

}  // namespace

cudaError_t im2col(const Im2colArgs& a, int64_t p0, int64_t pc, void* col, bool bf16, cudaStream_t s) {
  const int64_t total = a.Cin * a.KH * a.KW * pc;
  if (total <= 0) return cudaSuccess;
  if (bf16) im2col_kernel<true><<<blocks_for(total), kBlock, 0, s>>>(a, p0, pc, col);
  else im2col_kernel<false><<<blocks_for(total), kBlock, 0, s>>>(a, p0, pc, col);
  return cudaGetLastError();
}

cudaError_t channel_bias(float* out, int64_t Cout, int64_t P, const float* bias, bool accumulate, cudaStream_t s) {
  if (Cout <= 0 || P <= 0) return cudaSuccess;
  channel_bias_kernel<<<blocks_for(Cout * P), kBlock, 0, s>>>(out, Cout, P, bias, accumulate);
  return cudaGetLastError();
}

}  // namespace klein::cuda_kernels
