// The ISA table: which x86 instruction-set levels this CPU has, read once from cpuid. Kernels are
// registered per ISA (src/kernels/registry.h) and each Backend instance chooses among those this
// CPU supports, up to a ceiling the caller may lower (tests run every kernel on every ISA here).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace klein {

// Ordered from the most portable to the most specific; a kernel for ISA i needs every feature
// listed for it in isa_requirements(i).
enum class Isa : uint8_t {
  kScalar,      // plain C++ (the references)
  kAvx2,        // AVX2 + FMA + F16C
  kAvx512,      // AVX-512 F/BW/DQ/VL
  kAvx512Vnni,  // + AVX512_VNNI (int8 dot products)
  kAvx512Bf16,  // + AVX512_BF16 (bf16 dot products)
  kAvxVnni,     // AVX2 + AVX-VNNI (int8 dot products on 256-bit vectors)
  kCount,
};

std::string_view isa_name(Isa isa);            // "scalar", "avx2", "avx512", ...
bool isa_from_name(std::string_view s, Isa* out);

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;

  // This CPU (cpuid, and the OS's xgetbv state for the wide registers). Cached.
  static const CpuFeatures& host();
  bool has(Isa isa) const;
  // Every ISA this CPU supports, kScalar first.
  std::vector<Isa> isas() const;
  // "avx2 fma f16c avx512f ..." — the features found.
  std::string flags() const;
};

}  // namespace klein
