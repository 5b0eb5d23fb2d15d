// The ISA table (CpuFeatures) and the kernel registry: selection honours the ceiling, every
// format the kernels compute with has a kernel for every op at every ceiling, and the reports
// name what was chosen.
#include <gtest/gtest.h>

#include <algorithm>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <tuple>
#include <string>

#include "core/cpu_features.h"
#include "core/format.h"
#include "kernels/registry.h"

namespace klein {
namespace {

using kernels::KernelSet;
using kernels::Op;

TEST(CpuFeatures, HostIsas) {
  const std::vector<Isa> isas = CpuFeatures::host().isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  EXPECT_TRUE(std::is_sorted(isas.begin(), isas.end()));
#if defined(__x86_64__)
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  EXPECT_EQ(std::count(isas.begin(), isas.end(), Isa::kAvx2), avx2 ? 1 : 0);
  EXPECT_EQ(CpuFeatures::host().avx512f, static_cast<bool>(__builtin_cpu_supports("avx512f")));
#endif
  for (Isa isa : isas) EXPECT_TRUE(CpuFeatures::host().has(isa));
  EXPECT_FALSE(CpuFeatures::host().has(Isa::kCount));
}

TEST(CpuFeatures, IsaRequirements) {
  CpuFeatures f;  // nothing
  EXPECT_EQ(f.isas(), std::vector<Isa>{Isa::kScalar});
  EXPECT_EQ(f.flags(), "none");
  f.avx2 = f.fma = true;
  EXPECT_FALSE(f.has(Isa::kAvx2));  // F16C missing
  f.f16c = true;
  EXPECT_TRUE(f.has(Isa::kAvx2));
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vnni = f.avxvnni = true;
  EXPECT_FALSE(f.has(Isa::kAvx512));  // VL missing
  EXPECT_FALSE(f.has(Isa::kAvx512Vnni));
  EXPECT_TRUE(f.has(Isa::kAvxVnni));  // AVX-VNNI needs only the AVX2 set
  f.avx512vl = true;
  EXPECT_EQ(f.isas(), (std::vector<Isa>{Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512, Isa::kAvx512Vnni}));
  EXPECT_EQ(f.flags(), "avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512_vnni avx_vnni");
  f.amx = true;
  EXPECT_FALSE(f.has(Isa::kAmx));  // AMX kernels also use AVX512_BF16 (the activations' rounding)
  f.avx512bf16 = true;
  EXPECT_TRUE(f.has(Isa::kAmx));
  EXPECT_EQ(f.isas().back(), Isa::kAmx);
}

TEST(CpuFeatures, IsaNamesRoundTrip) {
  for (int i = 0; i < static_cast<int>(Isa::kCount); ++i) {
    const Isa isa = static_cast<Isa>(i);
    Isa back = Isa::kCount;
    ASSERT_TRUE(isa_from_name(isa_name(isa), &back)) << isa_name(isa);
    EXPECT_EQ(back, isa);
  }
  Isa out;
  EXPECT_FALSE(isa_from_name("sse9", &out));
  EXPECT_FALSE(isa_from_name("", &out));
  EXPECT_EQ(isa_name(Isa::kAvx512Bf16), "avx512_bf16");
}

// Each (op, format) the engine computes: linear and conv2d for every is_weight format, attention
// and the element-wise table on float32 activations.
std::vector<std::pair<Op, DType>> computed_pairs() {
  std::vector<std::pair<Op, DType>> v = {{Op::kAttention, DType::kF32}, {Op::kElementwise, DType::kF32}};
  for (const FormatTraits& f : format_table())
    if (f.is_weight) {
      v.push_back({Op::kLinear, f.id});
      v.push_back({Op::kConv2d, f.id});
    }
  return v;
}

TEST(KernelRegistry, EveryComputedPairHasAScalarKernel) {
  for (const auto& pair : computed_pairs()) {
    // Plain variables: clang 14 cannot capture a structured binding in the lambda below.
    const auto op = std::get<0>(pair);
    const auto fmt = std::get<1>(pair);
    const auto t = kernels::kernel_table();
    EXPECT_TRUE(std::any_of(t.begin(), t.end(), [&](const kernels::KernelEntry& e) {
      return e.op == op && e.format == fmt && e.isa == Isa::kScalar;
    })) << op_name(op) << " " << dtype_name(fmt);
  }
}

TEST(KernelRegistry, SelectNeverLeavesAComputedPairEmpty) {
  const CpuFeatures none;  // a CPU with no SIMD at all
  for (const CpuFeatures* cpu : {&CpuFeatures::host(), &none})
    for (int c = 0; c <= static_cast<int>(Isa::kCount); ++c) {
      const KernelSet set = KernelSet::select(*cpu, static_cast<Isa>(c));
      for (auto [op, fmt] : computed_pairs()) {
        const kernels::KernelEntry* e = set.find(op, fmt);
        ASSERT_NE(e, nullptr) << op_name(op) << " " << dtype_name(fmt) << " ceiling " << c;
        EXPECT_EQ(e->op, op);
        EXPECT_EQ(e->format, fmt);
        EXPECT_TRUE(cpu->has(e->isa));
        EXPECT_LE(static_cast<int>(e->isa), c);
        const bool fn = op == Op::kLinear        ? e->linear != nullptr
                        : op == Op::kAttention   ? e->attention != nullptr
                        : op == Op::kElementwise ? e->eltwise != nullptr
                                                 : e->conv2d != nullptr;
        EXPECT_TRUE(fn) << e->name;
      }
    }
}

TEST(KernelRegistry, EveryWeightFormatHasLinearAndConv) {
  const KernelSet set = KernelSet::select(CpuFeatures::host());
  for (const FormatTraits& f : format_table()) {
    EXPECT_EQ(set.find(Op::kLinear, f.id) != nullptr, f.is_weight) << f.name;
    EXPECT_EQ(set.find(Op::kConv2d, f.id) != nullptr, f.is_weight) << f.name;
  }
  EXPECT_THROW(set.get(Op::kLinear, DType::kI32), std::invalid_argument);
}

TEST(KernelRegistry, SelectionHonoursTheCeiling) {
  const KernelSet scalar = KernelSet::select(CpuFeatures::host(), Isa::kScalar);
  EXPECT_EQ(scalar.max_isa(), Isa::kScalar);
  for (auto [op, fmt] : computed_pairs()) EXPECT_EQ(scalar.get(op, fmt).isa, Isa::kScalar);

  // The default ceiling picks the best compiled kernel the CPU can run.
  const KernelSet best = KernelSet::select(CpuFeatures::host());
  EXPECT_EQ(best.max_isa(), CpuFeatures::host().isas().back());
#if defined(KLEIN_X86)
  if (CpuFeatures::host().has(Isa::kAvx2)) {
    const Isa gemm = CpuFeatures::host().has(Isa::kAvx512) ? Isa::kAvx512 : Isa::kAvx2;
    // The float32 GEMM: AVX2 also where 512-bit FMA is split in halves (zmm_fma_split, Zen 4).
    const Isa linear = CpuFeatures::host().zmm_fma_split ? Isa::kAvx2 : gemm;
    EXPECT_EQ(best.get(Op::kLinear, DType::kBF16).isa, linear);
    EXPECT_EQ(best.get(Op::kLinear, DType::kQ8Row).isa, linear);
    EXPECT_EQ(best.get(Op::kAttention, DType::kF32).isa, Isa::kAvx2);
    EXPECT_EQ(best.get(Op::kConv2d, DType::kQ8Row).isa, gemm);
    // Under kFast the conv rounds to bf16 exactly where the CPU has AVX512_BF16 and its bf16 dot
    // products out-run float32 FMA, or has AMX (whose tiles do); elsewhere it is the float32
    // Winograd form of the float32 GEMM's ISA.
    const KernelSet fast = KernelSet::select(CpuFeatures::host(), Isa::kCount, kernels::Precision::kFast);
    const bool bf16_conv = (CpuFeatures::host().has(Isa::kAvx512Bf16) && !CpuFeatures::host().bf16_dot_slow) ||
                           CpuFeatures::host().has(Isa::kAmx);
    EXPECT_TRUE(fast.get(Op::kConv2d, DType::kBF16).fast);
    if (!bf16_conv) EXPECT_EQ(fast.get(Op::kConv2d, DType::kBF16).isa, gemm);
    EXPECT_EQ(fast.get(Op::kConv2d, DType::kBF16).isa >= Isa::kAvx512Bf16, bf16_conv);
    EXPECT_EQ(best.get(Op::kElementwise, DType::kF32).isa, gemm);  // AVX-512 where the CPU has it
    EXPECT_EQ(&best.eltwise(), best.get(Op::kElementwise, DType::kF32).eltwise);
    // An ISA with no kernels of its own falls back to the next lower one that has them.
    if (CpuFeatures::host().has(Isa::kAvx512Vnni))
      EXPECT_EQ(KernelSet::select(CpuFeatures::host(), Isa::kAvx512Vnni).get(Op::kLinear, DType::kF32).isa,
                Isa::kAvx512);
    if (CpuFeatures::host().has(Isa::kAvxVnni)) {
      EXPECT_EQ(KernelSet::select(CpuFeatures::host(), Isa::kAvxVnni).get(Op::kLinear, DType::kF32).isa, Isa::kAvx2);
      EXPECT_EQ(KernelSet::select(CpuFeatures::host(), Isa::kAvxVnni).get(Op::kElementwise, DType::kF32).name,
                "eltwise_avx2");
    }
  }
#endif
  // A ceiling the CPU lacks is lowered to what it has.
  EXPECT_EQ(KernelSet::select(CpuFeatures{}, Isa::kAvx512).max_isa(), Isa::kScalar);
}

TEST(KernelRegistry, PrecisionSelectsFastEntriesOnlyUnderFast) {
  // kFp32 never picks a fast entry; kFast picks, per (op, format), the highest-ISA fast entry
  // the CPU can run, else the highest exact one. Checked on the host and on synthetic CPUs.
  CpuFeatures avx2;
  avx2.avx2 = avx2.fma = avx2.f16c = true;
  CpuFeatures vnni = avx2;
  vnni.avxvnni = true;
  CpuFeatures all = vnni;
  all.avx512f = all.avx512bw = all.avx512dq = all.avx512vl = all.avx512vnni = all.avx512bf16 = true;
  const CpuFeatures none;
  for (const CpuFeatures* cpu : std::initializer_list<const CpuFeatures*>{&CpuFeatures::host(), &none, &avx2, &vnni, &all})
    for (int c = 0; c <= static_cast<int>(Isa::kCount); ++c) {
      const KernelSet exact = KernelSet::select(*cpu, static_cast<Isa>(c), kernels::Precision::kFp32);
      const KernelSet fast = KernelSet::select(*cpu, static_cast<Isa>(c), kernels::Precision::kFast);
      EXPECT_EQ(exact.precision(), kernels::Precision::kFp32);
      EXPECT_EQ(fast.precision(), kernels::Precision::kFast);
      for (auto [op, fmt] : computed_pairs()) {
        EXPECT_FALSE(exact.get(op, fmt).fast) << op_name(op) << " " << dtype_name(fmt);
        const kernels::KernelEntry& f = fast.get(op, fmt);
        EXPECT_TRUE(cpu->has(f.isa));
        for (const kernels::KernelEntry& e : kernels::kernel_table())
          if (e.op == op && e.format == fmt && cpu->has(e.isa) && static_cast<int>(e.isa) <= c &&
              !(kernels::skips_bf16_dot(*cpu, static_cast<Isa>(c)) && e.isa == Isa::kAvx512Bf16) &&
              !(kernels::skips_zmm_gemm(*cpu, static_cast<Isa>(c)) && e.op == Op::kLinear && e.isa == Isa::kAvx512 &&
                !e.fast)) {
            if (e.fast) EXPECT_TRUE(f.fast) << f.name;
            if (e.fast == f.fast) EXPECT_LE(e.isa, f.isa) << e.name << " beats " << f.name;
          }
      }
      // Q8_ROW weights are always W8A8 under kFast (the scalar reference at least).
      EXPECT_TRUE(fast.get(Op::kLinear, DType::kQ8Row).fast);
    }
#if defined(KLEIN_X86)
  const KernelSet f_all = KernelSet::select(all, Isa::kCount, kernels::Precision::kFast);
  EXPECT_EQ(f_all.get(Op::kLinear, DType::kQ8Row).name, "gemm_int8_avx512vnni");
  EXPECT_EQ(f_all.get(Op::kLinear, DType::kBF16).name, "gemm_bf16_avx512bf16");
  EXPECT_EQ(f_all.get(Op::kLinear, DType::kF32).name, "gemm_bf16_avx512bf16");
  EXPECT_EQ(KernelSet::select(all, Isa::kCount).get(Op::kLinear, DType::kBF16).name, "gemm_avx512");
  EXPECT_EQ(KernelSet::select(vnni, Isa::kCount, kernels::Precision::kFast).get(Op::kLinear, DType::kQ8Row).name,
            "gemm_int8_avxvnni");
  EXPECT_EQ(KernelSet::select(avx2, Isa::kCount, kernels::Precision::kFast).get(Op::kLinear, DType::kQ8Row).name,
            "gemm_int8_avx2");
  EXPECT_EQ(KernelSet::select(avx2, Isa::kCount, kernels::Precision::kFast).get(Op::kLinear, DType::kBF16).name,
            "gemm_avx2");
  EXPECT_EQ(KernelSet::select(avx2, Isa::kCount, kernels::Precision::kFast).get(Op::kConv2d, DType::kBF16).name,
            "conv2d_winograd_avx2");
  EXPECT_EQ(KernelSet::select(avx2, Isa::kCount).get(Op::kConv2d, DType::kBF16).name, "conv2d_avx2");
  // Where a 512-bit FMA is two 256-bit halves (Zen 4), the automatic choice takes the AVX2
  // float32 GEMM for every weight format under kFp32 (and keeps the AVX-512F convs and
  // elementwise kernels and, under kFast, the dot-product kernels); naming the ISA gets the
  // AVX-512F GEMM.
  CpuFeatures zen4 = all;
  zen4.zmm_fma_split = true;
  const KernelSet e_zen4 = KernelSet::select(zen4, Isa::kCount);
  for (DType fmt : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8Row, DType::kQ4G64})
    EXPECT_EQ(e_zen4.get(Op::kLinear, fmt).name, "gemm_avx2") << dtype_name(fmt);
  EXPECT_EQ(e_zen4.get(Op::kConv2d, DType::kBF16).name, "conv2d_avx512");
  EXPECT_EQ(e_zen4.get(Op::kElementwise, DType::kF32).name, "eltwise_avx512");
  EXPECT_EQ(KernelSet::select(zen4, Isa::kAvx512Bf16).get(Op::kLinear, DType::kBF16).name, "gemm_avx512");
  const KernelSet f_zen4 = KernelSet::select(zen4, Isa::kCount, kernels::Precision::kFast);
  EXPECT_EQ(f_zen4.get(Op::kLinear, DType::kBF16).name, "gemm_bf16_avx512bf16");
  EXPECT_EQ(f_zen4.get(Op::kLinear, DType::kQ4G64).name, "gemm_w4a8_avx512vnni");
  // Where bf16 dot products are slower than float32 FMA (Intel), the automatic choice computes
  // float formats, attention and convs in float32 (the convs in the float32 Winograd form) and
  // keeps the int8 kernels; naming the ISA
  // still gets the bf16 kernels.
  CpuFeatures intel = all;
  intel.bf16_dot_slow = true;
  const KernelSet f_intel = KernelSet::select(intel, Isa::kCount, kernels::Precision::kFast);
  EXPECT_EQ(f_intel.get(Op::kLinear, DType::kBF16).name, "gemm_avx512");
  EXPECT_EQ(f_intel.get(Op::kLinear, DType::kF32).name, "gemm_avx512");
  EXPECT_EQ(f_intel.get(Op::kConv2d, DType::kBF16).name, "conv2d_winograd_avx512");
  EXPECT_EQ(f_intel.get(Op::kAttention, DType::kF32).name, "flash_attention_avx2");
  EXPECT_EQ(f_intel.get(Op::kLinear, DType::kQ8Row).name, "gemm_int8_avx512vnni");
  EXPECT_EQ(f_intel.get(Op::kLinear, DType::kQ4G64).name, "gemm_w4a8_avx512vnni");
  EXPECT_EQ(f_intel.max_isa(), Isa::kAvx512Bf16);
  const KernelSet named = KernelSet::select(intel, Isa::kAvx512Bf16, kernels::Precision::kFast);
  EXPECT_EQ(named.get(Op::kLinear, DType::kBF16).name, "gemm_bf16_avx512bf16");
  EXPECT_EQ(named.get(Op::kConv2d, DType::kBF16).name, "conv2d_bf16_avx512bf16");
  EXPECT_EQ(named.get(Op::kAttention, DType::kF32).name, "flash_attention_bf16_avx512bf16");
  // With AMX (Intel), the tile kernels take every weight format, attention and convs under kFast,
  // also in the automatic choice.
  CpuFeatures amx = intel;
  amx.amx = true;
  const KernelSet f_amx = KernelSet::select(amx, Isa::kCount, kernels::Precision::kFast);
  EXPECT_EQ(f_amx.max_isa(), Isa::kAmx);
  EXPECT_EQ(f_amx.get(Op::kLinear, DType::kQ8Row).name, "gemm_int8_amx");
  EXPECT_EQ(f_amx.get(Op::kLinear, DType::kBF16).name, "gemm_bf16_amx");
  EXPECT_EQ(f_amx.get(Op::kLinear, DType::kF32).name, "gemm_bf16_amx");
  EXPECT_EQ(f_amx.get(Op::kLinear, DType::kQ4G64).name, "gemm_w4a8_amx");
  EXPECT_EQ(f_amx.get(Op::kConv2d, DType::kBF16).name, "conv2d_bf16_amx");
  EXPECT_EQ(f_amx.get(Op::kAttention, DType::kF32).name, "flash_attention_bf16_amx");
  EXPECT_EQ(KernelSet::select(amx, Isa::kCount).get(Op::kLinear, DType::kBF16).name, "gemm_avx512");
  EXPECT_EQ(KernelSet::select(amx, Isa::kAvx512Vnni, kernels::Precision::kFast).get(Op::kLinear, DType::kQ8Row).name,
            "gemm_int8_avx512vnni");
#endif
  kernels::Precision p;
  EXPECT_TRUE(kernels::precision_from_name("fast", &p));
  EXPECT_EQ(p, kernels::Precision::kFast);
  EXPECT_TRUE(kernels::precision_from_name("fp32", &p));
  EXPECT_EQ(p, kernels::Precision::kFp32);
  EXPECT_FALSE(kernels::precision_from_name("int8", &p));
}

TEST(KernelRegistry, DescribeListsEveryPair) {
  const KernelSet set = KernelSet::select(CpuFeatures::host());
  const std::string d = set.describe();
  for (auto [op, fmt] : computed_pairs()) {
    const kernels::KernelEntry& e = set.get(op, fmt);
    const std::string line = std::string(op_name(op)) + " " + std::string(dtype_name(fmt)) + ": " +
                             std::string(isa_name(e.isa)) + " (" + std::string(e.name) + ")\n";
    EXPECT_NE(d.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(std::count(d.begin(), d.end(), '\n'), static_cast<long>(computed_pairs().size()));

  const std::string cpu = kernels::describe_cpu(set);
  EXPECT_EQ(cpu.rfind("cpu: ", 0), 0u) << cpu;
  EXPECT_NE(cpu.find("features: " + CpuFeatures::host().flags() + "\n"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("isas: scalar"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("  linear BF16: "), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("  elementwise F32: "), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("precision fp32"), std::string::npos) << cpu;
  std::printf("%s", cpu.c_str());

  // The report with both precisions lists what kFast changes (always Q8_ROW: W8A8).
  const std::string both = kernels::describe_cpu(CpuFeatures::host(), Isa::kCount);
  EXPECT_NE(both.find("kernels that differ with precision fast (the default;"), std::string::npos) << both;
  EXPECT_NE(both.find("  linear Q8_ROW: "), std::string::npos) << both;
  EXPECT_NE(both.find("[fast]\n"), std::string::npos) << both;
  const KernelSet f = KernelSet::select(CpuFeatures::host(), Isa::kCount, kernels::Precision::kFast);
  EXPECT_NE(f.describe().find(std::string(f.get(Op::kLinear, DType::kQ8Row).name) + ") [fast]\n"),
            std::string::npos);
}

}  // namespace
}  // namespace klein
