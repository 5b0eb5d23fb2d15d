// Building blocks shared by the AVX2 kernels (gemm, attention, conv2d): the register-blocked FMA
// micro-kernel, 8-lane exp2, dtype-converting loads, an 8×8 transpose, per-thread scratch. Include ONLY from *_avx2.cpp files: the
// code needs -mavx2 -mfma -mf16c and must never run on a CPU without them: only the kernel registry
// (kernels/registry.h) reaches it, through entries selected for CPUs that have Isa::kAvx2.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "core/host_memory.h"
#include "kernels/scratch.h"

namespace klein::kernels::avx2 {

// Micro-kernel tile: MR rows of A by NR = 16 columns (two ymm) of B. 6×16 keeps 12 accumulators
// + 2 B vectors + 1 broadcast in the 16 ymm registers and gives 12 independent FMA chains,
// enough to cover the FMA latency (4 cycles) × 2 pipes of Zen/Skylake-class cores.
constexpr int kMR = 6;
constexpr int kNR = 16;

// C[R×16] = init + A[R×kc]·B[kc×16]   (accumulate = false; init = 16 floats or null for zero)
// C[R×16] += A[R×kc]·B[kc×16]         (accumulate = true)
// A(r, k) at a[r*lda + k] (row-major), or with kColA at a[k*lda + r] (column-major, e.g. the
// transposed probabilities in attention). B row k at b[k*ldb .. +16) (packed: ldb = 16).
// Written with 12 named accumulators rather than arrays: GCC keeps arrays of __m256 on the
// stack here (a load + store per FMA), which halves throughput.
template <int R, bool kColA = false>
inline void ukernel(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kc,
                    float* c, int64_t ldc, bool accumulate, const float* init) {
  static_assert(R >= 1 && R <= kMR);
  if (accumulate) {
    // The C tile is read only after the whole k loop; fetch it now so a miss to L3/DRAM
    // overlaps with the FMAs instead of stalling at the end.
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 15), _MM_HINT_T0);
    }
  }
  const __m256 i0 = init ? _mm256_loadu_ps(init) : _mm256_setzero_ps();
  const __m256 i1 = init ? _mm256_loadu_ps(init + 8) : _mm256_setzero_ps();
  __m256 c00 = i0, c01 = i1, c10 = i0, c11 = i1, c20 = i0, c21 = i1;
  __m256 c30 = i0, c31 = i1, c40 = i0, c41 = i1, c50 = i0, c51 = i1;
  const int64_t rs = kColA ? 0 : lda;  // row step of the row-major pointers (unused if kColA)
  const float* a0 = a;
  const float* a1 = a + (R > 1 ? 1 : 0) * rs;
  const float* a2 = a + (R > 2 ? 2 : 0) * rs;
  const float* a3 = a + (R > 3 ? 3 : 0) * rs;
  const float* a4 = a + (R > 4 ? 4 : 0) * rs;
  const float* a5 = a + (R > 5 ? 5 : 0) * rs;
#define KLEIN_UK_ROW(r)                                    \
  if constexpr (R > r) {                                   \
    const __m256 av = kColA ? _mm256_broadcast_ss(a + r)  \
                            : _mm256_broadcast_ss(a##r + k);      \
    c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);            \
    c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);            \
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    KLEIN_UK_ROW(0) KLEIN_UK_ROW(1) KLEIN_UK_ROW(2) KLEIN_UK_ROW(3) KLEIN_UK_ROW(4) KLEIN_UK_ROW(5)
    b += ldb;
    if constexpr (kColA) a += lda;
  }
#undef KLEIN_UK_ROW
#define KLEIN_UK_STORE(r)                                                          \
  if constexpr (R > r) {                                                           \
    float* cr = c + r * ldc;                                                       \
    if (accumulate) {                                                              \
      c##r##0 = _mm256_add_ps(c##r##0, _mm256_loadu_ps(cr));                       \
      c##r##1 = _mm256_add_ps(c##r##1, _mm256_loadu_ps(cr + 8));                   \
    }                                                                              \
    _mm256_storeu_ps(cr, c##r##0);                                                 \
    _mm256_storeu_ps(cr + 8, c##r##1);                                             \
  }
  KLEIN_UK_STORE(0) KLEIN_UK_STORE(1) KLEIN_UK_STORE(2)
  KLEIN_UK_STORE(3) KLEIN_UK_STORE(4) KLEIN_UK_STORE(5)
#undef KLEIN_UK_STORE
}

// Runtime row count (1..kMR) → template instance.
template <bool kColA = false>
inline void ukernel_rows(int rows, const float* a, int64_t lda, const float* b, int64_t ldb,
                         int64_t kc, float* c, int64_t ldc, bool accumulate, const float* init) {
  switch (rows) {
    case 6: ukernel<6, kColA>(a, lda, b, ldb, kc, c, ldc, accumulate, init); break;
    case 5: ukernel<5, kColA>(a, lda, b, ldb, kc, c, ldc, accumulate, init); break;
    case 4: ukernel<4, kColA>(a, lda, b, ldb, kc, c, ldc, accumulate, init); break;
    case 3: ukernel<3, kColA>(a, lda, b, ldb, kc, c, ldc, accumulate, init); break;
    case 2: ukernel<2, kColA>(a, lda, b, ldb, kc, c, ldc, accumulate, init); break;
    default: ukernel<1, kColA>(a, lda, b, ldb, kc, c, ldc, accumulate, init); break;
  }
}

// Same as ukernel_rows but only the first `cols` (< 16) columns of C exist in memory: computes
// into a 6×16 stack tile and copies the valid part, so nothing past the row end is touched.
template <bool kColA = false>
inline void ukernel_edge(int rows, int cols, const float* a, int64_t lda, const float* b,
                         int64_t ldb, int64_t kc, float* c, int64_t ldc, bool accumulate,
                         const float* init) {
  alignas(32) float t[kMR * kNR] = {};  // [rows, 16]
  if (accumulate)
    for (int r = 0; r < rows; ++r) std::memcpy(t + r * kNR, c + r * ldc, cols * sizeof(float));
  ukernel_rows<kColA>(rows, a, lda, b, ldb, kc, t, kNR, accumulate, init);
  for (int r = 0; r < rows; ++r) std::memcpy(c + r * ldc, t + r * kNR, cols * sizeof(float));
}

// 8 consecutive weight elements of dtype f32 / bf16 / f16 as float32.
inline __m256 load8_f32(const void* p, DType dt) {
  switch (dt) {
    case DType::kBF16: {
      // bf16 is the top half of an f32: widen to 32 bits and shift into place.
      const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case DType::kF16:
      return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    default:
      return _mm256_loadu_ps(static_cast<const float*>(p));
  }
}

// Scalar loads go through memcpy: a safetensors header of odd length leaves 2- and 4-byte
// elements misaligned, and a plain dereference of such a pointer is undefined behaviour.
inline float load1_f32(const void* p, DType dt) {
  switch (dt) {
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return _cvtsh_ss(h);
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

// In-register transpose of the 8×8 block held in r0..r7 (row i → column i).
inline void transpose8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4, __m256& r5,
                       __m256& r6, __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(s0, s4, 0x20);
  r1 = _mm256_permute2f128_ps(s1, s5, 0x20);
  r2 = _mm256_permute2f128_ps(s2, s6, 0x20);
  r3 = _mm256_permute2f128_ps(s3, s7, 0x20);
  r4 = _mm256_permute2f128_ps(s0, s4, 0x31);
  r5 = _mm256_permute2f128_ps(s1, s5, 0x31);
  r6 = _mm256_permute2f128_ps(s2, s6, 0x31);
  r7 = _mm256_permute2f128_ps(s3, s7, 0x31);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 2^x for 8 lanes with x ≤ 0, as softmax needs after subtracting the max (scores are kept in
// log2 units). Relative error ≤ 3e-7 (degree-5 minimax polynomial on [-0.5, 0.5]). x ≤ -127
// and -inf give exactly 0: the clamp maps them to -127, whose exponent field is 0. NaN gives
// NaN (the clamp is written (bound, x): vmaxps returns its second operand when one is NaN), so
// that a NaN score reaches the attention's output (kernels.h).
inline __m256 exp2_neg(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(x, n);  // [-0.5, 0.5]
  __m256 p = _mm256_set1_ps(1.3276445e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.6755372e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.5507135e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.4022120e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.9314694e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0000001f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Grow-only 64-byte aligned float buffer, one per thread and call site (thread_local), so the
// hot paths do not malloc per call; pool threads live for the whole run, so this is bounded.
struct Scratch {
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t need) {
    if (need > n) {
      std::free(p);
      const size_t bytes = (need * sizeof(float) + 63) / 64 * 64;
      p = static_cast<float*>(host_alloc_bytes(bytes));
      note_scratch_bytes(static_cast<int64_t>(need) - static_cast<int64_t>(n));  // counted for memory budgets
      n = need;
    }
    return p;
  }
  ~Scratch() {
    std::free(p);
    note_scratch_bytes(-static_cast<int64_t>(n));
  }
};

}  // namespace klein::kernels::avx2
