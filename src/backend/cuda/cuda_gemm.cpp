// CudaBackend's GEMMs: linear and conv2d through cuBLASLt.
//
// Both are expressed in cuBLAS's column-major terms on the row-major data, without copies:
//   linear  y[M, N] = x[M, K]·Wᵀ + bias: D (N × M, ld = y's row stride) = op(A)·B with A = W
//           read as K × N (ld K) transposed, B = x read as K × M (ld = x's row stride); the bias
//           is cuBLASLt's BIAS epilogue (one value per row of D = per output feature).
//   conv2d  out[Cout, P] = W[Cout, K]·col[K, P] for P = OH·OW output pixels, K = Cin·kh·kw:
//           D (P × Cout, ld P: the NCHW output itself) = A·B with A = col read as P × K and B =
//           W read as K × Cout; col comes from im2col per chunk of pixels (kernels_conv.cu), or
//           is the input itself for a plain f32 1×1 conv. The bias is added first by a kernel and
//           the GEMM accumulates onto it (beta = 1), since the epilogue's bias runs along P here.
// The operand type follows the prepared weight: f32 weights give f32 GEMMs (CUBLAS_COMPUTE_32F,
// no TF32: the fp32 path), bf16 weights give bf16 × bf16 GEMMs with f32 accumulation and f32
// output, the activations rounded to bf16 on the way in (Precision::kFast).
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.h"

namespace klein {

namespace ck = cuda_kernels;

namespace {

using cuda_util::bad;
using cuda_util::check_mat;

// A bias or per-channel vector: a prepared float32 weight of n values, or null.
Result<const float*> vector_weight(const std::string& op, const Weight* w, int64_t n) {
  if (!w || w->empty()) return static_cast<const float*>(nullptr);
  if (w->device != Device::kCuda) return bad(op, "weight '" + w->name + "' is not prepared for the CUDA backend");
  if (w->dtype != DType::kF32 || w->numel() != n)
    return bad(op, "weight '" + w->name + "' must be " + std::to_string(n) + " float32 values");
  return static_cast<const float*>(w->data);
}

const float* opt(const TensorView& v) { return v.empty() ? nullptr : v.f32(); }

// log2 of the largest power-of-two alignment of p, at most 256 bytes (cuBLASLt's largest ask).
uint32_t log2_align(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 8;
  return std::min<uint32_t>(8, static_cast<uint32_t>(__builtin_ctzll(a)));
}

}  // namespace

size_t CudaBackend::PlanHash::operator()(const PlanKey& k) const {
  size_t h = 1469598103934665603ull;
  for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldd, static_cast<int64_t>(k.flags), static_cast<int64_t>(k.align)})
    h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
  return h;
}

Result<cudaDataType_t> CudaBackend::weight_operand(const Weight& w, const char* op) const {
  if (w.device != Device::kCuda)
    return bad(op, "weight '" + w.name + "' is not prepared for the CUDA backend (Backend::prepare_weight)");
  if (w.dtype == DType::kF32) return CUDA_R_32F;
  if (w.dtype == DType::kBF16) return CUDA_R_16BF;
  return bad(op, "weight '" + w.name + "' is " + std::string(dtype_name(w.dtype)) + " on the device");
}

Result<CudaBackend::Plan*> CudaBackend::plan(const Gemm& g, const std::string& what) {
  const PlanKey key{g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldd,
                    (g.trans_a ? 1 : 0) | (g.trans_b ? 2 : 0) | (g.type == CUDA_R_16BF ? 4 : 0) | (g.bias ? 8 : 0),
                    log2_align(g.a) | log2_align(g.b) << 8 | log2_align(g.d) << 16};
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;

  Plan p;
  // Destroys what was created if a step below fails (a kept plan is destroyed with the backend).
  struct Cleanup {
    Plan* p;
    cublasLtMatmulPreference_t pref = nullptr;
    ~Cleanup() {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (!p) return;
      if (p->a) cublasLtMatrixLayoutDestroy(p->a);
      if (p->b) cublasLtMatrixLayoutDestroy(p->b);
      if (p->d) cublasLtMatrixLayoutDestroy(p->d);
      if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    }
  } cleanup{&p};
  const std::string op = what;
  KLEIN_CUBLAS_TRY(op, cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  KLEIN_CUBLAS_TRY(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KLEIN_CUBLAS_TRY(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    KLEIN_CUBLAS_TRY(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    const cudaDataType_t bt = CUDA_R_32F;
    KLEIN_CUBLAS_TRY(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  // Layouts describe the stored matrices (before op).
  const uint64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
  const uint64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  KLEIN_CUBLAS_TRY(op, cublasLtMatrixLayoutCreate(&p.a, g.type, ar, ac, g.lda));
  KLEIN_CUBLAS_TRY(op, cublasLtMatrixLayoutCreate(&p.b, g.type, br, bc, g.ldb));
  KLEIN_CUBLAS_TRY(op, cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, g.m, g.n, g.ldd));
  KLEIN_CUBLAS_TRY(op, cublasLtMatmulPreferenceCreate(&cleanup.pref));
  const uint64_t ws = workspace_bytes_;
  KLEIN_CUBLAS_TRY(op, cublasLtMatmulPreferenceSetAttribute(cleanup.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &ws, sizeof ws));
  // The operands' actual alignment (views into fused projections start anywhere), so the
  // heuristic only offers kernels that may load them.
  const uint32_t al[3] = {1u << log2_align(g.a), 1u << log2_align(g.b), 1u << log2_align(g.d)};
  for (auto [attr, v] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al[0]},
                         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al[1]},
                         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al[2]},
                         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al[2]}})
    KLEIN_CUBLAS_TRY(op, cublasLtMatmulPreferenceSetAttribute(cleanup.pref, attr, &v, sizeof v));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  KLEIN_CUBLAS_TRY(op, cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.d, p.d, cleanup.pref, 1, &res, &found));
  if (found == 0)
    return unsupported("cuda backend: " + op + ": cuBLASLt offers no algorithm for m " + std::to_string(g.m) +
                       ", n " + std::to_string(g.n) + ", k " + std::to_string(g.k) +
                       (g.type == CUDA_R_16BF ? " (bf16)" : " (f32)"));
  p.algo = res.algo;
  Plan* kept = &plans_.emplace(key, p).first->second;
  cleanup.p = nullptr;  // owned by plans_ now
  return kept;
}

Status CudaBackend::gemm(const Gemm& g, const std::string& what) {
  KLEIN_ASSIGN_OR_RETURN(Plan* p, plan(g, what));
  if (g.bias)
    KLEIN_CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                          sizeof g.bias));
  const float alpha = 1.0f, beta = g.beta;
  KLEIN_CUBLAS_TRY(what, cublasLtMatmul(lt_, p->desc, &alpha, g.a, p->a, g.b, p->b, &beta, g.d, p->d, g.d, p->d,
                                        &p->algo, workspace_, workspace_bytes_, stream_));
  return Status::Ok();
}

// ---- linear

Status CudaBackend::linear(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& y) {
  const std::string op = "linear";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_ASSIGN_OR_RETURN(const cudaDataType_t type, weight_operand(W, "linear"));
  if (W.shape.size() < 2 || W.cols() != x.cols())
    return bad(op, W.name + ": weight " + shape_str(W.shape) + " does not take x " + shape_str(x.shape_vec()));
  if (y.rows() != x.rows() || y.cols() != W.rows())
    return bad(op, W.name + ": y is " + shape_str(y.shape_vec()) + ", expected [" + std::to_string(x.rows()) + ", " +
                       std::to_string(W.rows()) + "]");
  KLEIN_ASSIGN_OR_RETURN(const float* b, vector_weight(op, bias, W.rows()));
  const int64_t M = x.rows(), N = W.rows(), K = x.cols();
  if (M == 0 || N == 0) return Status::Ok();
  if (K == 0) {
    KLEIN_KERNEL_TRY(op, "fill_bias_rows", ck::fill_bias_rows(y.f32(), y.ld(), M, N, b, stream_));
    return Status::Ok();
  }
  Gemm g;
  g.m = N, g.n = M, g.k = K;
  g.trans_a = true;
  g.type = type;
  g.a = W.data, g.lda = K;
  g.d = y.f32(), g.ldd = y.ld();
  g.bias = b;
  if (type == CUDA_R_16BF) {
    KLEIN_ASSIGN_OR_RETURN(void* xb, scratch(kActivations, static_cast<size_t>(M * K) * 2, "linear"));
    KLEIN_KERNEL_TRY(op, "f32_to_bf16", ck::f32_to_bf16(x.f32(), M, K, x.ld(), xb, stream_));
    g.b = xb, g.ldb = K;
  } else {
    g.b = x.f32(), g.ldb = x.ld();
  }
  return gemm(g, "linear " + W.name);
}

// ---- conv2d

Status CudaBackend::conv2d(const TensorView& in, const Weight& w, const Weight* bias, const TensorView& out,
                           const ConvOptions& o) {
  const std::string op = "conv2d";
  if (in.ndim != 4 || out.ndim != 4 || !in.is_contiguous() || !out.is_contiguous() || in.dtype != DType::kF32 ||
      out.dtype != DType::kF32 || in.device != Device::kCuda || out.device != Device::kCuda)
    return bad(op, w.name + ": in/out must be contiguous float32 device [N, C, H, W]");
  if (w.shape.size() != 4) return bad(op, w.name + " is not 4-D");
  KLEIN_ASSIGN_OR_RETURN(const cudaDataType_t type, weight_operand(w, "conv2d"));
  const int64_t N = in.dim(0), Cin = in.dim(1), H = in.dim(2), W = in.dim(3);
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  if (w.shape[1] != Cin) return bad(op, w.name + ": weight " + shape_str(w.shape) + " does not take " +
                                            std::to_string(Cin) + " input channels");
  if (o.stride <= 0) return bad(op, w.name + ": stride must be positive");
  const int64_t OH = conv_out_size(H, KH, o.stride, o.pad_top, o.pad_bottom, o.upsample2x);
  const int64_t OW = conv_out_size(W, KW, o.stride, o.pad_left, o.pad_right, o.upsample2x);
  if (out.dim(0) != N || out.dim(1) != Cout || out.dim(2) != OH || out.dim(3) != OW)
    return bad(op, w.name + ": output is " + shape_str(out.shape_vec()) + ", expected [" + std::to_string(N) + ", " +
                       std::to_string(Cout) + ", " + std::to_string(OH) + ", " + std::to_string(OW) + "]");
  for (auto [name, v] : {std::pair{"in_scale", &o.in_scale}, {"in_shift", &o.in_shift}}) {
    if (v->empty()) continue;
    if (v->dtype != DType::kF32 || v->device != Device::kCuda || v->numel() != Cin || !v->is_contiguous())
      return bad(op, w.name + ": " + name + " must be a contiguous float32 device vector of " + std::to_string(Cin));
  }
  KLEIN_ASSIGN_OR_RETURN(const float* b, vector_weight(op, bias, Cout));
  const int64_t K = Cin * KH * KW, P = OH * OW;
  if (N == 0 || P == 0 || Cout == 0) return Status::Ok();

  const bool bf16 = type == CUDA_R_16BF;
  const bool prologue = !o.in_scale.empty() || !o.in_shift.empty() || o.in_silu;
  // A plain f32 1×1 conv multiplies the input as it is: [Cin, H·W] is already the col matrix.
  const bool direct = !bf16 && KH == 1 && KW == 1 && o.stride == 1 && !o.upsample2x && !prologue && o.pad_top == 0 &&
                      o.pad_bottom == 0 && o.pad_left == 0 && o.pad_right == 0;
  int64_t pc = P;
  void* col = nullptr;
  if (!direct) {
    const int64_t es = bf16 ? 2 : 4;
    pc = std::min<int64_t>(P, std::max<int64_t>(1, static_cast<int64_t>(opt_.conv_col_bytes) / (K * es)));
    if (pc >= 128 && pc < P) pc -= pc % 128;  // chunk starts stay 512-byte aligned in the output
    KLEIN_ASSIGN_OR_RETURN(col, scratch(kCol, static_cast<size_t>(K * pc * es), "conv2d"));
  }
  const std::string what = "conv2d " + w.name;
  for (int64_t n = 0; n < N; ++n) {
    const float* in_n = in.f32() + n * Cin * H * W;
    float* out_n = out.f32() + n * Cout * P;
    float beta = o.accumulate ? 1.0f : 0.0f;
    if (b) {
      KLEIN_KERNEL_TRY(op, "channel_bias", ck::channel_bias(out_n, Cout, P, b, o.accumulate, stream_));
      beta = 1.0f;
    }
    const ck::Im2colArgs ia{.in = in_n, .Cin = Cin, .H = H, .W = W, .KH = KH, .KW = KW, .OH = OH, .OW = OW,
                            .stride = o.stride, .pad_top = o.pad_top, .pad_left = o.pad_left,
                            .upsample2x = o.upsample2x, .in_scale = opt(o.in_scale), .in_shift = opt(o.in_shift),
                            .in_silu = o.in_silu};
    for (int64_t p0 = 0; p0 < P; p0 += pc) {
      const int64_t cnt = std::min(pc, P - p0);
      Gemm g;
      g.m = cnt, g.n = Cout, g.k = K;
      g.type = type;
      if (direct) {
        g.a = in_n + p0, g.lda = P;
      } else {
        KLEIN_KERNEL_TRY(op, "im2col", ck::im2col(ia, p0, cnt, col, bf16, stream_));
        g.a = col, g.lda = cnt;
      }
      g.b = w.data, g.ldb = K;
      g.d = out_n + p0, g.ldd = P;
      g.beta = beta;
      KLEIN_RETURN_IF_ERROR(gemm(g, what));
    }
  }
  return Status::Ok();
}

}  // namespace klein
