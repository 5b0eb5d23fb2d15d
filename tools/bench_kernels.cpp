// klein-bench_kernels: measures this machine's peaks — float32 FMA (ymm and zmm), bf16 dot
// product (vdpbf16ps), int8 dot product (vpdpbusd zmm and ymm; AVX2's vpmaddubsw sequence) —
// and each GEMM kernel on the DiT's shapes as a % of the peak of its instruction, the conv2d
// kernels on the VAE decoder's shapes, plus attention,
// so kernel changes can be judged in % of peak rather than in absolute seconds. "mix" rows time
// micro-kernels' instruction mixes in registers (VNNI, AVX2) or on operands in L1 (AMX): the
// ceiling of those kernels on this core before L2 / L3 traffic.
// At N = 18432 (the MLP input) the kernels that fuse the SwiGLU get two more rows: the linear
// followed by silu_mul, and run_linear_swiglu.
//
//   klein-bench_kernels [--threads N] [--reps R] [--quick] [--isa NAME] [--m M...] [--attn-s S...]
//                       [--only KERNEL]
//
// --isa caps the kernel selection (scalar, avx2, ...) to time a lower ISA's kernels on this CPU.
// The peaks are measured before and after the kernels; each is the better of the two.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <time.h>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/format.h"
#include "core/format_gguf.h"
#include "core/host_memory.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/registry.h"

#if defined(KLEIN_X86)
#include <immintrin.h>
#endif
#include "bench_timing.h"

using namespace klein;

namespace {

struct FreeHost {
  void operator()(void* p) const { std::free(p); }
};
// A copy of v in a buffer from host_alloc_bytes, as the library allocates its tensors.
template <class T>
std::unique_ptr<T[], FreeHost> host_copy(const std::vector<T>& v) {
  std::unique_ptr<T[], FreeHost> p(static_cast<T*>(host_alloc_bytes(v.size() * sizeof(T))));
  if (!p) throw std::bad_alloc();
  std::memcpy(p.get(), v.data(), v.size() * sizeof(T));
  return p;
}

using bench::cpu_s;
using bench::now_s;
using bench::Time;
using bench::time_best;

// Evicts [p, p + n) from every cache level (clflush per line; the fence orders it before timing).
void evict(const void* p, size_t n) {
#if defined(KLEIN_X86)
  const auto* b = static_cast<const char*>(p);
  for (size_t i = 0; i < n; i += 64) _mm_clflush(b + i);
  _mm_mfence();
#else
  (void)p, (void)n;
#endif
}

#if defined(KLEIN_X86)
// Peak loops: 12 independent accumulator chains of one instruction (ymm: 16 registers, 2 hold
// the operands) — more than its latency (4-5 cycles) × issue width (≤ 2) in flight, so each runs
// at the instruction's throughput with no spills.
// Each returns a value derived from the chains so nothing is elided. `ops` per instruction:
// an FMA lane is 2 flop; a vdpbf16ps lane 2 products + 2 adds; a vpdpbusd lane 4 × (mul + add).
// Named accumulators, not an array: GCC keeps arrays of vectors partly on the stack.
#define KLEIN_CH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define KLEIN_PEAK_LOOP(T, init, step, reduce)                   \
  constexpr int kChains = 12;                                    \
  _Pragma("GCC diagnostic push")                                 \
  _Pragma("GCC diagnostic ignored \"-Wunused-variable\"")        \
  KLEIN_CH(KLEIN_PEAK_INIT)                                      \
  for (int64_t i = 0; i < iters; ++i) {                          \
    KLEIN_BARRIER();                                             \
    KLEIN_CH(KLEIN_PEAK_STEP)                                    \
  }                                                              \
  T s = a0;                                                      \
  KLEIN_CH(KLEIN_PEAK_RED)                                       \
  _Pragma("GCC diagnostic pop")                                  \
  return s

// The operands pass through an empty asm (no instruction) each iteration, so the compiler can
// neither hoist nor share a loop-invariant product.
#define KLEIN_BARRIER() asm volatile("" : "+x"(m), "+x"(c))
__attribute__((target("avx2,fma"))) __m256 fma256_chains(int64_t iters, __m256 m, __m256 c) {
#define KLEIN_PEAK_INIT(j) __m256 a##j = _mm256_set1_ps(0.001f * j);
#define KLEIN_PEAK_STEP(j) a##j = _mm256_fmadd_ps(a##j, m, c);
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm256_add_ps(s, a##j);
  KLEIN_PEAK_LOOP(__m256, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx2,fma"))) float fma256_loop(int64_t iters) {
  float out[8];
  _mm256_storeu_ps(out, fma256_chains(iters, _mm256_set1_ps(0.99999f), _mm256_set1_ps(1e-5f)));
  return out[0] + out[7];
}
__attribute__((target("avx512f"))) __m512 fma512_chains(int64_t iters, __m512 m, __m512 c) {
#define KLEIN_PEAK_INIT(j) __m512 a##j = _mm512_set1_ps(0.001f * j);
#define KLEIN_PEAK_STEP(j) a##j = _mm512_fmadd_ps(a##j, m, c);
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm512_add_ps(s, a##j);
  KLEIN_PEAK_LOOP(__m512, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx512f"))) float fma512_loop(int64_t iters) {
  return _mm512_reduce_add_ps(fma512_chains(iters, _mm512_set1_ps(0.99999f), _mm512_set1_ps(1e-5f)));
}
__attribute__((target("avx512f,avx512bf16"))) __m512 bf16_chains(int64_t iters, __m512 m, __m512 c) {
#define KLEIN_PEAK_INIT(j) __m512 a##j = _mm512_set1_ps(0.001f * j);
#define KLEIN_PEAK_STEP(j) a##j = _mm512_dpbf16_ps(a##j, (__m512bh)_mm512_castps_si512(m), (__m512bh)_mm512_castps_si512(c));
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm512_add_ps(s, a##j);
  KLEIN_PEAK_LOOP(__m512, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx512f,avx512bf16"))) float bf16_loop(int64_t iters) {
  // bf16 pairs (1.0, 1e-5-ish): the sums stay finite.
  return _mm512_reduce_add_ps(bf16_chains(iters, _mm512_castsi512_ps(_mm512_set1_epi16(0x3f80)),
                                          _mm512_castsi512_ps(_mm512_set1_epi16(0x3727))));
}
__attribute__((target("avx512f,avx512vnni"))) __m512i vnni512_chains(int64_t iters, __m512i m, __m512i c) {
#define KLEIN_PEAK_INIT(j) __m512i a##j = _mm512_set1_epi32(j);
#define KLEIN_PEAK_STEP(j) a##j = _mm512_dpbusd_epi32(a##j, m, c);
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm512_add_epi32(s, a##j);
  KLEIN_PEAK_LOOP(__m512i, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx512f,avx512vnni"))) float vnni512_loop(int64_t iters) {
  return static_cast<float>(_mm512_reduce_add_epi32(vnni512_chains(iters, _mm512_set1_epi8(3), _mm512_set1_epi8(-2))));
}
__attribute__((target("avx2,avxvnni"))) __m256i vnni256_chains(int64_t iters, __m256i m, __m256i c) {
#define KLEIN_PEAK_INIT(j) __m256i a##j = _mm256_set1_epi32(j);
// Inline asm: GCC 12 keeps these accumulators partly on the stack when written with the intrinsic.
#define KLEIN_PEAK_STEP(j) asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(a##j) : "x"(m), "x"(c));
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm256_add_epi32(s, a##j);
  KLEIN_PEAK_LOOP(__m256i, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx2,avxvnni"))) float vnni256_loop(int64_t iters) {
  return static_cast<float>(_mm256_extract_epi32(vnni256_chains(iters, _mm256_set1_epi8(3), _mm256_set1_epi8(-2)), 0));
}
// AVX2 int8 without dot products: the vpmaddubsw → vpmaddwd (with ones) → vpaddd sequence, 32
// MACs of 8 bits per three instructions. Inline asm: written with intrinsics (and the barrier
// above), GCC 12 kept 10 of the 12 accumulators on the stack, and the loop read 2/3 of this
// sequence's real rate on a Zen 3 (133 against 197 GOP/s per core), overstating every int8
// kernel's % of peak by 1.5×.
__attribute__((target("avx2"))) __m256i madd256_chains(int64_t iters, __m256i m, __m256i c) {
  const __m256i ones = _mm256_set1_epi16(1);
#define KLEIN_PEAK_INIT(j) __m256i a##j = _mm256_set1_epi32(j);
#define KLEIN_PEAK_STEP(j)                                                                   \
  {                                                                                          \
    __m256i t;                                                                               \
    asm volatile("vpmaddubsw %[c], %[m], %[t]\n\tvpmaddwd %[o], %[t], %[t]\n\tvpaddd %[t], %[a], %[a]" \
                 : [a] "+x"(a##j), [t] "=&x"(t)                                              \
                 : [m] "x"(m), [c] "x"(c), [o] "x"(ones));                                   \
  }
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm256_add_epi32(s, a##j);
  KLEIN_PEAK_LOOP(__m256i, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx2"))) float madd256_loop(int64_t iters) {
  return static_cast<float>(_mm256_extract_epi32(madd256_chains(iters, _mm256_set1_epi8(3), _mm256_set1_epi8(-2)), 0));
}
// Instruction mixes of two GEMM micro-kernels, in registers: the ceiling a kernel's loop can
// reach on this core before any memory traffic, as a % of the peak it is reported against.
// W4A8 VNNI (gemm_w4a8_avx512vnni.cpp): per group and column 32 vpdpbusd, then 2 vcvtdq2ps and
// 4 FMAs fold the int32 sums into float32 — here 16 : 1 : 2 per iteration. On Zen 4 the FMAs take
// the vpdpbusd's issue slots and the conversions do not (microbenchmarks, 2026-12-05), so the
// mix tops out at 16 / 18 = 89 % there.
__attribute__((target("avx512f,avx512vnni"))) float mix_w4a8_vnni512_loop(int64_t iters) {
  __m512i m = _mm512_set1_epi8(3), c = _mm512_set1_epi8(-2);
  __m512i a0 = _mm512_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m512 f0 = _mm512_set1_ps(0.5f), f1 = f0, s = _mm512_set1_ps(1e-9f), t;
  for (int64_t i = 0; i < iters; ++i)
    asm volatile(
        "vpdpbusd %[c], %[m], %[a0]\n\tvpdpbusd %[c], %[m], %[a1]\n\tvpdpbusd %[c], %[m], %[a2]\n\t"
        "vpdpbusd %[c], %[m], %[a3]\n\tvpdpbusd %[c], %[m], %[a4]\n\tvpdpbusd %[c], %[m], %[a5]\n\t"
        "vpdpbusd %[c], %[m], %[a6]\n\tvpdpbusd %[c], %[m], %[a7]\n\t"
        "vcvtdq2ps %[a0], %[t]\n\tvfmadd231ps %[s], %[t], %[f0]\n\tvfmadd231ps %[s], %[t], %[f1]\n\t"
        "vpdpbusd %[c], %[m], %[a0]\n\tvpdpbusd %[c], %[m], %[a1]\n\tvpdpbusd %[c], %[m], %[a2]\n\t"
        "vpdpbusd %[c], %[m], %[a3]\n\tvpdpbusd %[c], %[m], %[a4]\n\tvpdpbusd %[c], %[m], %[a5]\n\t"
        "vpdpbusd %[c], %[m], %[a6]\n\tvpdpbusd %[c], %[m], %[a7]"
        : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4), [a5] "+v"(a5),
          [a6] "+v"(a6), [a7] "+v"(a7), [f0] "+v"(f0), [f1] "+v"(f1), [t] "=&v"(t)
        : [m] "v"(m), [c] "v"(c), [s] "v"(s));
  return _mm512_reduce_add_ps(_mm512_add_ps(f0, f1)) +
         static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(a0, a7)));
}
// W4A8 AVX-VNNI (gemm_w4a8_avxvnni.cpp): the same 16 : 1 : 2 mix on ymm (VEX vpdpbusd). On the
// AMX Xeon (family 6 model 167) it tops out at 70-71 % of the vpdpbusd ymm peak, which the kernel
// reaches within a few points (2026-12-05).
__attribute__((target("avx2,fma,avxvnni"))) float mix_w4a8_vnni256_loop(int64_t iters) {
  __m256i m = _mm256_set1_epi8(3), c = _mm256_set1_epi8(-2);
  __m256i a0 = _mm256_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m256 f0 = _mm256_set1_ps(0.5f), f1 = f0, s = _mm256_set1_ps(1e-9f), t;
  for (int64_t i = 0; i < iters; ++i)
    asm volatile(
        "%{vex%} vpdpbusd %[c], %[m], %[a0]\n\t%{vex%} vpdpbusd %[c], %[m], %[a1]\n\t%{vex%} vpdpbusd %[c], %[m], %[a2]\n\t"
        "%{vex%} vpdpbusd %[c], %[m], %[a3]\n\t%{vex%} vpdpbusd %[c], %[m], %[a4]\n\t%{vex%} vpdpbusd %[c], %[m], %[a5]\n\t"
        "%{vex%} vpdpbusd %[c], %[m], %[a6]\n\t%{vex%} vpdpbusd %[c], %[m], %[a7]\n\t"
        "vcvtdq2ps %[a0], %[t]\n\tvfmadd231ps %[s], %[t], %[f0]\n\tvfmadd231ps %[s], %[t], %[f1]\n\t"
        "%{vex%} vpdpbusd %[c], %[m], %[a0]\n\t%{vex%} vpdpbusd %[c], %[m], %[a1]\n\t%{vex%} vpdpbusd %[c], %[m], %[a2]\n\t"
        "%{vex%} vpdpbusd %[c], %[m], %[a3]\n\t%{vex%} vpdpbusd %[c], %[m], %[a4]\n\t%{vex%} vpdpbusd %[c], %[m], %[a5]\n\t"
        "%{vex%} vpdpbusd %[c], %[m], %[a6]\n\t%{vex%} vpdpbusd %[c], %[m], %[a7]"
        : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
          [a6] "+x"(a6), [a7] "+x"(a7), [f0] "+x"(f0), [f1] "+x"(f1), [t] "=&x"(t)
        : [m] "x"(m), [c] "x"(c), [s] "x"(s));
  const __m256 f = _mm256_add_ps(f0, f1);
  return _mm256_cvtss_f32(f) + static_cast<float>(_mm256_extract_epi32(_mm256_add_epi32(a0, a7), 0));
}
// W8A8 AVX2 (gemm_int8_avx2.cpp): a vpmaddwd and a vpaddd per 16 multiply-adds, 12 chains.
__attribute__((target("avx2"))) __m256i mix_madd_wd_chains(int64_t iters, __m256i m, __m256i c) {
#define KLEIN_PEAK_INIT(j) __m256i a##j = _mm256_set1_epi32(j);
#define KLEIN_PEAK_STEP(j)                                                                     \
  {                                                                                            \
    __m256i t;                                                                                 \
    asm volatile("vpmaddwd %[c], %[m], %[t]\n\tvpaddd %[t], %[a], %[a]"                          \
                 : [a] "+x"(a##j), [t] "=&x"(t)                                                \
                 : [m] "x"(m), [c] "x"(c));                                                    \
  }
#define KLEIN_PEAK_RED(j) if (j > 0) s = _mm256_add_epi32(s, a##j);
  KLEIN_PEAK_LOOP(__m256i, 0, 0, 0);
#undef KLEIN_PEAK_INIT
#undef KLEIN_PEAK_STEP
#undef KLEIN_PEAK_RED
}
__attribute__((target("avx2"))) float mix_w8a8_avx2_loop(int64_t iters) {
  return static_cast<float>(_mm256_extract_epi32(mix_madd_wd_chains(iters, _mm256_set1_epi16(3), _mm256_set1_epi16(-2)), 0));
}
// AMX: four independent accumulator tiles (tmm0..3) from two A and two B tiles, the 2 × 2 pattern
// of gemm_amx.cpp, all 8 tiles 16 rows × 64 bytes. Per iteration 4 tile products of 16 × 16 × 64
// int8 (or 16 × 16 × 32 bf16) multiply-adds. Needs CpuFeatures::host() first (the OS permission).
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
// kLoads = false: the operand tiles loaded once, then tile products only (the peak). kLoads =
// true: the AMX GEMMs' 2 × 2 tile step (gemm_amx.cpp) with its four operand loads, from 16 KB
// that stay in L1: the ceiling of that loop before any L2 / L3 traffic (a `mix` row). Tiles are
// not renamed, so a step's loads wait for the products of the step before that read the same
// tile registers.
template <bool kInt8, bool kLoads>
__attribute__((target("amx-tile,amx-int8,amx-bf16"))) float amx_tile_loop(int64_t iters) {
  static const AmxConfig cfg;
  alignas(64) static thread_local uint8_t ops[16 * 1024];  // zeros: the sums stay 0
  alignas(64) float out[256];
  std::memset(ops, 0, sizeof ops);  // written: real pages, not the shared zero page
  _tile_loadconfig(&cfg);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  if constexpr (!kLoads) {
    _tile_loadd(4, ops, 64); _tile_loadd(5, ops + 1024, 64); _tile_loadd(6, ops + 2048, 64); _tile_loadd(7, ops + 3072, 64);
  }
  for (int64_t i = 0; i < iters; ++i) {
    if constexpr (kLoads) {
      const uint8_t* o = ops + (i & 3) * 4096;
      _tile_loadd(4, o, 64); _tile_loadd(5, o + 1024, 64); _tile_loadd(6, o + 2048, 64); _tile_loadd(7, o + 3072, 64);
    }
    if constexpr (kInt8) {
      _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
// One group of the AMX W4A8 GEMM (gemm_w4a8_amx.cpp), all in L1: the 2 × 2 step above with
// tdpbusd, the four int32 tiles stored, and the fold of their 32 × 32 sums into float32 (per 16
// sums a vcvtdq2ps and two FMAs, the float sums loaded and stored). Where tile products and
// vector work do not overlap (measured on the AMX Xeon), this is the kernel's ceiling.
__attribute__((target("amx-tile,amx-int8,avx512f"))) float mix_w4a8_amx_loop(int64_t iters) {
  static const AmxConfig cfg;
  alignas(64) static thread_local uint8_t ops[4096];
  alignas(64) static thread_local int32_t c[1024];
  alignas(64) static thread_local float f[1024];
  std::memset(ops, 1, sizeof ops);
  std::memset(f, 0, sizeof f);
  _tile_loadconfig(&cfg);
  const __m512 sv = _mm512_set1_ps(1e-9f), ov = _mm512_set1_ps(1e-9f), xv = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, ops, 64); _tile_loadd(5, ops + 1024, 64); _tile_loadd(6, ops + 2048, 64); _tile_loadd(7, ops + 3072, 64);
    _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
    _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128); _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    for (int v = 0; v < 1024; v += 16) {
      const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + v)), sv, _mm512_load_ps(f + v));
      _mm512_store_ps(f + v, _mm512_fmadd_ps(xv, ov, t));
    }
  }
  _tile_release();
  return f[0] + f[1023];
}
#undef KLEIN_PEAK_LOOP
#undef KLEIN_CH
#undef KLEIN_BARRIER
#endif

// A measurement: `flop` (or int8 ops) done in time t by `threads` threads.
struct Row {
  std::string what;
  int threads;
  double flop;
  Time t;
  int peak = 0;  // index of the peak it is compared with
};

// A machine peak, measured with 1 thread and with all threads at once.
struct Peak {
  std::string name;
  Row p1, pn;
  // Per-core peak per CPU-second: a property of the core, so the best of both runs (a
  // neighbour's cache or frequency disturbance can only make a measurement lower).
  double per_cpu_s() const {
    return p1.flop == 0 ? 0 : std::max(p1.flop / p1.t.cpu, pn.flop / pn.t.cpu);
  }
};

Peak measure_peak(const std::string& name, bool available, float (*loop)(int64_t), double ops_per_iter,
                  ThreadPool& pool1, ThreadPool& pool, int reps) {
  Peak p{name, {name, 1, 0, {}}, {name, pool.size(), 0, {}}};
  if (!available) return p;
  const int64_t iters = 10'000'000;
  std::vector<float> sink(pool.size());
  for (Row* r : {&p.p1, &p.pn}) {
    ThreadPool& tp = r == &p.p1 ? pool1 : pool;
    r->t = time_best(reps, [&] { tp.run([&](int i, int) { sink[i] = loop(iters); }); });
    r->flop = ops_per_iter * iters * tp.size();
  }
  return p;
}

// Wall columns: throughput and % of the same-thread-count peak, both by wall time. CPU columns:
// flop per CPU-second of all threads vs the per-core peak per CPU-second, i.e. the per-core
// efficiency, which stays meaningful when other processes share the cores.
void print(const std::vector<Row>& rows, const std::vector<Peak>& peaks) {
  std::printf("%-58s %3s %9s %9s %7s %11s %7s  %s\n", "kernel", "thr", "wall ms", "GOP/s", "%peak", "GOP/cpu-s",
              "%peak", "peak");
  for (const Row& r : rows) {
    const Peak& pk = peaks[r.peak];
    if (r.flop == 0 || pk.p1.flop == 0) continue;  // peak not measurable here
    const Row& pr = r.threads == 1 ? pk.p1 : pk.pn;
    const double g = r.flop / r.t.wall / 1e9, gc = r.flop / r.t.cpu / 1e9;
    const double pw = pr.flop / pr.t.wall / 1e9;
    std::printf("%-58s %3d %9.2f %9.1f %6.1f%% %11.1f %6.1f%%  %s\n", r.what.c_str(), r.threads, r.t.wall * 1e3, g,
                pw > 0 ? 100 * g / pw : 0.0, gc, 100 * gc / (pk.per_cpu_s() / 1e9), pk.name.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark this machine's peaks (fp32 FMA, bf16 dot, int8 dot) and the GEMM / attention kernels"};
  int threads = 2, reps = 3;
  bool quick = false, cold = false;
  app.add_option("--threads", threads, "threads for the kernels (peaks are also shown for 1)");
  app.add_option("--reps", reps, "timed repetitions (best is reported)");
  app.add_flag("--quick", quick, "fewer shapes (M = 256 only) and repetitions, for a smoke test");
  app.add_flag("--cold", cold,
               "GEMMs: evict the weights (and their scales) from the caches before each timed call, as in a "
               "forward pass, where each weight is read once; x and y stay warm");
  std::vector<int64_t> ms;
  app.add_option("--m", ms, "token counts M of the GEMM shapes (default 256 1024 1536; --quick: 256)");
  std::vector<int64_t> kn;
  app.add_option("--kn", kn, "GEMM shapes as K N pairs instead of the DiT's (e.g. --kn 12288 3072 12352 3072)")
      ->check(CLI::PositiveNumber);
  std::string isa_arg;
  std::vector<int64_t> attn_s;
  app.add_option("--attn-s", attn_s, "sequence lengths of the attention rows (default 1024; --quick: 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("--isa", isa_arg, "highest ISA for the kernels: scalar, avx2, avx512, ... (default: best)");
  std::string only;
  app.add_option("--only", only, "time only the kernels whose name contains this (e.g. int8_avx512; swiglu: the MLP input with its SwiGLU, fused and not; mix: the instruction-mix loops; the peaks always)");
  CLI11_PARSE(app, argc, argv);
  if (kn.size() % 2) {
    std::fprintf(stderr, "error: --kn takes K N pairs, got %zu numbers\n", kn.size());
    return 2;
  }

  Isa max_isa = Isa::kCount;
  if (!isa_arg.empty() && !isa_from_name(isa_arg, &max_isa)) {
    std::fprintf(stderr, "error: unknown ISA '%s'\n", isa_arg.c_str());
    return 2;
  }
  if (quick) reps = std::min(reps, 2);
  auto wanted = [&](std::string_view kernel) { return only.empty() || kernel.find(only) != std::string_view::npos; };
  const CpuFeatures& cpu = CpuFeatures::host();
  std::printf("cpu features: %s\n", cpu.flags().c_str());
  ThreadPool pool1(1), pool(threads);

  // The peaks are the CPU's capability, not the selected kernels': yardsticks whatever --isa is.
  // Measured before the kernels and again after them, each the better of the two: on a shared
  // machine a neighbour's burst during one measurement only lowers it, and a low peak showed
  // kernels at 120-146 % "of the peak" (Zen 4 VM, 2026-12-04).
  enum { kFma256, kFma512, kBf16, kVnni512, kVnni256, kMadd256, kAmxInt8, kAmxBf16, kNoPeak };
  std::vector<Peak> peaks(kNoPeak);
  const auto measure_peaks = [&] {
#if defined(KLEIN_X86)
    const int pr = std::max(reps, 3);
    const auto take = [&](int i, Peak p) {
      Peak& q = peaks[i];
      if (q.p1.flop == 0) q = p;
      for (const auto& [r, n] : {std::pair{&q.p1, &p.p1}, std::pair{&q.pn, &p.pn}}) {
        r->t.wall = std::min(r->t.wall, n->t.wall);
        r->t.cpu = std::min(r->t.cpu, n->t.cpu);
      }
    };
    take(kFma256, measure_peak("fp32 FMA ymm", cpu.has(Isa::kAvx2), fma256_loop, 12 * 8 * 2, pool1, pool, pr));
    take(kFma512, measure_peak("fp32 FMA zmm", cpu.has(Isa::kAvx512), fma512_loop, 12 * 16 * 2, pool1, pool, pr));
    take(kBf16, measure_peak("bf16 vdpbf16ps zmm", cpu.has(Isa::kAvx512Bf16), bf16_loop, 12 * 16 * 4, pool1, pool, pr));
    take(kVnni512,
         measure_peak("int8 vpdpbusd zmm", cpu.has(Isa::kAvx512Vnni), vnni512_loop, 12 * 16 * 8, pool1, pool, pr));
    take(kVnni256,
         measure_peak("int8 vpdpbusd ymm", cpu.has(Isa::kAvxVnni), vnni256_loop, 12 * 8 * 8, pool1, pool, pr));
    take(kMadd256,
         measure_peak("int8 vpmaddubsw+vpmaddwd ymm", cpu.has(Isa::kAvx2), madd256_loop, 12 * 8 * 8, pool1, pool, pr));
    take(kAmxInt8,
         measure_peak("int8 AMX tdpbssd", cpu.has(Isa::kAmx), amx_tile_loop<true, false>, 4 * 16 * 16 * 64 * 2, pool1, pool, pr));
    take(kAmxBf16,
         measure_peak("bf16 AMX tdpbf16ps", cpu.has(Isa::kAmx), amx_tile_loop<false, false>, 4 * 16 * 16 * 32 * 2, pool1, pool, pr));
#endif
  };
  measure_peaks();
  std::vector<Row> rows;

  // The micro-kernels' instruction mixes in registers (above): each kernel's ceiling on this core.
#if defined(KLEIN_X86)
  struct Mix {
    const char* name;
    bool available;
    float (*loop)(int64_t);
    double ops_per_iter;
    int peak;
  };
  for (const Mix& x : {Mix{"mix gemm_w4a8_avx512vnni (16 vpdpbusd : 1 cvt : 2 FMA)", cpu.has(Isa::kAvx512Vnni),
                           mix_w4a8_vnni512_loop, 16.0 * 16 * 8, kVnni512},
                       Mix{"mix gemm_w4a8_avxvnni (16 vpdpbusd : 1 cvt : 2 FMA)", cpu.has(Isa::kAvxVnni),
                           mix_w4a8_vnni256_loop, 16.0 * 8 * 8, kVnni256},
                       Mix{"mix gemm_int8_avx2 (vpmaddwd + vpaddd)", cpu.has(Isa::kAvx2), mix_w8a8_avx2_loop,
                           12.0 * 8 * 4, kMadd256},
                       Mix{"mix gemm_int8_amx (2x2 tile step, loads from L1)", cpu.has(Isa::kAmx),
                           amx_tile_loop<true, true>, 4.0 * 16 * 16 * 64 * 2, kAmxInt8},
                       Mix{"mix gemm_bf16_amx (2x2 tile step, loads from L1)", cpu.has(Isa::kAmx),
                           amx_tile_loop<false, true>, 4.0 * 16 * 16 * 32 * 2, kAmxBf16},
                       Mix{"mix gemm_w4a8_amx (tile step + store + fold, L1)", cpu.has(Isa::kAmx),
                           mix_w4a8_amx_loop, 4.0 * 16 * 16 * 64 * 2, kAmxInt8}}) {
    if (!x.available || !wanted(x.name)) continue;
    const Peak p = measure_peak(x.name, true, x.loop, x.ops_per_iter, pool1, pool, std::max(reps, 3));
    for (const Row* r : {&p.p1, &p.pn})
      if (!(r == &p.pn && threads == 1)) rows.push_back({r->what, r->threads, r->flop, r->t, x.peak});
  }
#endif

  // Kernel variants: (ceiling, precision, weight format) → the kernel the registry picks, timed
  // against the peak of its instruction. A variant whose kernel is not the expected one on this
  // CPU (or under --isa) is skipped.
  struct Variant {
    Isa ceiling;
    kernels::Precision precision;
    DType format;
    std::string_view kernel;
    int peak;
  };
  const Variant variants[] = {
      {Isa::kAvx2, kernels::Precision::kFp32, DType::kBF16, "gemm_avx2", kFma256},
      {Isa::kAvx512, kernels::Precision::kFp32, DType::kBF16, "gemm_avx512", kFma512},
      {Isa::kAvx512Bf16, kernels::Precision::kFast, DType::kBF16, "gemm_bf16_avx512bf16", kBf16},
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ8Row, "gemm_int8_avx2", kMadd256},
      {Isa::kAvxVnni, kernels::Precision::kFast, DType::kQ8Row, "gemm_int8_avxvnni", kVnni256},
      {Isa::kAvx512Vnni, kernels::Precision::kFast, DType::kQ8Row, "gemm_int8_avx512vnni", kVnni512},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ8Row, "gemm_int8_amx", kAmxInt8},
      {Isa::kAmx, kernels::Precision::kFast, DType::kBF16, "gemm_bf16_amx", kAmxBf16},
      // Q4_G64 (MLX int4): the slab is unpacked once per block (q4_unpack.h), then the same
      // micro-kernels as BF16; compare with the BF16 rows above for the unpack's cost.
      {Isa::kAvx2, kernels::Precision::kFp32, DType::kQ4G64, "gemm_avx2", kFma256},
      {Isa::kAvx512, kernels::Precision::kFp32, DType::kQ4G64, "gemm_avx512", kFma512},
      {Isa::kAvx512Bf16, kernels::Precision::kFast, DType::kQ4G64, "gemm_w4a8_avx512vnni", kVnni512},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ4G64, "gemm_w4a8_amx", kAmxInt8},
      {Isa::kAvxVnni, kernels::Precision::kFast, DType::kQ4G64, "gemm_w4a8_avxvnni", kVnni256},
      // W4A8 without VNNI: against the vpmaddubsw + vpmaddwd peak, which it can pass, since its
      // int16 chains need one vpmaddwd per 8 vpmaddubsw (gemm_w4a8_avx2.cpp).
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ4G64, "gemm_w4a8_avx2", kMadd256},
      // GGUF block weights (ggml's Q8_0 ... Q6_K): int8 activations per block, as llama.cpp
      // (gemm_ggml_*.cpp); compare with the Q8_ROW (W8A8) and Q4_G64 (W4A8) rows of the same ISA.
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ8_0, "gemm_ggml_avx2", kMadd256},
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ4_0, "gemm_ggml_avx2", kMadd256},
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ4_K, "gemm_ggml_avx2", kMadd256},
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ5_K, "gemm_ggml_avx2", kMadd256},
      {Isa::kAvx2, kernels::Precision::kFast, DType::kQ6_K, "gemm_ggml_avx2", kMadd256},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ8_0, "gemm_ggml_avx512vnni", kVnni512},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ4_0, "gemm_ggml_avx512vnni", kVnni512},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ4_K, "gemm_ggml_avx512vnni", kVnni512},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ5_K, "gemm_ggml_avx512vnni", kVnni512},
      {Isa::kAmx, kernels::Precision::kFast, DType::kQ6_K, "gemm_ggml_avx512vnni", kVnni512},
  };
  for (const Variant& v : variants) {
    const kernels::KernelSet set = kernels::KernelSet::select(cpu, std::min(v.ceiling, max_isa), v.precision);
    std::printf("%-26s linear %-6s: %s (%s)\n", v.kernel.data(), std::string(dtype_name(v.format)).c_str(),
                std::string(isa_name(set.get(kernels::Op::kLinear, v.format).isa)).c_str(),
                std::string(set.get(kernels::Op::kLinear, v.format).name).c_str());
  }

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  struct Shape3 {
    int64_t M, K, N;
  };
  // The DiT's GEMMs: K = 3072 into N = 3072 (attention out / projections), 9216 (fused QKV),
  // 18432 (MLP in), K = 9216 into N = 3072 (double-block MLP out) and K = 12288 into N = 3072
  // (single-block fused out: attention | MLP); M = tokens.
  std::vector<Shape3> shapes;
  if (ms.empty()) ms = quick ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 1024, 1536};
  std::vector<std::pair<int64_t, int64_t>> kns = {{3072, 3072}, {3072, 9216}, {3072, 18432}, {9216, 3072}, {12288, 3072}};
  if (!kn.empty()) {
    kns.clear();
    for (size_t i = 0; i < kn.size(); i += 2) kns.push_back({kn[i], kn[i + 1]});
  }
  for (int64_t M : ms)
    for (auto [K, N] : kns)
      if (!kn.empty() || !quick || (N != 18432 && K != 12288)) shapes.push_back({M, K, N});
  for (const Shape3& s : shapes) {
    std::vector<uint16_t> wb(s.N * s.K);
    std::vector<int8_t> wq(s.N * s.K);
    std::vector<float> ws(s.N);
    std::vector<uint16_t> gs(s.N * s.K / 64), gb(s.N * s.K / 64);  // Q4_G64 scales / biases (bf16)
    for (auto& e : gs) e = f32_to_bf16(0.01f * (1 + dist(rng)));
    for (auto& e : gb) e = f32_to_bf16(0.1f * dist(rng));
    for (auto& e : wb) e = f32_to_bf16(dist(rng));
    for (auto& e : wq) e = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    for (auto& e : ws) e = 0.01f * (1 + dist(rng));
    std::vector<float> x(s.M * s.K), y(s.M * s.N);
    for (auto& e : x) e = dist(rng);
    // Operands in the library's own host buffers (huge pages where large, as the pipeline's).
    const auto hwb = host_copy(wb);
    const auto hwq = host_copy(wq);
    const auto hx = host_copy(x), hy = host_copy(y);
    Weight W;
    W.name = "bench";
    W.shape = {s.N, s.K};
    const double flop = 2.0 * s.M * s.N * s.K;
    for (const Variant& v : variants) {
      const kernels::KernelSet set = kernels::KernelSet::select(cpu, std::min(v.ceiling, max_isa), v.precision);
      if (set.get(kernels::Op::kLinear, v.format).name != v.kernel) continue;
      // The MLP input with its SwiGLU (N = 18432 = [gate; up]): the linear then silu_mul over
      // [M, 2F], against run_linear_swiglu, for the kernels that fuse it.
      const bool swiglu_rows = s.N == 18432 && set.get(kernels::Op::kLinear, v.format).linear_swiglu &&
                               wanted(std::string(v.kernel) + " swiglu");
      if (!wanted(v.kernel) && !swiglu_rows) continue;
      W.dtype = v.format;
      W.data = v.format == DType::kQ8Row ? static_cast<const void*>(hwq.get()) : hwb.get();  // Q4: any bytes
      // ggml blocks: random bytes with finite fp16 scales (2 bytes per element cover every format).
      const bool ggml = format_traits(v.format).scales == ScalePlace::kInBlock;
      const size_t gbytes = ggml ? static_cast<size_t>(s.N * format_row_bytes(v.format, s.K)) : 0;
      if (ggml) {
        auto* p = reinterpret_cast<uint8_t*>(hwb.get());
        int offs[2];
        const int nh = ggml_rows::half_fields(v.format, offs);
        const int64_t bb = format_traits(v.format).block_bytes;
        for (size_t b = 0; b + bb <= gbytes; b += bb)
          for (int i = 0; i < nh; ++i) {
            const uint16_t h = f32_to_f16(0.001f + 0.01f * static_cast<float>(b % 7) / 7.0f);
            std::memcpy(p + b + offs[i], &h, 2);
          }
      }
      W.scales = v.format == DType::kQ8Row ? static_cast<const void*>(ws.data())
                 : v.format == DType::kQ4G64 ? static_cast<const void*>(gs.data()) : nullptr;
      W.offsets = v.format == DType::kQ4G64 ? gb.data() : nullptr;
      W.scale_dtype = v.format == DType::kQ4G64 ? DType::kBF16 : DType::kF32;
      const std::string name = std::string(v.kernel) + " " + std::string(dtype_name(v.format)) + " M=" +
                               std::to_string(s.M) + " K=" + std::to_string(s.K) + " N=" + std::to_string(s.N);
      // Bytes of W as the kernel reads them (Q4_G64: K/2 per row and two bf16 per group).
      const size_t wbytes = ggml ? gbytes
                            : v.format == DType::kQ8Row ? s.N * s.K
                            : v.format == DType::kQ4G64 ? s.N * s.K / 2 : 2 * s.N * s.K;
      const auto evict_w = [&] {
        evict(W.data, wbytes);
        if (v.format == DType::kQ8Row) evict(ws.data(), ws.size() * sizeof(float));
        if (v.format == DType::kQ4G64) evict(gs.data(), gs.size() * 2), evict(gb.data(), gb.size() * 2);
      };
      const Time t = time_best(
          reps, [&] { kernels::run_linear(set, hx.get(), s.M, s.K, W, nullptr, hy.get(), pool); },
          cold ? std::function<void()>(evict_w) : std::function<void()>());
      if (wanted(v.kernel)) rows.push_back({name, pool.size(), flop, t, v.peak});
      if (!swiglu_rows) continue;
      const int64_t F = s.N / 2;
      const auto hout = host_copy(std::vector<float>(s.M * F));
      const auto silu_mul = set.eltwise().silu_mul;
      const Time tu = time_best(
          reps,
          [&] {
            kernels::run_linear(set, hx.get(), s.M, s.K, W, nullptr, hy.get(), pool);
            pool.parallel_for(s.M, [&](int64_t r0, int64_t r1) {
              for (int64_t r = r0; r < r1; ++r) silu_mul(hy.get() + r * s.N, hy.get() + r * s.N + F, hout.get() + r * F, F);
            });
          },
          cold ? std::function<void()>(evict_w) : std::function<void()>());
      rows.push_back({name + " +silu_mul", pool.size(), flop, tu, v.peak});
      const Time tf = time_best(
          reps,
          [&] {
            kernels::run_linear_swiglu(set, hx.get(), s.M, s.K, W, nullptr, hout.get(), hy.get(), pool);
          },
          cold ? std::function<void()>(evict_w) : std::function<void()>());
      rows.push_back({name + " swiglu fused", pool.size(), flop, tf, v.peak});
    }
  }
  // The VAE decoder's 3×3 convs (GroupNorm + SiLU prologue, as in every ResNet block) at a 256²
  // image: 512 ch at 32² and 64², 256 at 128², 128 at 256². Weights BF16, as the VAE is stored.
  const Variant conv_variants[] = {
      {Isa::kAvx2, kernels::Precision::kFp32, DType::kBF16, "conv2d_avx2", kFma256},
      {Isa::kAvx512, kernels::Precision::kFp32, DType::kBF16, "conv2d_avx512", kFma512},
      // The float32 Winograd form (16 of 36 products; flops counted as the direct form's).
      {Isa::kAvx2, kernels::Precision::kFast, DType::kBF16, "conv2d_winograd_avx2", kFma256},
      {Isa::kAvx512, kernels::Precision::kFast, DType::kBF16, "conv2d_winograd_avx512", kFma512},
      {Isa::kAvx512Bf16, kernels::Precision::kFast, DType::kBF16, "conv2d_bf16_avx512bf16", kBf16},
      {Isa::kAmx, kernels::Precision::kFast, DType::kBF16, "conv2d_bf16_amx", kAmxBf16},
  };
  struct ConvShape {
    int64_t C, H;
    bool up = false;  // Upsample2D's conv: the input ×2 first (H is the input's size)
  };
  // (+ the encoder's full-resolution ones at a 512² reference: 128 ch at 512², 256 at 256²; and
  // the decoder's upsampling convs at a 256² image, 512 ch 64² → 128², 256 ch 128² → 256². Their
  // flops are counted as the upsampled 3×3 conv's, so the AVX512_BF16 conv's sub-pixel form —
  // 4 of the 9 products — can show more than its peak, as can every Winograd form.)
  std::vector<ConvShape> conv_shapes = {{512, 32},  {512, 64},  {256, 128},      {128, 256},
                                        {256, 256}, {128, 512}, {512, 64, true}, {256, 128, true}};
  if (quick) conv_shapes = {{512, 32}, {128, 128}, {256, 32, true}};
  for (const ConvShape& cs : conv_shapes) {
    const int64_t OH = cs.up ? 2 * cs.H : cs.H;
    std::vector<uint16_t> wb(cs.C * cs.C * 9);
    for (auto& e : wb) e = f32_to_bf16(0.05f * dist(rng));
    std::vector<float> x(cs.C * cs.H * cs.H), y(cs.C * OH * OH), sc(cs.C), sh(cs.C);
    for (auto& e : x) e = dist(rng);
    for (int64_t c = 0; c < cs.C; ++c) sc[c] = 1 + 0.1f * dist(rng), sh[c] = 0.1f * dist(rng);
    Weight W;
    W.name = "bench.conv";
    W.dtype = DType::kBF16;
    W.shape = {cs.C, cs.C, 3, 3};
    W.data = wb.data();
    kernels::Conv2dParams p = kernels::Conv2dParams::same(3);
    p.in_scale = sc.data(), p.in_shift = sh.data(), p.in_silu = true;
    p.upsample2x = cs.up;
    const double flop = 2.0 * cs.C * cs.C * 9 * OH * OH;
    for (const Variant& v : conv_variants) {
      const kernels::KernelSet set = kernels::KernelSet::select(cpu, std::min(v.ceiling, max_isa), v.precision);
      if (set.get(kernels::Op::kConv2d, v.format).name != v.kernel || !wanted(v.kernel)) continue;
      const Time t = time_best(reps, [&] {
        kernels::run_conv2d(set, x.data(), 1, cs.C, cs.H, cs.H, W, nullptr, y.data(), p, pool);
      });
      rows.push_back({std::string(v.kernel) + " 3x3 C=" + std::to_string(cs.C) + " @" + std::to_string(cs.H) + "x" +
                          std::to_string(cs.H) + (cs.up ? " up2x (9-tap flops)" : "") + " +gn-silu",
                      pool.size(), flop, t, v.peak});
    }
  }
  // Attention at the DiT's head shape: the exact kernel, and the fast one where it differs.
  // (the DiT's S: 768 at 256², 1536 at 512², 1792 for a 512² edit with a 256² reference).
  if (attn_s.empty()) attn_s = {quick ? 256 : 1024};
  const int H = quick ? 4 : 24, D = 128;
  for (const int64_t S : attn_s) {
    std::vector<float> q(S * H * D), k(S * H * D), v(S * H * D), o(S * H * D);
    for (auto* buf : {&q, &k, &v})
      for (auto& e : *buf) e = dist(rng);
    const auto hq = host_copy(q), hk = host_copy(k), hv = host_copy(v), ho = host_copy(o);
    // An explicit ceiling (the highest ISA when --isa is not given), so that the bf16 kernel is
    // timed also where the automatic choice skips it (CpuFeatures::bf16_dot_slow).
    // The exact kernel, the AVX512_BF16 one (named: the automatic choice skips it on Intel) and the
    // AMX one, each where the CPU (and --isa) has it.
    std::vector<std::string_view> timed;
    for (Isa ceiling : {Isa::kAvx512Bf16, Isa::kAmx})
      for (kernels::Precision prec : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
        const kernels::KernelSet set = kernels::KernelSet::select(cpu, std::min(ceiling, max_isa), prec);
        const kernels::KernelEntry& e = set.get(kernels::Op::kAttention, DType::kF32);
        if ((prec == kernels::Precision::kFast && !e.fast) || !wanted(e.name) ||
            std::find(timed.begin(), timed.end(), e.name) != timed.end())
          continue;
        timed.push_back(e.name);
        const int attn_peak = e.isa == Isa::kAmx ? kAmxBf16
                              : e.fast          ? kBf16
                              : cpu.has(Isa::kAvx512) && max_isa >= Isa::kAvx512 ? kFma512
                                                                                : kFma256;
        for (bool causal : {false, true}) {
          const double flop = 4.0 * S * S * D * H * (causal ? 0.5 : 1.0);
          const Time t = time_best(reps, [&] {
            kernels::run_attention(set, hq.get(), hk.get(), hv.get(), ho.get(), S, S, H, H, D,
                                   1.0f / std::sqrt(float(D)), {.causal = causal}, pool);
          });
          rows.push_back({std::string(e.name) + " S=" + std::to_string(S) + " H=" + std::to_string(H) + " D=128" +
                              (causal ? " causal" : ""),
                          threads, flop, t, attn_peak});
        }
      }
  }
  measure_peaks();  // again, after the kernels (above)
  std::vector<Row> peak_rows;
  for (int i = 0; i < kNoPeak; ++i)
    for (const Row* r : {&peaks[i].p1, &peaks[i].pn})
      if (r->flop > 0 && !(r == &peaks[i].pn && threads == 1)) {
        peak_rows.push_back(*r);
        peak_rows.back().what = "peak " + r->what;
        peak_rows.back().peak = i;
      }
  rows.insert(rows.begin(), peak_rows.begin(), peak_rows.end());
  print(rows, peaks);
  return 0;
}
