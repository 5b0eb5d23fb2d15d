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

}  // namespace klein::kernels
