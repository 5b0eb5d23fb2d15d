// CudaBackend::attention. Two paths, by the backend's precision:
//   * fp32: the online-softmax kernel (kernels_attention.cu): float32 throughout, no score
//     matrix, head dims up to 512 — the exact path, at CUDA-core speed;
//   * fast (bf16): tensor cores through cuBLASLt. q, k and v are rounded to bf16 once; then per
//     head and chunk of queries, scores = K_h·Q_hᵀ (f32 out), the masked softmax (f32, probabilities
//     rounded to bf16) and out_h = P·V_h (f32 out, written into the head's columns of `out`).
//     The score matrix of a chunk is materialised (chunks bound it to ~512 MB with the
//     probabilities), so this path moves about 6 bytes per score through memory: ~2–3 ms for one
//     1024² DiT attention on an H200 by that count — far faster than CUDA cores, far slower
//     than a fused flash kernel, which is the next step on a GPU (docs/cuda.md).
// Both follow the contract's mask rule and give zeros to a query with no visible key.
#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.h"

namespace klein {

namespace ck = cuda_kernels;

namespace {

constexpr int64_t kScoreChunkBytes = int64_t{512} << 20;  // f32 scores + bf16 probabilities of a chunk

using cuda_util::bad;
using cuda_util::check_mat;

}  // namespace

Status CudaBackend::attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              int heads, int kv_heads, float scale, const AttnMask& mask) {
  const std::string op = "attention";
  for (auto [n, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    KLEIN_RETURN_IF_ERROR(check_mat(op, n, *t));
  if (heads <= 0 || kv_heads <= 0 || q.cols() % heads != 0 || heads % kv_heads != 0)
    return bad(op, "bad head count");
  const int64_t D = q.cols() / heads;
  if (k.cols() != kv_heads * D || v.cols() != kv_heads * D || out.cols() != q.cols() || out.rows() != q.rows() ||
      k.rows() != v.rows())
    return bad(op, "q/k/v/out shapes disagree");
  if (q.rows() == 0 || D == 0) return Status::Ok();
  const uint8_t* valid = nullptr;
  if (mask.key_valid && k.rows() > 0) {
    KLEIN_ASSIGN_OR_RETURN(void* p, scratch(kSmall, static_cast<size_t>(k.rows()), "attention"));
    KLEIN_CUDA_TRY(op, cudaMemcpyAsync(p, mask.key_valid, static_cast<size_t>(k.rows()), cudaMemcpyHostToDevice,
                                       stream_));
    valid = static_cast<const uint8_t*>(p);
  }
  if (opt_.precision == CudaPrecision::kBf16)
    return attention_gemm(q, k, v, out, heads, kv_heads, D, scale, mask.causal, valid);

  if (D > ck::kMaxAttentionHeadDim)
    return unsupported("cuda backend: attention: head dim " + std::to_string(D) + " (the fp32 kernel handles up to " +
                       std::to_string(ck::kMaxAttentionHeadDim) + ")");
  if (ck::attention_smem_bytes(static_cast<int>(D)) > smem_optin_)
    return unsupported("cuda backend: attention: head dim " + std::to_string(D) + " needs " +
                       std::to_string(ck::attention_smem_bytes(static_cast<int>(D))) +
                       " bytes of shared memory; " + device_name_ + " has " + std::to_string(smem_optin_));
  const ck::AttentionArgs a{.q = q.f32(), .k = k.f32(), .v = v.f32(), .out = out.f32(),
                            .ldq = q.ld(), .ldk = k.ld(), .ldv = v.ld(), .ldo = out.ld(),
                            .Sq = q.rows(), .Sk = k.rows(), .heads = heads, .kv_heads = kv_heads,
                            .D = static_cast<int>(D), .scale = scale, .causal = mask.causal, .key_valid = valid};
  KLEIN_KERNEL_TRY(op, "attention", ck::attention(a, stream_));
  return Status::Ok();
}

Status CudaBackend::attention_gemm(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, int heads, int kv_heads, int64_t D, float scale,
                                   bool causal, const uint8_t* valid) {
  const std::string op = "attention";
  const int64_t Sq = q.rows(), Sk = k.rows();
  if (Sk == 0) {  // no keys: every query sees none
    KLEIN_CUDA_TRY(op, cudaMemset2DAsync(out.data, static_cast<size_t>(out.ld()) * sizeof(float), 0,
                                         static_cast<size_t>(out.cols()) * sizeof(float), static_cast<size_t>(Sq),
                                         stream_));
    return Status::Ok();
  }
  // bf16 copies of q, k, v (contiguous: [S, heads·D]).
  const int64_t wq = heads * D, wk = kv_heads * D;
  KLEIN_ASSIGN_OR_RETURN(void* qb, scratch(kAttnQ, static_cast<size_t>(Sq * wq) * 2, "attention"));
  KLEIN_ASSIGN_OR_RETURN(void* kb, scratch(kAttnK, static_cast<size_t>(Sk * wk) * 2, "attention"));
  KLEIN_ASSIGN_OR_RETURN(void* vb, scratch(kAttnV, static_cast<size_t>(Sk * wk) * 2, "attention"));
  KLEIN_KERNEL_TRY(op, "f32_to_bf16", ck::f32_to_bf16(q.f32(), Sq, wq, q.ld(), qb, stream_));
  KLEIN_KERNEL_TRY(op, "f32_to_bf16", ck::f32_to_bf16(k.f32(), Sk, wk, k.ld(), kb, stream_));
  KLEIN_KERNEL_TRY(op, "f32_to_bf16", ck::f32_to_bf16(v.f32(), Sk, wk, v.ld(), vb, stream_));
  // Queries per chunk: the chunk's f32 scores and bf16 probabilities within kScoreChunkBytes.
  int64_t qc = std::min<int64_t>(Sq, std::max<int64_t>(1, kScoreChunkBytes / (Sk * 6)));
  if (qc >= 64 && qc < Sq) qc -= qc % 64;
  KLEIN_ASSIGN_OR_RETURN(void* sp, scratch(kAttnScores, static_cast<size_t>(Sk * qc) * 4, "attention"));
  KLEIN_ASSIGN_OR_RETURN(void* pp, scratch(kAttnProbs, static_cast<size_t>(Sk * qc) * 2, "attention"));
  float* scores = static_cast<float*>(sp);
  const auto* q16 = static_cast<const uint16_t*>(qb);
  const auto* k16 = static_cast<const uint16_t*>(kb);
  const auto* v16 = static_cast<const uint16_t*>(vb);
  const int group = heads / kv_heads;
  for (int h = 0; h < heads; ++h) {
    const int64_t g = h / group;
    for (int64_t i0 = 0; i0 < Sq; i0 += qc) {
      const int64_t n = std::min(qc, Sq - i0);
      // scores (column-major Sk × n, so each query's row of Sk scores is contiguous) = K_h·Q_hᵀ:
      // A = K_h stored D × Sk (ld wk), transposed; B = Q_h stored D × n (ld wq).
      Gemm s;
      s.m = Sk, s.n = n, s.k = D;
      s.trans_a = true;
      s.type = CUDA_R_16BF;
      s.a = k16 + g * D, s.lda = wk;
      s.b = q16 + i0 * wq + h * D, s.ldb = wq;
      s.d = scores, s.ldd = Sk;
      KLEIN_RETURN_IF_ERROR(gemm(s, "attention scores"));
      KLEIN_KERNEL_TRY(op, "masked_softmax_bf16",
                       ck::masked_softmax_bf16(scores, Sk, pp, Sk, n, Sk, i0, scale, causal, valid, stream_));
      // out_h (column-major D × n at ld = out's row stride: the head's columns of the query
      // rows) = V_h·P: A = V_h stored D × Sk (ld wk); B = P stored Sk × n (ld Sk).
      Gemm o;
      o.m = D, o.n = n, o.k = Sk;
      o.type = CUDA_R_16BF;
      o.a = v16 + g * D, o.lda = wk;
      o.b = pp, o.ldb = Sk;
      o.d = out.f32() + i0 * out.ld() + h * D, o.ldd = out.ld();
      KLEIN_RETURN_IF_ERROR(gemm(o, "attention output"));
    }
  }
  return Status::Ok();
}

}  // namespace klein
