// The CUDA backend (make_cuda_backend in cuda_backend.h creates it). The same Backend interface
// as the CPU backend, so the models run unchanged:
//   * memory: activations are float32 device tensors from the stream-ordered allocator
//     (cudaMallocAsync/cudaFreeAsync on one stream: freed memory is reused at once, in order);
//     upload/download are copies over PCIe/NVLink and download waits for the stream;
//   * weights: prepare_weight converts each weight once on the host (cuda_pack: bf16 or f32, any
//     stored format, quantized ones dequantised) and uploads it; the Weight then points at
//     device memory it co-owns, so a component's weights live as long as the component does
//     (MemoryPolicy kLow frees them after each phase, kResident keeps them);
//   * linear / conv2d: cuBLASLt GEMMs (cuda_gemm.cpp), plans cached per shape;
//   * attention: under fp32 the online-softmax kernel of kernels_attention.cu; under fast bf16
//     cuBLASLt GEMMs around a masked softmax (cuda_attention.cpp);
//   * every other op: the fused kernels of kernels_elementwise.cu (cuda_ops.cpp checks the
//     views and launches them).
// Ops enqueue work on the backend's stream and return; results are visible to download(),
// all_finite() and sync(), which wait. A failing CUDA call becomes a Status naming the call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/thread_pool.h"

namespace klein {

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> create(const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  std::string describe() const override;

  Result<Tensor> alloc(const Shape& shape, const std::string& what) override;
  Result<Tensor> upload(const float* host, const Shape& shape, const std::string& what) override;
  Result<Tensor> download(const TensorView& x) override;
  Status sync() override;
  Status prepare_weight(Weight& w) override;

  Status linear(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& y) override;
  Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, int heads,
                   int kv_heads, float scale, const AttnMask& mask) override;
  Status conv2d(const TensorView& in, const Weight& w, const Weight* bias, const TensorView& out,
                const ConvOptions& o) override;

  Status rms_norm(const TensorView& x, const TensorView& y, const TensorView& w, float eps) override;
  Status layer_norm(const TensorView& x, const TensorView& y, const TensorView& w, const TensorView& b,
                    float eps) override;
  Status modulated_layer_norm(const TensorView& x, const TensorView& y, const TensorView& onep,
                              const TensorView& shift, float eps) override;
  Status group_norm_affine(const TensorView& x, const Weight& gamma, const Weight& beta, int64_t groups, double eps,
                           const TensorView& scale, const TensorView& shift) override;
  Status group_norm_stats(const TensorView& x, int64_t groups, GroupStats& acc) override;
  Status group_norm_affine_from_stats(const GroupStats& stats, const Weight& gamma, const Weight& beta, double eps,
                                      const TensorView& scale, const TensorView& shift) override;

  Status rope_half(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) override;
  Status rope_interleaved(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) override;
  Status qk_norm_rope(const TensorView& x, int heads, const TensorView& w, float eps, const TensorView& cos,
                      const TensorView& sin) override;

  Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  Status gated_add(const TensorView& h, const TensorView& o, const TensorView& gate) override;
  Status add(const TensorView& y, const TensorView& x) override;
  Status add_scalar(const TensorView& x, float c, const TensorView& y) override;
  Status silu(const TensorView& x) override;
  Status scale_shift(const TensorView& x, const TensorView& y, const TensorView& scale, const TensorView& shift,
                     bool per_row) override;

  Status copy(const TensorView& src, const TensorView& dst) override;
  Status transpose(const TensorView& src, const TensorView& dst, bool accumulate) override;
  Status gather_rows(const Weight& table, const std::vector<int32_t>& ids, const TensorView& out) override;
  Result<bool> all_finite(const TensorView& x) override;

 private:
  explicit CudaBackend(const CudaBackendOptions& options);
  Status init();

  // Device memory from the stream-ordered pool; on failure the pool's cached blocks are
  // returned to the device and the allocation retried once, then "out of memory: N GiB needed
  // for <what>".
  Result<void*> device_alloc(size_t bytes, const std::string& what);
  // Scratch buffer `slot` of at least `bytes`, reused across ops (all on one stream, so a later
  // op's kernels run after an earlier op's are done with it).
  enum Slot { kActivations = 0, kCol, kSmall, kAttnQ, kAttnK, kAttnV, kAttnScores, kAttnProbs, kSlots };
  Result<void*> scratch(Slot slot, size_t bytes, const char* op);

  // Attention under Precision::kFast: per head and chunk of queries, scores = K·Qᵀ and
  // out = P·V as bf16 tensor-core GEMMs around a masked softmax (cuda_attention.cpp).
  Status attention_gemm(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        int heads, int kv_heads, int64_t D, float scale, bool causal, const uint8_t* valid);

  // The groups' {count, mean, M2} partials of x [1, C, H, W] into the kSmall scratch; returns
  // the chunks per group.
  Result<int> group_partials(const TensorView& x, int64_t groups, const char* op, double** partial);

  // One cuBLASLt GEMM in column-major terms: D[m, n] = alpha·op(A)·op(B) + beta·C with C = D,
  // optional bias[m] epilogue; types of A and B (CUDA_R_32F or CUDA_R_16BF), D float32.
  struct Gemm {
    int64_t m = 0, n = 0, k = 0;
    bool trans_a = false, trans_b = false;
    cudaDataType_t type = CUDA_R_32F;  // of A and B
    const void* a = nullptr;
    int64_t lda = 0;
    const void* b = nullptr;
    int64_t ldb = 0;
    float* d = nullptr;
    int64_t ldd = 0;
    const float* bias = nullptr;
    float beta = 0.0f;
  };
  Status gemm(const Gemm& g, const std::string& what);
  // The weight's device data as a GEMM operand (f32 or bf16), or why not.
  Result<cudaDataType_t> weight_operand(const Weight& w, const char* op) const;

  struct PlanKey {
    int64_t m, n, k, lda, ldb, ldd;
    int flags;  // trans_a | trans_b << 1 | bf16 << 2 | bias << 3
    uint32_t align;  // log2 alignments of A, B, D (bytes), 8 bits each
    bool operator==(const PlanKey&) const = default;
  };
  struct PlanHash {
    size_t operator()(const PlanKey& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  Result<Plan*> plan(const Gemm& g, const std::string& what);

  CudaBackendOptions opt_;
  cudaStream_t stream_ = nullptr;  // process-wide per device (see cuda_backend.cpp)
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  } scratch_[kSlots];
  std::unordered_map<PlanKey, Plan, PlanHash> plans_;
  ThreadPool pool_;  // host-side weight conversion
  std::string device_name_;
  int cc_major_ = 0, cc_minor_ = 0, sm_count_ = 0;
  size_t smem_optin_ = 0, total_mem_ = 0;
};

}  // namespace klein
