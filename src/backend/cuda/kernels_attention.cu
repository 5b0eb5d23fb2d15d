// Attention without the score matrix (FlashAttention's online softmax), in float32 on the CUDA
// cores: the first, simplest-correct kernel of the CUDA backend, general in the head dimension
// (1..512: the DiT's and Qwen3's 128, the VAE mid-block's single 512-wide head), GQA, causal
// and key-padding masks, strided token-major q/k/v/out.
//
// A block owns 16 queries of one head (4 warps × 4 queries) and streams the keys in tiles of
// 32 through shared memory. Per tile each lane scores one key against its warp's 4 queries (the
// key row is read once per 4 queries), the warp updates each query's running max m and sum l,
// rescales the output accumulator and adds p_j · V_j, the lanes splitting the head dimension
// (lane owns dims lane, lane+32, ...). A query that the mask gives no key gives zeros, as the
// contract says; a NaN score, +inf or a row of -inf scores give NaN (kernels/kernels.h), so a
// corrupt Q or K reaches the output checks. Scores are (q·k)·scale in float, softmax with expf,
// so the result agrees with the double-precision formula to ~1e-6 relative.
//
// What it is not: a tensor-core kernel. At 1024² the DiT's attention is ~6.5 TFLOP per step,
// which this kernel runs at CUDA-core speed, so it serves Precision::kFp32 (the exact path);
// under kFast the backend computes attention with bf16 tensor-core GEMMs around the masked
// softmax below (cuda_attention.cpp). A fused bf16 flash kernel (mma.sync/wgmma) replacing both
// is the next step on a GPU (docs/cuda.md).
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_kernels.h"

namespace klein::cuda_kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kQueriesPerWarp = 4;
constexpr int kBlockQueries = kWarps * kQueriesPerWarp;
constexpr int kKeys = 32;  // keys per tile: one per lane
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// DPL: head dims per lane (D ≤ 32·DPL), a compile-time bound so the accumulators stay in
// registers.
template <int DPL>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionArgs a) {
  extern __shared__ float smem[];
  constexpr int QW = kQueriesPerWarp;
  const int D = a.D, Dp = D + 1;  // K rows padded: lane j reads row j, 32 different banks
  float* Qs = smem;                      // [kBlockQueries][D]
  float* Ks = Qs + kBlockQueries * D;    // [kKeys][D + 1]
  float* Vs = Ks + kKeys * Dp;           // [kKeys][D]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBlockQueries;

  for (int i = threadIdx.x; i < kBlockQueries * D; i += blockDim.x) {
    const int64_t row = q0 + i / D;
    Qs[i] = row < a.Sq ? a.q[row * a.ldq + static_cast<int64_t>(h) * D + i % D] : 0.0f;
  }
  float m[QW], l[QW], acc[QW][DPL];
  bool seen[QW];  // the mask let the query see some key (uniform across the warp)
#pragma unroll
  for (int t = 0; t < QW; ++t) {
    m[t] = -INFINITY;
    l[t] = 0.0f;
    seen[t] = false;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[t][i] = 0.0f;
  }
  // Under a causal mask no query of this block sees a key past its last query.
  int64_t kend = a.Sk;
  if (a.causal && q0 + kBlockQueries < kend) kend = q0 + kBlockQueries;

  for (int64_t k0 = 0; k0 < kend; k0 += kKeys) {
    __syncthreads();  // the previous tile is consumed (and Qs written, on the first pass)
    for (int i = threadIdx.x; i < kKeys * D; i += blockDim.x) {
      const int j = i / D, d = i % D;
      const int64_t key = k0 + j;
      float kv = 0.0f, vv = 0.0f;
      if (key < a.Sk) {
        kv = a.k[key * a.ldk + static_cast<int64_t>(g) * D + d];
        vv = a.v[key * a.ldv + static_cast<int64_t>(g) * D + d];
      }
      Ks[j * Dp + d] = kv;
      Vs[j * D + d] = vv;
    }
    __syncthreads();

    const int64_t key = k0 + lane;
    const bool key_ok = key < a.Sk && (a.key_valid == nullptr || a.key_valid[key] != 0);
    float s[QW];
#pragma unroll
    for (int t = 0; t < QW; ++t) s[t] = 0.0f;
    const float* qw = Qs + warp * QW * D;
    for (int d = 0; d < D; ++d) {
      const float kd = Ks[lane * Dp + d];
#pragma unroll
      for (int t = 0; t < QW; ++t) s[t] = fmaf(qw[t * D + d], kd, s[t]);
    }
#pragma unroll
    for (int t = 0; t < QW; ++t) {
      const int64_t qi = q0 + warp * QW + t;
      const bool ok = key_ok && (!a.causal || key <= qi);
      if (!__any_sync(kFull, ok)) continue;  // no key of the tile visible (uniform across the warp)
      seen[t] = true;
      const float sc = ok ? s[t] * a.scale : -INFINITY;
      const float mnew = fmaxf(m[t], warp_max(sc));
      // fmaxf drops a NaN score from the max; that key's p = expf(NaN) is NaN all the same. The
      // offset is mnew, or 0 while it is -inf (every visible score so far -inf), so that corr
      // (m = -inf) and the masked lanes' p are expf(-inf) = 0, not expf(-inf + inf) = NaN.
      const float moff = mnew == -INFINITY ? 0.0f : mnew;
      const float corr = expf(m[t] - moff);  // 0 on the first visible tile (m = −inf)
      const float p = ok ? expf(sc - moff) : 0.0f;
      l[t] = l[t] * corr + warp_sum(p);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[t][i] *= corr;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(kFull, p, j);
        const float* vr = Vs + j * D;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < D) acc[t][i] = fmaf(pj, vr[d], acc[t][i]);
        }
      }
      m[t] = mnew;
    }
  }

#pragma unroll
  for (int t = 0; t < QW; ++t) {
    const int64_t qi = q0 + warp * QW + t;
    if (qi >= a.Sq) continue;
    float* o = a.out + qi * a.ldo + static_cast<int64_t>(h) * D;
    const float inv = seen[t] ? 1.0f / l[t] : 0.0f;  // l = 0 (only -inf scores): 0 · inf = NaN
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < D) o[d] = acc[t][i] * inv;
    }
  }
}

template <int DPL>
cudaError_t launch(const AttentionArgs& a, cudaStream_t s) {
  const size_t smem = attention_smem_bytes(a.D);
  if (smem > 48 * 1024) {
    // Above 48 KiB a kernel must opt in to more shared memory (Hopper allows up to 227 KiB).
    const cudaError_t e =
        cudaFuncSetAttribute(attention_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int64_t qblocks = (a.Sq + kBlockQueries - 1) / kBlockQueries;
  if (qblocks > 0x7fffffff || a.heads > 65535) return cudaErrorInvalidValue;
  attention_kernel<DPL><<<dim3(static_cast<unsigned>(qblocks), static_cast<unsigned>(a.heads)), kWarps * 32, smem,
                          s>>>(a);
  return cudaGetLastError();
}

__device__ float block_reduce(float v, bool is_max, float* smem32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // smem32 may still be read by the previous reduction
  if (lane == 0) smem32[warp] = v;
  __syncthreads();
  float t = lane < warps ? smem32[lane] : (is_max ? -INFINITY : 0.0f);
  return is_max ? warp_max(t) : warp_sum(t);
}

// One block per query row: max, sum of exponentials, then the normalised row as bf16. The row
// (≤ 64 KiB of scores) is read three times, from L2 after the first. Non-finite scores as the
// fused kernel above: a row the mask leaves no key is zeros, a NaN / +inf / all -inf one NaN.
__global__ void masked_softmax_kernel(const float* s, int64_t lds, __nv_bfloat16* p, int64_t ldp, int64_t rows,
                                      int64_t Sk, int64_t i0, float scale, bool causal, const uint8_t* valid) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* sr = s + r * lds;
    __nv_bfloat16* pr = p + r * ldp;
    const int64_t qi = i0 + r;
    const int64_t jend = causal ? (qi + 1 < Sk ? qi + 1 : Sk) : Sk;
    float mx = -INFINITY;
    int any = 0;
    for (int64_t j = threadIdx.x; j < jend; j += blockDim.x)
      if (!valid || valid[j]) {
        mx = fmaxf(mx, sr[j] * scale);  // may drop a NaN: its exp below is NaN all the same
        any = 1;
      }
    const bool sees = __syncthreads_or(any) != 0;  // the mask leaves the row some key
    mx = block_reduce(mx, true, smem);
    const float moff = mx == -INFINITY ? 0.0f : mx;  // only -inf scores: p = 0, sum = 0
    float sum = 0.0f;
    if (sees)
      for (int64_t j = threadIdx.x; j < jend; j += blockDim.x)
        if (!valid || valid[j]) sum += expf(sr[j] * scale - moff);
    sum = block_reduce(sum, false, smem);
    const float inv = sees ? 1.0f / sum : 0.0f;  // sum NaN → NaN; sum 0 → inf, and 0 · inf = NaN
    for (int64_t j = threadIdx.x; j < Sk; j += blockDim.x) {
      const bool vis = j < jend && (!valid || valid[j]);
      pr[j] = __float2bfloat16_rn(vis ? expf(sr[j] * scale - moff) * inv : 0.0f);
    }
  }
}

}  // namespace

cudaError_t masked_softmax_bf16(const float* s, int64_t lds, void* p, int64_t ldp, int64_t rows, int64_t Sk,
                                int64_t i0, float scale, bool causal, const uint8_t* key_valid, cudaStream_t st) {
  if (rows <= 0 || Sk <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(rows < (int64_t{1} << 20) ? rows : (int64_t{1} << 20));
  masked_softmax_kernel<<<blocks, 256, 0, st>>>(s, lds, static_cast<__nv_bfloat16*>(p), ldp, rows, Sk, i0, scale,
                                                causal, key_valid);
  return cudaGetLastError();
}

size_t attention_smem_bytes(int D) {
  return static_cast<size_t>(kBlockQueries * D + kKeys * (D + 1) + kKeys * D) * sizeof(float);
}

cudaError_t attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.Sq <= 0) return cudaSuccess;
  if (a.D <= 0 || a.D > kMaxAttentionHeadDim || a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return cudaErrorInvalidValue;
  if (a.D <= 32) return launch<1>(a, s);
  if (a.D <= 64) return launch<2>(a, s);
  if (a.D <= 128) return launch<4>(a, s);
  if (a.D <= 256) return launch<8>(a, s);
  return launch<16>(a, s);
}

}  // namespace klein::cuda_kernels
