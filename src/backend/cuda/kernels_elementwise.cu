// The CUDA backend's element-wise, normalisation, RoPE and data-movement kernels (see
// cuda_kernels.h). They are memory-bound: one pass over each operand where the op allows it,
// one warp per row for the row reductions (the models' rows are 128..7680 wide, and a warp per
// row keeps the reduction in registers and shuffles, without shared memory or block barriers).
//
// Rounding: every float product and sum is written with the __f*_rn intrinsics in the order of
// the CPU reference (src/kernels/ref/elementwise_ref.cpp), so nvcc cannot contract them into
// FMAs and the results match the CPU to the last bit, except where expf (≤ 2 ulp on the GPU)
// or the order of the double sums differs.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_kernels.h"

namespace klein::cuda_kernels {

namespace {

constexpr int kBlock = 256;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// A block-wide double sum (blockDim.x a multiple of 32, ≤ 1024); every thread gets the total.
__device__ double block_sum(double v, double* smem32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem32 may still be read by a previous call
  if (lane == 0) smem32[warp] = v;
  __syncthreads();
  double t = lane < warps ? smem32[lane] : 0.0;
  return warp_sum(t);
}

__device__ __forceinline__ float silu_f(float v) { return __fdiv_rn(v, __fadd_rn(1.0f, expf(-v))); }

// Launch shape of the strided element-wise kernels: threads along columns (coalesced), blocks
// along rows; both loops stride, so any size runs with a bounded grid.
struct Shape2 {
  dim3 grid, block;
};
Shape2 shape2(int64_t rows, int64_t cols) {
  Shape2 s;
  s.block = dim3(cols >= kBlock ? kBlock : static_cast<unsigned>((cols + 31) / 32 * 32));
  const int64_t gx = (cols + s.block.x - 1) / s.block.x;
  s.grid = dim3(static_cast<unsigned>(gx < 64 ? gx : 64), static_cast<unsigned>(rows < 65535 ? rows : 65535));
  return s;
}

#define KLEIN_FOR_ROWS_COLS(rows, cols)                                                           \
  for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)                                        \
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < (cols);     \
         c += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Warps per block and blocks for one warp per item.
constexpr int kWarpsPerBlock = kBlock / 32;
unsigned warp_blocks(int64_t items) {
  const int64_t b = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(b < (int64_t{1} << 20) ? (b > 0 ? b : 1) : (int64_t{1} << 20));
}
__device__ __forceinline__ int64_t first_warp() {
  return static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_stride() { return static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5); }

cudaError_t launched() { return cudaGetLastError(); }

// ---- kernels

__global__ void f32_to_bf16_kernel(const float* x, int64_t rows, int64_t cols, int64_t ldx, __nv_bfloat16* y) {
  KLEIN_FOR_ROWS_COLS(rows, cols) y[r * cols + c] = __float2bfloat16_rn(x[r * ldx + c]);
}

__global__ void fill_bias_rows_kernel(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias) {
  KLEIN_FOR_ROWS_COLS(rows, cols) y[r * ldy + c] = bias ? bias[c] : 0.0f;
}

template <RowNorm K>
__global__ void row_norm_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows, int64_t cols,
                                const float* a, const float* b, float eps) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = first_warp(); r < rows; r += warp_stride()) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    if constexpr (K == RowNorm::kRms) {
      double ss = 0.0;
      for (int64_t c = lane; c < cols; c += 32) {
        const double v = xr[c];
        ss += v * v;
      }
      ss = warp_sum(ss);
      // 1 / sqrt(float(mean(x²)) + eps), as rms_inv.
      const float inv =
          __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / static_cast<double>(cols)), eps)));
      for (int64_t c = lane; c < cols; c += 32) {
        const float v = __fmul_rn(xr[c], inv);
        yr[c] = a ? __fmul_rn(a[c], v) : v;
      }
    } else {
      // Two passes in double (mean, then the centred biased variance), as mean_rstd.
      double s = 0.0;
      for (int64_t c = lane; c < cols; c += 32) s += xr[c];
      const double mean = warp_sum(s) / static_cast<double>(cols);
      double v = 0.0;
      for (int64_t c = lane; c < cols; c += 32) {
        const double d = xr[c] - mean;
        v += d * d;
      }
      v = warp_sum(v);
      const float mf = static_cast<float>(mean);
      const float rstd = static_cast<float>(1.0 / sqrt(v / static_cast<double>(cols) + static_cast<double>(eps)));
      for (int64_t c = lane; c < cols; c += 32) {
        float t = __fmul_rn(__fsub_rn(xr[c], mf), rstd);
        if constexpr (K == RowNorm::kLayer) {
          if (a) t = __fmul_rn(t, a[c]);
          if (b) t = __fadd_rn(t, b[c]);
        } else {
          t = __fadd_rn(__fmul_rn(a[c], t), b[c]);  // onep · n + shift
        }
        yr[c] = t;
      }
    }
  }
}

__global__ void group_moments_kernel(const float* x, int64_t n, int chunks, double* partial) {
  __shared__ double smem[32];
  const int64_t g = blockIdx.y, j = blockIdx.x;
  const int64_t per = (n + chunks - 1) / chunks;
  const int64_t c0 = j * per, c1 = c0 + per < n ? c0 + per : n;
  const float* p = x + g * n;
  double s = 0.0;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) s += p[i];
  s = block_sum(s, smem);
  const int64_t cnt = c1 > c0 ? c1 - c0 : 0;
  const double mean = cnt ? s / static_cast<double>(cnt) : 0.0;
  double m2 = 0.0;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    const double d = p[i] - mean;
    m2 += d * d;
  }
  m2 = block_sum(m2, smem);
  if (threadIdx.x == 0) {
    double* o = partial + (g * chunks + j) * 3;
    o[0] = static_cast<double>(cnt);
    o[1] = mean;
    o[2] = m2;
  }
}

__global__ void group_affine_kernel(const double* partial, int chunks, int64_t cpg, double eps, const float* gamma,
                                    const float* beta, float* scale, float* shift) {
  const int64_t g = blockIdx.x;
  __shared__ float mr[2];
  if (threadIdx.x == 0) {
    // Chan et al.'s pairwise merge of the chunks' (count, mean, M2), as the CPU's tiled GroupNorm.
    double na = 0.0, mean = 0.0, m2 = 0.0;
    for (int j = 0; j < chunks; ++j) {
      const double* q = partial + (g * chunks + j) * 3;
      const double nb = q[0];
      if (nb <= 0.0) continue;
      const double nt = na + nb, d = q[1] - mean;
      mean += d * nb / nt;
      m2 += q[2] + d * d * na * nb / nt;
      na = nt;
    }
    mr[0] = static_cast<float>(mean);
    mr[1] = static_cast<float>(1.0 / sqrt(m2 / na + eps));
  }
  __syncthreads();
  const float mf = mr[0], rstd = mr[1];
  for (int64_t c = threadIdx.x; c < cpg; c += blockDim.x) {
    const int64_t ch = g * cpg + c;
    const float sc = __fmul_rn(gamma[ch], rstd);
    scale[ch] = sc;
    shift[ch] = __fsub_rn(beta[ch], __fmul_rn(mf, sc));
  }
}

__global__ void rope_half_kernel(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* cosv,
                                 const float* sinv) {
  const int64_t half = D / 2, total = rows * heads * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % half, rh = i / half, h = rh % heads, r = rh / heads;
    float* v = x + r * ld + h * D;
    const float c = cosv[r * half + d], s = sinv[r * half + d];
    const float a = v[d], b = v[d + half];
    v[d] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[d + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

// One interleaved pair (v[j], v[j+1]) rotated by the angle at j, as rope_interleaved_head.
__device__ __forceinline__ void rotate_pair(float* v, int64_t j, float a, float b, const float* c, const float* s) {
  v[j] = __fadd_rn(__fmul_rn(a, c[j]), __fmul_rn(-b, s[j]));
  v[j + 1] = __fadd_rn(__fmul_rn(b, c[j + 1]), __fmul_rn(a, s[j + 1]));
}

__global__ void rope_interleaved_kernel(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* cosv,
                                        const float* sinv) {
  const int64_t pairs = D / 2, total = rows * heads * pairs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = 2 * (i % pairs), rh = i / pairs, h = rh % heads, r = rh / heads;
    float* v = x + r * ld + h * D;
    rotate_pair(v, j, v[j], v[j + 1], cosv + r * D, sinv + r * D);
  }
}

__global__ void qk_norm_rope_kernel(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* w,
                                    float eps, const float* cosv, const float* sinv) {
  const int lane = threadIdx.x & 31;
  const int64_t total = rows * heads;
  for (int64_t t = first_warp(); t < total; t += warp_stride()) {
    const int64_t r = t / heads, h = t % heads;
    float* v = x + r * ld + h * D;
    double ss = 0.0;
    for (int64_t i = lane; i < D; i += 32) {
      const double a = v[i];
      ss += a * a;
    }
    ss = warp_sum(ss);  // every lane's reads of v are done before any lane writes below
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / static_cast<double>(D)), eps)));
    for (int64_t j = 2 * lane; j < D; j += 64) {
      const float a = __fmul_rn(__fmul_rn(v[j], inv), w[j]);  // rms_norm_head: (v·inv)·w
      const float b = __fmul_rn(__fmul_rn(v[j + 1], inv), w[j + 1]);
      rotate_pair(v, j, a, b, cosv + r * D, sinv + r * D);
    }
    __syncwarp();
  }
}

__global__ void swiglu_kernel(const float* gate, int64_t ldg, const float* up, int64_t ldu, float* out, int64_t ldo,
                              int64_t rows, int64_t cols) {
  KLEIN_FOR_ROWS_COLS(rows, cols) out[r * ldo + c] = __fmul_rn(silu_f(gate[r * ldg + c]), up[r * ldu + c]);
}

__global__ void gated_add_kernel(float* h, int64_t ldh, const float* o, int64_t ldo, const float* gate, int64_t rows,
                                 int64_t cols) {
  KLEIN_FOR_ROWS_COLS(rows, cols) h[r * ldh + c] = __fadd_rn(h[r * ldh + c], __fmul_rn(gate[c], o[r * ldo + c]));
}

__global__ void add_kernel(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t rows, int64_t cols) {
  KLEIN_FOR_ROWS_COLS(rows, cols) y[r * ldy + c] = __fadd_rn(y[r * ldy + c], x[r * ldx + c]);
}

__global__ void add_scalar_kernel(const float* x, int64_t ldx, float k, float* y, int64_t ldy, int64_t rows,
                                  int64_t cols) {
  KLEIN_FOR_ROWS_COLS(rows, cols) y[r * ldy + c] = __fadd_rn(k, x[r * ldx + c]);
}

__global__ void silu_kernel(float* x, int64_t ldx, int64_t rows, int64_t cols) {
  KLEIN_FOR_ROWS_COLS(rows, cols) x[r * ldx + c] = silu_f(x[r * ldx + c]);
}

__global__ void scale_shift_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, const float* scale,
                                   const float* shift, bool per_row, int64_t rows, int64_t cols) {
  KLEIN_FOR_ROWS_COLS(rows, cols) {
    const int64_t i = per_row ? r : c;
    y[r * ldy + c] = __fadd_rn(__fmul_rn(x[r * ldx + c], scale[i]), shift[i]);
  }
}

constexpr int kTile = 32;

__global__ void transpose_kernel(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows, int64_t cols,
                                 bool accumulate) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the column reads below hit 32 different banks
  const int64_t tiles_r = (rows + kTile - 1) / kTile;
  for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
    const int64_t r0 = tr * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * lds + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (c < cols && r < rows) {
        float* d = dst + c * ldd + r;
        *d = accumulate ? __fadd_rn(*d, tile[threadIdx.x][i]) : tile[threadIdx.x][i];
      }
    }
    __syncthreads();
  }
}

__global__ void gather_rows_kernel(const void* table, bool bf16, int64_t cols, const int32_t* ids, int64_t n,
                                   float* out, int64_t ldo) {
  KLEIN_FOR_ROWS_COLS(n, cols) {
    const int64_t src = static_cast<int64_t>(ids[r]) * cols + c;
    out[r * ldo + c] = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(table)[src])
                            : static_cast<const float*>(table)[src];
  }
}

__global__ void all_finite_kernel(const float* x, int64_t ldx, int64_t rows, int64_t cols, int* flag) {
  KLEIN_FOR_ROWS_COLS(rows, cols) {
    if (!isfinite(x[r * ldx + c])) *flag = 0;  // a benign race: every writer writes 0
  }
}

}  // namespace

// ---- launchers

cudaError_t kernels_available() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, add_kernel);
}

cudaError_t f32_to_bf16(const float* x, int64_t rows, int64_t cols, int64_t ldx, void* y, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  f32_to_bf16_kernel<<<g.grid, g.block, 0, s>>>(x, rows, cols, ldx, static_cast<__nv_bfloat16*>(y));
  return launched();
}

cudaError_t fill_bias_rows(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  fill_bias_rows_kernel<<<g.grid, g.block, 0, s>>>(y, ldy, rows, cols, bias);
  return launched();
}

cudaError_t row_norm(RowNorm kind, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows, int64_t cols,
                     const float* a, const float* b, float eps, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const unsigned blocks = warp_blocks(rows);
  switch (kind) {
    case RowNorm::kRms:
      row_norm_kernel<RowNorm::kRms><<<blocks, kBlock, 0, s>>>(x, ldx, y, ldy, rows, cols, a, b, eps);
      break;
    case RowNorm::kLayer:
      row_norm_kernel<RowNorm::kLayer><<<blocks, kBlock, 0, s>>>(x, ldx, y, ldy, rows, cols, a, b, eps);
      break;
    case RowNorm::kModulated:
      row_norm_kernel<RowNorm::kModulated><<<blocks, kBlock, 0, s>>>(x, ldx, y, ldy, rows, cols, a, b, eps);
      break;
  }
  return launched();
}

cudaError_t group_moments(const float* x, int64_t groups, int64_t n, int chunks, double* partial, cudaStream_t s) {
  if (groups <= 0) return cudaSuccess;
  group_moments_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(groups)), kBlock, 0, s>>>(
      x, n, chunks, partial);
  return launched();
}

cudaError_t group_affine(const double* partial, int64_t groups, int chunks, int64_t cpg, double eps,
                         const float* gamma, const float* beta, float* scale, float* shift, cudaStream_t s) {
  if (groups <= 0) return cudaSuccess;
  group_affine_kernel<<<static_cast<unsigned>(groups), 128, 0, s>>>(partial, chunks, cpg, eps, gamma, beta, scale,
                                                                     shift);
  return launched();
}

namespace {
unsigned flat_blocks(int64_t n) {
  const int64_t b = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(b < (int64_t{1} << 20) ? (b > 0 ? b : 1) : (int64_t{1} << 20));
}
}  // namespace

cudaError_t rope_half(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* cos, const float* sin,
                      cudaStream_t s) {
  const int64_t n = rows * heads * (D / 2);
  if (n <= 0) return cudaSuccess;
  rope_half_kernel<<<flat_blocks(n), kBlock, 0, s>>>(x, rows, heads, D, ld, cos, sin);
  return launched();
}

cudaError_t rope_interleaved(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* cos,
                             const float* sin, cudaStream_t s) {
  const int64_t n = rows * heads * (D / 2);
  if (n <= 0) return cudaSuccess;
  rope_interleaved_kernel<<<flat_blocks(n), kBlock, 0, s>>>(x, rows, heads, D, ld, cos, sin);
  return launched();
}

cudaError_t qk_norm_rope(float* x, int64_t rows, int heads, int64_t D, int64_t ld, const float* w, float eps,
                         const float* cos, const float* sin, cudaStream_t s) {
  if (rows <= 0 || heads <= 0 || D <= 0) return cudaSuccess;
  qk_norm_rope_kernel<<<warp_blocks(rows * heads), kBlock, 0, s>>>(x, rows, heads, D, ld, w, eps, cos, sin);
  return launched();
}

cudaError_t swiglu(const float* gate, int64_t ldg, const float* up, int64_t ldu, float* out, int64_t ldo,
                   int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  swiglu_kernel<<<g.grid, g.block, 0, s>>>(gate, ldg, up, ldu, out, ldo, rows, cols);
  return launched();
}

cudaError_t gated_add(float* h, int64_t ldh, const float* o, int64_t ldo, const float* gate, int64_t rows,
                      int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  gated_add_kernel<<<g.grid, g.block, 0, s>>>(h, ldh, o, ldo, gate, rows, cols);
  return launched();
}

cudaError_t add(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  add_kernel<<<g.grid, g.block, 0, s>>>(y, ldy, x, ldx, rows, cols);
  return launched();
}

cudaError_t add_scalar(const float* x, int64_t ldx, float c, float* y, int64_t ldy, int64_t rows, int64_t cols,
                       cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  add_scalar_kernel<<<g.grid, g.block, 0, s>>>(x, ldx, c, y, ldy, rows, cols);
  return launched();
}

cudaError_t silu(float* x, int64_t ldx, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  silu_kernel<<<g.grid, g.block, 0, s>>>(x, ldx, rows, cols);
  return launched();
}

cudaError_t scale_shift(const float* x, int64_t ldx, float* y, int64_t ldy, const float* scale, const float* shift,
                        bool per_row, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  scale_shift_kernel<<<g.grid, g.block, 0, s>>>(x, ldx, y, ldy, scale, shift, per_row, rows, cols);
  return launched();
}

cudaError_t transpose(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows, int64_t cols,
                      bool accumulate, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t tc = (cols + kTile - 1) / kTile, tr = (rows + kTile - 1) / kTile;
  if (tc > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tc), static_cast<unsigned>(tr < 65535 ? tr : 65535));
  transpose_kernel<<<grid, dim3(kTile, 8), 0, s>>>(src, lds, dst, ldd, rows, cols, accumulate);
  return launched();
}

cudaError_t gather_rows(const void* table, bool bf16, int64_t cols, const int32_t* ids, int64_t n, float* out,
                        int64_t ldo, cudaStream_t s) {
  if (n <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(n, cols);
  gather_rows_kernel<<<g.grid, g.block, 0, s>>>(table, bf16, cols, ids, n, out, ldo);
  return launched();
}

cudaError_t all_finite(const float* x, int64_t ldx, int64_t rows, int64_t cols, int* flag, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const Shape2 g = shape2(rows, cols);
  all_finite_kernel<<<g.grid, g.block, 0, s>>>(x, ldx, rows, cols, flag);
  return launched();
}

}  // namespace klein::cuda_kernels
