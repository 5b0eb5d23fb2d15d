// describe_cpu: what `klein info --cpu` prints — enough to tell from a user's report which
// kernels ran and why (a missing ISA usually means an old CPU or an OS without AVX state saving).
#include <fstream>
#include <string>

#include "kernels/registry.h"

namespace klein::kernels {
namespace {

// "model name : AMD EPYC ..." from /proc/cpuinfo; "unknown" where there is none (non-Linux, ARM).
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? "unknown" : line.substr(b);
  }
  return "unknown";
}

}  // namespace

std::string describe_cpu(const KernelSet& set) {
  const CpuFeatures& cpu = CpuFeatures::host();
  std::string s = "cpu: " + cpu_model() + "\n";
  s += "features: " + cpu.flags() + "\n";
  s += "isas:";
  for (Isa isa : cpu.isas()) {
    s += ' ';
    s += isa_name(isa);
  }
  s += "\nkernels (up to ";
  s += isa_name(set.max_isa());
  s += ", precision ";
  s += precision_name(set.precision());
  s += "):\n";
  const std::string k = set.describe();
  for (size_t b = 0; b < k.size();) {  // indent each line
    const size_t e = k.find('\n', b);
    s += "  ";
    s.append(k, b, e - b + 1);
    b = e + 1;
  }
  return s;
}

std::string describe_cpu(const CpuFeatures& cpu, Isa max_isa) {
  const KernelSet exact = KernelSet::select(cpu, max_isa, Precision::kFp32);
  const KernelSet fast = KernelSet::select(cpu, max_isa, Precision::kFast);
  std::string s = describe_cpu(exact);
  // Under --precision fast only some (op, format) pairs change kernel: list those.
  std::string diff;
  for (int op = 0; op < static_cast<int>(Op::kCount); ++op)
    for (int f = 0; f < static_cast<int>(DType::kCount); ++f) {
      const KernelEntry* a = exact.find(static_cast<Op>(op), static_cast<DType>(f));
      const KernelEntry* b = fast.find(static_cast<Op>(op), static_cast<DType>(f));
      if (a && b && a != b)
        diff += "  " + std::string(op_name(b->op)) + " " + std::string(dtype_name(b->format)) + ": " +
                std::string(isa_name(b->isa)) + " (" + std::string(b->name) + ")" + (b->fast ? " [fast]" : "") + "\n";
    }
  s += "kernels that differ with precision fast (the default; --precision fp32 keeps the list above):\n";
  s += diff.empty() ? "  (none: this CPU has no dot-product kernels under this ceiling)\n" : diff;
  if (skips_bf16_dot(cpu, max_isa))
    s += cpu.has(Isa::kAmx)
             ? "bf16 dot products: on AMX tiles; the AVX512_BF16 kernels are not used by default (slower than float32 "
               "FMA on this CPU; --isa avx512_bf16 forces them)\n"
             : "bf16 dot products: not used by default (slower than float32 FMA on this CPU; --isa avx512_bf16 forces "
               "them)\n";
  if (skips_zmm_gemm(cpu, max_isa))
    s += "float32 GEMM: the AVX2 kernel by default (512-bit FMA runs as two 256-bit halves on this CPU, and the "
         "AVX2 GEMM measured faster; --isa avx512 forces the AVX-512F one)\n";
  return s;
}

}  // namespace klein::kernels
