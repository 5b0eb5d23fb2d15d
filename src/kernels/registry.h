// Kernels per (op, weight format, ISA): one table of every compiled kernel, and the selection a
// CPU backend makes from it once, at construction, from the CPU's features and an optional ISA
// ceiling. Adding a kernel = writing it with its scalar-reference test and adding a table row.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/attn_mask.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/conv2d.h"
#include "kernels/eltwise.h"
#include "kernels/kernels.h"

namespace klein::kernels {

// kElementwise: the table of norm / RoPE / activation / residual row kernels (kernels/eltwise.h),
// registered with format kF32 (activations only), one row per ISA.
enum class Op : uint8_t { kLinear, kAttention, kConv2d, kElementwise, kCount };
std::string_view op_name(Op op);

// Which arithmetic a KernelSet may use. kFp32: float32 arithmetic on the stored weights (the
// exact path, kept for fidelity work; the default). kFast: also the dot-product kernels that
// round or quantize the activations (bf16 dot products, int8 W8A8) and the float32 Winograd
// conv — entries with `fast` set.
enum class Precision : uint8_t { kFp32, kFast };
std::string_view precision_name(Precision p);        // "fp32", "fast"
bool precision_from_name(std::string_view s, Precision* out);

// Signatures of the registered kernels (arguments validated and strides resolved by the caller;
// bias as float32 [N] or null).
using LinearFn = void (*)(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                          ThreadPool& pool, int64_t ldx, int64_t ldy);
// out[M, F] = SiLU(x · W_gateᵀ + b_gate) · (x · W_upᵀ + b_up) for W = [gate; up] [2F, K] and a bias
// [2F] or null: a linear that applies the SwiGLU as it goes, so the [M, 2F] hidden is never
// written, with the bits of the linear followed by silu_mul (the set's element-wise one, passed
// in). Returns false, having done nothing, for a case it does not fuse (run_linear_swiglu then
// runs the linear and silu_mul).
using SiluMulFn = void (*)(const float* a, const float* b, float* out, int64_t n);
using LinearSwigluFn = bool (*)(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias,
                                float* out, ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul);
using AttentionFn = void (*)(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk,
                             int Hq, int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool,
                             int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo);
using Conv2dFn = void (*)(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                          const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
                          ThreadPool& pool);

struct KernelEntry {
  Op op;
  DType format;  // the weight format it computes with (kF32 for attention: activations only)
  Isa isa;
  std::string_view name;
  // Only under Precision::kFast: reduced-precision activations (bf16-rounded, int8), or float32 in
  // another form than the exact kernels' (the Winograd conv).
  bool fast = false;
  LinearFn linear = nullptr;
  LinearSwigluFn linear_swiglu = nullptr;  // the same linear with the SwiGLU fused, where the kernel has it
  AttentionFn attention = nullptr;
  Conv2dFn conv2d = nullptr;
  const EltwiseFns* eltwise = nullptr;
};

// Every kernel compiled into this build.
std::span<const KernelEntry> kernel_table();

// Whether selection under this ceiling leaves out the AVX512_BF16 entries: only the automatic
// choice (max_isa = kCount) does, and only where CpuFeatures::bf16_dot_slow says float32 FMA
// is faster; an explicit ceiling (`--isa avx512_bf16`, the tests) keeps them.
bool skips_bf16_dot(const CpuFeatures& cpu, Isa max_isa);
// Likewise for the AVX-512F float32 GEMM where CpuFeatures::zmm_fma_split says the AVX2 one is
// faster: the automatic choice takes gemm_avx2 for the exact linear entries.
bool skips_zmm_gemm(const CpuFeatures& cpu, Isa max_isa);

// The chosen kernel per (op, format): the entry of the highest ISA that the CPU has and that is
// ≤ max_isa, among the exact entries (kFp32), or under kFast among the fast entries when there is
// one (their arithmetic is the caller's choice), else the exact ones. Every (op, format) the
// engine computes has an exact kScalar entry, so selection never fails. The AVX512_BF16
// entries are left out where skips_bf16_dot says so, the AVX-512F float32 GEMM where
// skips_zmm_gemm does.
class KernelSet {
 public:
  static KernelSet select(const CpuFeatures& cpu, Isa max_isa = Isa::kCount,
                          Precision precision = Precision::kFp32);
  // The chosen entry; throws std::invalid_argument when no kernel computes `op` with `format`
  // (a weight of a non-weight format such as I32 reaching a kernel).
  const KernelEntry& get(Op op, DType format) const;
  const KernelEntry* find(Op op, DType format) const;  // null when there is none
  // The chosen element-wise kernels (every set has them: the kScalar row at least).
  const EltwiseFns& eltwise() const { return *get(Op::kElementwise, DType::kF32).eltwise; }
  std::string_view eltwise_name() const { return get(Op::kElementwise, DType::kF32).name; }
  // The highest ISA this set may use: the ceiling, lowered to the best the CPU has.
  Isa max_isa() const { return max_isa_; }
  Precision precision() const { return precision_; }
  // One line per (op, format): "linear BF16: avx2 (gemm_avx2)"; fast entries end in " [fast]".
  std::string describe() const;

 private:
  const KernelEntry* chosen_[static_cast<int>(Op::kCount)][static_cast<int>(DType::kCount)] = {};
  Isa max_isa_ = Isa::kScalar;
  Precision precision_ = Precision::kFp32;
};

// Validated entry points over a KernelSet: argument checks (std::invalid_argument on
// inconsistent arguments), 0 strides resolved, the bias converted to float32, empty problems
// returned early, then the selected kernel for (op, weight format). Semantics as kernels.h /
// conv2d.h describe for linear, attention and conv2d.
void run_linear(const KernelSet& set, const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias,
                float* y, ThreadPool& pool, int64_t ldx = 0, int64_t ldy = 0);
// out[M, F] = SiLU(gate) · up of y = x · Wᵀ (+ bias), W [2F, K] = [gate; up] rows (the DiT's
// feed-forward input), out at row stride ldo (0 = F). By the kernel's fused form where it has one;
// else y goes to u [M, 2F] (row stride ldu, 0 = 2F) and the set's element-wise silu_mul follows.
// The same bits either way (the fused forms promise them).
void run_linear_swiglu(const KernelSet& set, const float* x, int64_t M, int64_t K, const Weight& W,
                       const Weight* bias, float* out, float* u, ThreadPool& pool, int64_t ldx = 0, int64_t ldo = 0,
                       int64_t ldu = 0);
void run_attention(const KernelSet& set, const float* q, const float* k, const float* v, float* out, int64_t Sq,
                   int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool,
                   int64_t ldq = 0, int64_t ldk = 0, int64_t ldv = 0, int64_t ldo = 0);
void run_conv2d(const KernelSet& set, const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W,
                const Weight& w, const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool);

// Multi-line report for `klein info --cpu`: CPU model (from /proc/cpuinfo when present), the
// features found, the usable ISAs, and the kernel chosen per (op, format) in `set`.
std::string describe_cpu(const KernelSet& set);
// The same with both precisions: the fp32 set, then the kernels that differ under kFast.
std::string describe_cpu(const CpuFeatures& cpu, Isa max_isa);

}  // namespace klein::kernels
