// The CPU backend: owns the thread pool and the kernels chosen for this CPU (per op, weight
// format and ISA, see kernels/registry.h); computes from the weights' stored formats directly.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/registry.h"

namespace klein {

struct CpuBackendOptions {
  int threads = 0;             // 0: all cores
  Isa max_isa = Isa::kCount;   // ceiling for kernel selection (kCount: the best this CPU has)
  kernels::Precision precision = kernels::Precision::kFp32;  // kFast: also the dot-product kernels
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = {});

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  std::string describe() const override;
  ThreadPool& pool() { return pool_; }
  const kernels::KernelSet& kernels() const { return kernels_; }

  Result<Tensor> alloc(const Shape& shape, const std::string& what) override;
  Result<Tensor> upload(const float* host, const Shape& shape, const std::string& what) override;
  Result<Tensor> download(const TensorView& x) override;
  Status prepare_weight(Weight& w) override;

  Status linear(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& y) override;
  // By the linear kernel's fused SwiGLU where it has one (kernels::run_linear_swiglu).
  Status linear_swiglu(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& u_scratch,
                       const TensorView& out) override;
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
  Status pack_bf16(const TensorView& src, const TensorView& dst) override;
  Status unpack_bf16(const TensorView& src, const TensorView& dst) override;
  Status transpose(const TensorView& src, const TensorView& dst, bool accumulate) override;
  Status gather_rows(const Weight& table, const std::vector<int32_t>& ids, const TensorView& out) override;
  Result<bool> all_finite(const TensorView& x) override;

 private:
  ThreadPool pool_;
  kernels::KernelSet kernels_;
};

}  // namespace klein
