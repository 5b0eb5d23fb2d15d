// CpuFeatures::host(): cpuid for what the CPU implements, xgetbv for what the OS saves on a
// context switch — a CPU with AVX-512 under an OS that does not save ZMM state cannot use it, so
// each flag below means "usable", not merely "implemented".
#include "core/cpu_features.h"

#include <array>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace klein {
namespace {

constexpr std::array<std::string_view, static_cast<int>(Isa::kCount)> kIsaNames = {
    "scalar", "avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_bf16", "amx"};

#if defined(__x86_64__)
bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// XCR0 through inline asm rather than _xgetbv(), which needs -mxsave on this translation unit.
uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Linux enables the 8 KB tile data state per process, on request: without it the first tile
// instruction faults (SIGILL). Asking is idempotent; a kernel that refuses (or predates AMX,
// < 5.16) leaves AMX unused.
bool amx_permitted() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = bit(c, 12), osxsave = bit(c, 27), avx = bit(c, 28), f16c = bit(c, 29);
  if (!osxsave || !avx) return f;  // no xgetbv, or no AVX at all
  const uint64_t x = xcr0();
  const bool ymm_os = (x & 0x6) == 0x6;     // XMM (bit 1) and YMM (bit 2) state
  const bool zmm_os = (x & 0xe6) == 0xe6;   // + opmask (5), ZMM0-15 upper (6), ZMM16-31 (7)
  if (!ymm_os) return f;
  f.fma = fma;
  f.f16c = f16c;
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0, b71, c71, d71;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return f;
  const bool has_leaf71 = a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
  if (!has_leaf71) a71 = 0;
  f.avx2 = bit(b7, 5);
  f.avxvnni = bit(a71, 4);
  if (zmm_os) {
    f.avx512f = bit(b7, 16);
    f.avx512dq = bit(b7, 17);
    f.avx512bw = bit(b7, 30);
    f.avx512vl = bit(b7, 31);
    f.avx512vnni = bit(c7, 11);
    f.avx512bf16 = bit(a71, 5);
    // AMX: TILE (edx bit 24), INT8 (25), BF16 (22); XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA).
    const bool amx_os = ((x >> 17) & 3) == 3;
    f.amx = amx_os && bit(d7, 24) && bit(d7, 25) && bit(d7, 22) && amx_permitted();
  }
  unsigned max_leaf, vb, vc, vd;  // vendor string: ebx, edx, ecx of leaf 0
  __cpuid(0, max_leaf, vb, vc, vd);
  const bool intel = vb == 0x756e6547 && vd == 0x49656e69 && vc == 0x6c65746e;  // "Genu" "ineI" "ntel"
  f.bf16_dot_slow = f.avx512bf16 && intel;
  const bool amd = vb == 0x68747541 && vd == 0x69746e65 && vc == 0x444d4163;  // "Auth" "enti" "cAMD"
  const unsigned base_family = (a >> 8) & 0xf;
  const unsigned family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  f.zmm_fma_split = f.avx512f && amd && family == 0x19;
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

}  // namespace

std::string_view isa_name(Isa isa) {
  const auto i = static_cast<size_t>(isa);
  return i < kIsaNames.size() ? kIsaNames[i] : "unknown";
}

bool isa_from_name(std::string_view s, Isa* out) {
  for (size_t i = 0; i < kIsaNames.size(); ++i)
    if (kIsaNames[i] == s) {
      *out = static_cast<Isa>(i);
      return true;
    }
  return false;
}

const CpuFeatures& CpuFeatures::host() {
  static const CpuFeatures f = detect();
  return f;
}

bool CpuFeatures::has(Isa isa) const {
  const bool v2 = avx2 && fma && f16c;
  const bool v512 = v2 && avx512f && avx512bw && avx512dq && avx512vl;
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return v2;
    case Isa::kAvx512: return v512;
    case Isa::kAvx512Vnni: return v512 && avx512vnni;
    case Isa::kAvx512Bf16: return v512 && avx512bf16;
    case Isa::kAvxVnni: return v2 && avxvnni;
    case Isa::kAmx: return v512 && avx512vnni && avx512bf16 && amx;
    case Isa::kCount: break;
  }
  return false;
}

std::vector<Isa> CpuFeatures::isas() const {
  std::vector<Isa> v;
  for (int i = 0; i < static_cast<int>(Isa::kCount); ++i)
    if (has(static_cast<Isa>(i))) v.push_back(static_cast<Isa>(i));
  return v;
}

std::string CpuFeatures::flags() const {
  const std::pair<bool, const char*> all[] = {
      {avx2, "avx2"},         {fma, "fma"},           {f16c, "f16c"},
      {avx512f, "avx512f"},   {avx512bw, "avx512bw"}, {avx512dq, "avx512dq"},
      {avx512vl, "avx512vl"}, {avx512vnni, "avx512_vnni"}, {avx512bf16, "avx512_bf16"},
      {avxvnni, "avx_vnni"},  {amx, "amx"}};
  std::string s;
  for (const auto& [on, name] : all)
    if (on) {
      if (!s.empty()) s += ' ';
      s += name;
    }
  return s.empty() ? "none" : s;
}

}  // namespace klein
