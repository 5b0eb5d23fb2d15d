// The ISA table: which x86 instruction-set levels this CPU has, read once from cpuid. Kernels are
// registered per ISA (src/kernels/registry.h) and each Backend instance chooses among those this
// CPU supports, up to a ceiling the caller may lower (tests run every kernel on every ISA here).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace klein {

// In order of preference: among the kernels for one (op, format) that this CPU can run, the one
// with the highest ISA wins, and a ceiling admits every ISA up to it. AVX-VNNI (256-bit int8 dot
// products) ranks below AVX-512, so a CPU with both runs the 512-bit kernels.
enum class Isa : uint8_t {
  kScalar,      // plain C++ (the references)
  kAvx2,        // AVX2 + FMA + F16C
  kAvxVnni,     // AVX2 + AVX-VNNI (int8 dot products on 256-bit vectors)
  kAvx512,      // AVX-512 F/BW/DQ/VL (+ the AVX2 set)
  kAvx512Vnni,  // + AVX512_VNNI (int8 dot products)
  kAvx512Bf16,  // + AVX512_BF16 (bf16 dot products)
  kAmx,         // + AMX-TILE/INT8/BF16 (tile matrix products), with the OS's permission
  kCount,
};

std::string_view isa_name(Isa isa);            // "scalar", "avx2", "avx512", ...
bool isa_from_name(std::string_view s, Isa* out);

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;
  // AMX-TILE + AMX-INT8 + AMX-BF16, XCR0's tile state enabled, and (Linux) the process granted the
  // tile data state by arch_prctl(ARCH_REQ_XCOMP_PERM) — asked once, by host().
  bool amx = false;
  // vdpbf16ps yields fewer flops than float32 FMA on this CPU, so the default (automatic) kernel
  // choice under --precision fast computes bf16 / float weights, attention and convs in float32
  // instead (KernelSet::select). Set for Intel cores: measured on family 6 model 207 (2 × 512-bit
  // FMA units), vdpbf16ps zmm 86 GFLOP/s per core against 176 for FMA zmm; AMD Zen 4 runs it at
  // twice its FMA rate (467 vs 231 GFLOP/s on 2 cores). Intel's fast bf16 path is AMX instead.
  bool bf16_dot_slow = false;
  // A 512-bit FMA runs as two 256-bit halves (AMD Zen 4: family 19h with AVX-512), so zmm gives
  // the float32 FMA peak of ymm (117.5 GFLOP/s per core either way, klein-bench_kernels), and
  // there the AVX2 float32 GEMM out-runs the AVX-512F one (DiT shapes at M = 768, 2 threads:
  // 87-92 % against 72-86 % of that peak; a 256² float32 denoising step 24.0-24.5 s against
  // 27.4 s). The automatic kernel choice then takes the AVX2 float32 GEMM (KernelSet::select).
  bool zmm_fma_split = false;

  // This CPU (cpuid, and the OS's xgetbv state for the wide registers). Cached.
  static const CpuFeatures& host();
  bool has(Isa isa) const;
  // Every ISA this CPU supports, kScalar first.
  std::vector<Isa> isas() const;
  // "avx2 fma f16c avx512f ..." — the features found.
  std::string flags() const;
};

}  // namespace klein
