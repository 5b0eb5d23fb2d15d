// The float-accumulating AVX-512 GEMM shared by the fp32 kernel (gemm_avx512.cpp: vfmadd231ps on
// one float per unit) and the bf16 one (gemm_avx512bf16.cpp: vdpbf16ps on a pair of bf16 per
// unit): the AVX2 design (src/kernels/cpu/gemm_avx2.cpp) widened to 512 bits.
//
//   for each NC-wide slab of W rows (output columns) owned by this thread:
//     for each KC-unit slice of K:
//       pack W[nc, kc] into 32-column panels of 4-byte units (gemm_units.h), converting the
//       weight format first where the kernel needs another (f16 → f32, f32 → bf16, ...);
//       for every MR-row sliver of x: MR×32 micro-kernel over each panel, accumulating in y.
//   MR = 14: 28 zmm accumulators + 2 B vectors + 1 broadcast = 31 of the 32 registers, and 28
//   independent chains cover the FMA latency (4) × 2 pipes with room to spare. KC = 256 units:
//   the 14 × 256 × 4 B = 14 KB sliver of x stays in L1, the 256 × 256 × 4 B = 256 KB slab in L2;
//   each micro-kernel call streams one 32 KB panel from L2 (2 × 64 B per 28 FMAs).
// Edges: columns with AVX-512 masks (nothing past the row end is read or written), rows through
// the template row count.
//
// Include ONLY from *_avx512*.cpp and *_amx.cpp files (AVX-512 F/BW/DQ/VL code), which only the kernel registry
// reaches, on CPUs that have the ISA.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/format.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels {
namespace {

constexpr int kZMR = 14;        // rows of x per micro-kernel
constexpr int kZNR = 32;        // columns per panel (two zmm of float32)
constexpr int64_t kZKC = 256;   // units per packed K slice
constexpr int64_t kZNC = 256;   // columns per slab (multiple of kZNR)
constexpr int64_t kZALd = kZKC + 16;  // units per row of a copied sliver (zgemm_block)

// One float per unit, vfmadd231ps: the Op of the float32 GEMM and conv (bcast / madd as
// zukernel needs them).
struct F32Dot {
  using A = float;
  static __m512 bcast(const float* p) { return _mm512_set1_ps(*p); }
  static __m512 madd(__m512 c, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, c); }
};

inline __mmask16 col_mask(int cols) {  // the first `cols` (0..16) lanes
  return static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1);
}

// ref::quantize_row_int8 into K bytes of q + offset (offset 0x80: u8 = q + 128 for vpdpbusd's
// unsigned operand; 0: s8 for AMX's tdpbssd) and Kp − K pad bytes of `offset` (q = 0), 16 floats
// at a time. The quotient x / s is formed in double as x · (1 / s) and rounded to float: that
// float equals the float32 quotient x / s bit for bit, so q does too, at ~half the cost of
// vdivps (which bound this loop). Why it is exact: with x = X·2^a and s = S·2^b (X, S < 2^24),
// x / s can never equal a midpoint between two floats (M·2^e with M odd, M ≥ 2^24 would have to
// divide X), and its relative distance from the nearest one is at least 2^-49 — while the double
// product's relative error is below 2^-52. So both round to the same float. (Quotients below
// 2^-126, where midpoints are coarser, are far below 0.5 and give q = 0 either way.)
// The max of |x| is on the bits as integers (quantize_row_avx2: a NaN anywhere is kept).
inline void quantize_row_int8_z(const float* x, int64_t K, int64_t Kp, uint8_t* q, float* s_out, uint8_t offset) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  auto abs_at = [&](int64_t i) { return _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask); };
  __m512i mx = _mm512_setzero_si512(), m1 = mx, m2 = mx, m3 = mx;  // four chains: vpmaxsd latency
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    mx = _mm512_max_epi32(mx, abs_at(k));
    m1 = _mm512_max_epi32(m1, abs_at(k + 16));
    m2 = _mm512_max_epi32(m2, abs_at(k + 32));
    m3 = _mm512_max_epi32(m3, abs_at(k + 48));
  }
  mx = _mm512_max_epi32(_mm512_max_epi32(mx, m1), _mm512_max_epi32(m2, m3));
  for (; k + 16 <= K; k += 16) mx = _mm512_max_epi32(mx, abs_at(k));
  if (k < K)
    mx = _mm512_max_epi32(mx, _mm512_and_si512(_mm512_maskz_loadu_epi32(col_mask(static_cast<int>(K - k)), x + k),
                                               abs_mask));
  const float amax = std::bit_cast<float>(_mm512_reduce_max_epi32(mx));
  const float s = amax / 127.0f;
  *s_out = s;
  if (!(s > 0.0f && s < std::numeric_limits<float>::infinity())) {  // zero, or a NaN / inf in x
    std::memset(q, offset, Kp);
    return;
  }
  const __m512d r = _mm512_set1_pd(1.0 / static_cast<double>(s));
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m128i flip = _mm_set1_epi8(static_cast<char>(offset));
  for (k = 0; k < K; k += 16) {
    const __mmask16 m = col_mask(static_cast<int>(std::min<int64_t>(16, K - k)));
    const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    const __m256 f0 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), r));
    const __m256 f1 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), r));
    __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(f0), f1, 1);
    f = _mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i i = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(f, lo), hi));  // integral: exact
    _mm_mask_storeu_epi8(q + k, m, _mm_xor_si128(_mm512_cvtepi32_epi8(i), flip));  // |i| ≤ 127: exact
  }
  for (k = K; k < Kp; ++k) q[k] = offset;
}

// C[R×32] (= init or 0, or += when accumulate) + A[R×nq units] · panel[nq][32]. `Op` supplies
// bcast(const A* unit) → __m512 and madd(c, a, b) → c + a·b per unit. cols ≤ 32 valid columns.
// Generalised for the direct bf16 conv: the units come in `ntap` runs of nq (A's columns
// t·nq + q), run t reading B rows at b + toff[t] + q·ldb; the GEMM has one run with ldb = 32.
// kPhase ≥ 0 (the sub-pixel upsampling conv, conv2d_avx512bf16.cpp): column j of C is added
// into c[2j + kPhase] instead (accumulate implied; the other lanes untouched), cols ≤ 32 still
// counting C's columns.
// noinline: inlined into the driver, GCC may keep stack copies of the accumulators in the loop
// (seen in the int8 kernels).
template <class Op, int R, int kPhase = -1>
__attribute__((noinline)) void zukernel_taps(const typename Op::A* a, int64_t lda, const uint32_t* b,
                                             const int64_t* toff, int ntap, int64_t nq, int64_t ldb, float* c,
                                             int64_t ldc, bool accumulate, const float* init, int cols) {
  static_assert(R >= 1 && R <= kZMR);
  const __mmask16 m0 = col_mask(cols), m1 = col_mask(std::max(0, cols - 16));
  const __m512 i0 = init ? _mm512_maskz_loadu_ps(m0, init) : _mm512_setzero_ps();
  const __m512 i1 = init ? _mm512_maskz_loadu_ps(m1, init + 16) : _mm512_setzero_ps();
  // Named accumulators (not arrays): GCC keeps arrays of vectors on the stack here.
#define KLEIN_Z_DECL(r) __m512 c##r##_0 = i0, c##r##_1 = i1; const typename Op::A* a##r = a + (R > r ? r : 0) * lda;
  KLEIN_Z_DECL(0) KLEIN_Z_DECL(1) KLEIN_Z_DECL(2) KLEIN_Z_DECL(3) KLEIN_Z_DECL(4) KLEIN_Z_DECL(5) KLEIN_Z_DECL(6)
  KLEIN_Z_DECL(7) KLEIN_Z_DECL(8) KLEIN_Z_DECL(9) KLEIN_Z_DECL(10) KLEIN_Z_DECL(11) KLEIN_Z_DECL(12) KLEIN_Z_DECL(13)
#undef KLEIN_Z_DECL
#define KLEIN_Z_ROW(r)                          \
  if constexpr (R > r) {                        \
    const __m512 av = Op::bcast(a##r + q);      \
    c##r##_0 = Op::madd(c##r##_0, av, b0);      \
    c##r##_1 = Op::madd(c##r##_1, av, b1);      \
  }
  for (int t = 0; t < ntap; ++t) {
    const uint32_t* bt = b + toff[t];
#pragma GCC unroll 2
    for (int64_t q = 0; q < nq; ++q) {
      const __m512 b0 = _mm512_castsi512_ps(_mm512_loadu_si512(bt));
      const __m512 b1 = _mm512_castsi512_ps(_mm512_loadu_si512(bt + 16));
      KLEIN_Z_ROW(0) KLEIN_Z_ROW(1) KLEIN_Z_ROW(2) KLEIN_Z_ROW(3) KLEIN_Z_ROW(4) KLEIN_Z_ROW(5) KLEIN_Z_ROW(6)
      KLEIN_Z_ROW(7) KLEIN_Z_ROW(8) KLEIN_Z_ROW(9) KLEIN_Z_ROW(10) KLEIN_Z_ROW(11) KLEIN_Z_ROW(12) KLEIN_Z_ROW(13)
      bt += ldb;
    }
#define KLEIN_Z_NEXT(r) if constexpr (R > r) a##r += nq;
    KLEIN_Z_NEXT(0) KLEIN_Z_NEXT(1) KLEIN_Z_NEXT(2) KLEIN_Z_NEXT(3) KLEIN_Z_NEXT(4) KLEIN_Z_NEXT(5) KLEIN_Z_NEXT(6)
    KLEIN_Z_NEXT(7) KLEIN_Z_NEXT(8) KLEIN_Z_NEXT(9) KLEIN_Z_NEXT(10) KLEIN_Z_NEXT(11) KLEIN_Z_NEXT(12) KLEIN_Z_NEXT(13)
#undef KLEIN_Z_NEXT
  }
#undef KLEIN_Z_ROW
  if constexpr (kPhase >= 0) {
    // Lane l of the span's vector h (0-3) takes column 8h + l / 2 where l % 2 = kPhase.
    const __m512i half = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 1);
    const __m512i half8 = _mm512_add_epi32(half, _mm512_set1_epi32(8));
    const auto lanes = static_cast<__mmask16>(kPhase ? 0xaaaa : 0x5555);
    const __mmask16 n0 = lanes & col_mask(2 * cols), n1 = lanes & col_mask(std::max(0, 2 * cols - 16));
    const __mmask16 n2 = lanes & col_mask(std::max(0, 2 * cols - 32)), n3 = lanes & col_mask(std::max(0, 2 * cols - 48));
    // (maskz permutes: GCC 12 warns of the plain one's undefined pass-through operand.)
#define KLEIN_Z_PHASE(cr, m, idx, v) \
  _mm512_mask_storeu_ps(cr, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr), _mm512_maskz_permutexvar_ps(m, idx, v)))
#define KLEIN_Z_STORE(r)                              \
  if constexpr (R > r) {                              \
    float* cr = c + r * ldc;                          \
    KLEIN_Z_PHASE(cr, n0, half, c##r##_0);            \
    KLEIN_Z_PHASE(cr + 16, n1, half8, c##r##_0);      \
    KLEIN_Z_PHASE(cr + 32, n2, half, c##r##_1);       \
    KLEIN_Z_PHASE(cr + 48, n3, half8, c##r##_1);      \
  }
    KLEIN_Z_STORE(0) KLEIN_Z_STORE(1) KLEIN_Z_STORE(2) KLEIN_Z_STORE(3) KLEIN_Z_STORE(4) KLEIN_Z_STORE(5)
    KLEIN_Z_STORE(6) KLEIN_Z_STORE(7) KLEIN_Z_STORE(8) KLEIN_Z_STORE(9) KLEIN_Z_STORE(10) KLEIN_Z_STORE(11)
    KLEIN_Z_STORE(12) KLEIN_Z_STORE(13)
#undef KLEIN_Z_STORE
#undef KLEIN_Z_PHASE
    return;
  }
#define KLEIN_Z_STORE(r)                                                        \
  if constexpr (R > r) {                                                        \
    float* cr = c + r * ldc;                                                    \
    if (accumulate) {                                                           \
      c##r##_0 = _mm512_add_ps(c##r##_0, _mm512_maskz_loadu_ps(m0, cr));        \
      c##r##_1 = _mm512_add_ps(c##r##_1, _mm512_maskz_loadu_ps(m1, cr + 16));   \
    }                                                                           \
    _mm512_mask_storeu_ps(cr, m0, c##r##_0);                                    \
    _mm512_mask_storeu_ps(cr + 16, m1, c##r##_1);                               \
  }
  KLEIN_Z_STORE(0) KLEIN_Z_STORE(1) KLEIN_Z_STORE(2) KLEIN_Z_STORE(3) KLEIN_Z_STORE(4) KLEIN_Z_STORE(5)
  KLEIN_Z_STORE(6) KLEIN_Z_STORE(7) KLEIN_Z_STORE(8) KLEIN_Z_STORE(9) KLEIN_Z_STORE(10) KLEIN_Z_STORE(11)
  KLEIN_Z_STORE(12) KLEIN_Z_STORE(13)
#undef KLEIN_Z_STORE
}

template <class Op, int R>
inline void zukernel(const typename Op::A* a, int64_t lda, const uint32_t* b, int64_t nq, float* c, int64_t ldc,
                     bool accumulate, const float* init, int cols) {
  static constexpr int64_t kNoOffset[1] = {0};
  zukernel_taps<Op, R>(a, lda, b, kNoOffset, 1, nq, kZNR, c, ldc, accumulate, init, cols);
}

template <class Op>
void zukernel_rows(int rows, const typename Op::A* a, int64_t lda, const uint32_t* b, int64_t nq, float* c,
                   int64_t ldc, bool accumulate, const float* init, int cols) {
  switch (rows) {
#define KLEIN_Z_CASE(n) \
  case n: zukernel<Op, n>(a, lda, b, nq, c, ldc, accumulate, init, cols); break;
    KLEIN_Z_CASE(14) KLEIN_Z_CASE(13) KLEIN_Z_CASE(12) KLEIN_Z_CASE(11) KLEIN_Z_CASE(10) KLEIN_Z_CASE(9)
    KLEIN_Z_CASE(8) KLEIN_Z_CASE(7) KLEIN_Z_CASE(6) KLEIN_Z_CASE(5) KLEIN_Z_CASE(4) KLEIN_Z_CASE(3)
    KLEIN_Z_CASE(2)
#undef KLEIN_Z_CASE
    default: zukernel<Op, 1>(a, lda, b, nq, c, ldc, accumulate, init, cols); break;
  }
}

template <class Op, int kPhase = -1>
void zukernel_taps_rows(int rows, const typename Op::A* a, int64_t lda, const uint32_t* b, const int64_t* toff,
                        int ntap, int64_t nq, int64_t ldb, float* c, int64_t ldc, bool accumulate, int cols) {
  switch (rows) {
#define KLEIN_Z_CASE(n) \
  case n: zukernel_taps<Op, n, kPhase>(a, lda, b, toff, ntap, nq, ldb, c, ldc, accumulate, nullptr, cols); break;
    KLEIN_Z_CASE(14) KLEIN_Z_CASE(13) KLEIN_Z_CASE(12) KLEIN_Z_CASE(11) KLEIN_Z_CASE(10) KLEIN_Z_CASE(9)
    KLEIN_Z_CASE(8) KLEIN_Z_CASE(7) KLEIN_Z_CASE(6) KLEIN_Z_CASE(5) KLEIN_Z_CASE(4) KLEIN_Z_CASE(3)
    KLEIN_Z_CASE(2)
#undef KLEIN_Z_CASE
    default: zukernel_taps<Op, 1, kPhase>(a, lda, b, toff, ntap, nq, ldb, c, ldc, accumulate, nullptr, cols); break;
  }
}

// Transposes of 32-bit lanes by vpermt2d stages: at scale s, rows i and i + s swap their
// off-diagonal s-lane blocks. N = 16: r[i] ← column i of the 16×16 matrix whose row i is r[i]
// (four stages). N = 8: the last three stages on 8 rows, within each half of 8 lanes — r[j]
// holds column j of lanes 0..7 in its low half and column j of lanes 8..15 in its high half.
template <int N>
inline void transpose_epi32(__m512i r[N]) {
  static_assert(N == 8 || N == 16);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int sc = N / 2; sc >= 1; sc /= 2) {
    const __m512i hi = _mm512_and_si512(lane, _mm512_set1_epi32(sc));  // lanes with bit sc set
    const __mmask16 up = _mm512_test_epi32_mask(hi, hi);
    // top: l < s in block → r_i[l], else r_j[l − s]; bottom: l < s → r_i[l + s], else r_j[l].
    const __m512i it = _mm512_mask_add_epi32(lane, up, lane, _mm512_set1_epi32(16 - sc));
    const __m512i ib = _mm512_mask_add_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(sc)), up, lane,
                                             _mm512_set1_epi32(16));
    for (int i = 0; i < N; ++i) {
      if (i & sc) continue;
      const __m512i a = r[i], b = r[i + sc];
      r[i] = _mm512_permutex2var_epi32(a, it, b);
      r[i + sc] = _mm512_permutex2var_epi32(a, ib, b);
    }
  }
}
inline void transpose16x16_epi32(__m512i r[16]) { transpose_epi32<16>(r); }

// A 32-column panel (gemm_units.h) by zmm transposes: dst[q·32 + j] = unit q of row j (zero for
// j ≥ nr), where load(j, q, nu) returns row j's units q .. q + 15 as a zmm (those past nu zero;
// it reads and converts the stored format). 16 rows × 16 units at a time: 16 row loads,
// transpose16x16_epi32 (above), 16 stores — a scalar load and store per unit was ~9 % of a DiT step.
template <class Load>
inline void pack_panel_z(int nr, int64_t nq, uint32_t* dst, const Load& load) {
  for (int j0 = 0; j0 < kZNR; j0 += 16)
    for (int64_t q = 0; q < nq; q += 16) {
      const int nu = static_cast<int>(std::min<int64_t>(16, nq - q));
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = j0 + i < nr ? load(j0 + i, q, nu) : _mm512_setzero_si512();
      transpose16x16_epi32(r);
      for (int u = 0; u < nu; ++u) _mm512_storeu_si512(dst + (q + u) * kZNR + j0, r[u]);
    }
}

// The panel of stored 4-byte units q0 .. q0 + nq of rows ld bytes apart.
inline void pack_units_z(const uint8_t* src, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst) {
  pack_panel_z(nr, nq, dst, [&](int j, int64_t q, int nu) {
    return _mm512_maskz_loadu_epi32(col_mask(nu), src + j * ld + (q0 + q) * 4);
  });
}

// The VNNI yᵀ tiles' step for one weight column (gemm_int8_avx512vnni.cpp, gemm_w4a8_avx512vnni.cpp):
// the 4-byte unit at p broadcast and multiplied into the column's two accumulators (32 rows of
// activation units a0, a1). A template so that the AVX-512F files that include this header
// without VNNI never compile it.
template <class = void>
__attribute__((always_inline)) inline void dpbusd_unit2(__m512i& c0, __m512i& c1, __m512i a0, __m512i a1,
                                                        const uint8_t* p) {
  int32_t u;
  std::memcpy(&u, p, 4);
  const __m512i bv = _mm512_set1_epi32(u);
  c0 = _mm512_dpbusd_epi32(c0, a0, bv);
  c1 = _mm512_dpbusd_epi32(c1, a1, bv);
}

// The frame of the direct driver's AVX-512 yᵀ tiles (gemm_direct.h: the W8A8 VNNI and the bf16
// tiles, 32 rows × up to 12 weight rows). The weight rows are reached from four row pointers w0,
// w3, w6, w9 and the strides ldw, l2 = 2·ldw by addressing modes (KLEIN_YT_ROW_POINTERS declares
// them from w and ldw): KLEIN_YT_COLUMNS(COL) expands COL(j, pointer, offset) for the 12 columns j.
#define KLEIN_YT_ROW_POINTERS(w)                                                                  \
  const uint8_t* w0 = (w);                                                                        \
  const uint8_t* w3 = w0 + 3 * ldw;                                                               \
  const uint8_t* w6 = w0 + 6 * ldw;                                                               \
  const uint8_t* w9 = w0 + 9 * ldw;                                                               \
  const int64_t l2 = 2 * ldw;
// The tile's 24 accumulators c{j}_0, c{j}_1 (rows 0-15 and 16-31 of column j), of type T.
#define KLEIN_YT_ACCUMULATORS(T, zero)                                                            \
  T c0_0 = zero, c0_1 = zero, c1_0 = zero, c1_1 = zero, c2_0 = zero, c2_1 = zero, c3_0 = zero,    \
    c3_1 = zero, c4_0 = zero, c4_1 = zero, c5_0 = zero, c5_1 = zero, c6_0 = zero, c6_1 = zero,    \
    c7_0 = zero, c7_1 = zero, c8_0 = zero, c8_1 = zero, c9_0 = zero, c9_1 = zero, c10_0 = zero,   \
    c10_1 = zero, c11_0 = zero, c11_1 = zero;
#define KLEIN_YT_COLUMNS(COL)                                                                     \
  COL(0, w0, 0) COL(1, w0, ldw) COL(2, w0, l2) COL(3, w3, 0) COL(4, w3, ldw) COL(5, w3, l2)       \
  COL(6, w6, 0) COL(7, w6, ldw) COL(8, w6, l2) COL(9, w9, 0) COL(10, w9, ldw) COL(11, w9, l2)

// step() for each of nq units of K, and the driver's prefetch pf->step() once per 16 (a line
// of weights per row).
template <class Step>
__attribute__((always_inline)) inline void yt_units(int64_t nq, SlicePrefetch* pf, const Step& step) {
  int64_t q = 0;
  for (; q + 16 <= nq; q += 16) {
    pf->step();
    for (int i = 0; i < 16; ++i) step();
  }
  for (; q < nq; ++q) step();
}

// r[h][j]: column j's results (float32 bits) for rows 16h .. 16h + 15 of the tile; j < cols are
// stored into rows of y (a 16×16 transpose per 16 rows), the others are ignored.
inline void yt_store(__m512i r[2][16], int rows, int cols, float* y, int64_t ldy) {
  const __mmask16 cm = col_mask(cols);
  for (int h = 0; h < 2 && h * 16 < rows; ++h) {
    transpose16x16_epi32(r[h]);
    const int n = std::min(16, rows - h * 16);
    for (int i = 0; i < n; ++i) _mm512_mask_storeu_ps(y + (h * 16 + i) * ldy, cm, _mm512_castsi512_ps(r[h][i]));
  }
}

// x quantized for the W4A8 kernels whose tiles take 32-row blocks of activations (AVX512_VNNI,
// AMX): each row as ref::quantize_row_int8's bytes xor `offset` (0x80: u8 = q + 128, vpdpbusd's
// unsigned operand; 0: s8 as tdpbusd takes it), stored per block as [K/4][32] 4-byte units in
// qa [blocks][K/4][32]; the rows' group sums X_g = Σ q (exact as float: |X_g| ≤ 64 · 127) in
// xs [blocks][G][32] and their scales in sx [blocks · 32], both 0 for the pad rows. K % 64 == 0.
inline void quantize_w4a8_blocks_z(const float* x, int64_t M, int64_t K, int64_t ldx, uint8_t offset,
                                   ThreadPool& pool, uint32_t* qa, float* xs, float* sx) {
  constexpr int kB = 32;
  const int64_t KU = K / 4, G = K / 64, blocks = (M + kB - 1) / kB;
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    static thread_local UnitScratch rows_buf;
    uint8_t* rows = rows_buf.get<uint8_t>(kB * K);
    // Σ q over 64 bytes = Σ (q + 128) − 64 · 128, the biased bytes summed by vpsadbw.
    const __m512i to_biased = _mm512_set1_epi8(static_cast<char>(offset ^ 0x80)), zero = _mm512_setzero_si512();
    for (int64_t b = b0; b < b1; ++b) {
      const int n = static_cast<int>(std::min<int64_t>(kB, M - b * kB));
      float* xb = xs + b * G * kB;
      for (int r = 0; r < kB; ++r) {
        if (r >= n) {
          sx[b * kB + r] = 0.0f;
          for (int64_t g = 0; g < G; ++g) xb[g * kB + r] = 0.0f;
          continue;
        }
        uint8_t* q = rows + r * K;
        quantize_row_int8_z(x + (b * kB + r) * ldx, K, K, q, &sx[b * kB + r], offset);
        for (int64_t g = 0; g < G; ++g) {
          const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(q + g * 64), to_biased);
          xb[g * kB + r] = static_cast<float>(_mm512_reduce_add_epi64(_mm512_sad_epu8(v, zero)) - 64 * 128);
        }
      }
      pack_units_z(rows, K, n, 0, KU, qa + b * KU * kB);
    }
  });
}

// y[m0:m1, n0:n1] = A · W[n0:n1]ᵀ (+ bias) over all KU units. A: rows of units at stride lda.
// Op::slab(W, nc0, ncn, scratch) returns the slab's rows {bytes, row stride in bytes}, and
// Op::pack(rows, ld, nr, q0, nq, panel, W) packs a panel of them as units.
template <class Op>
void zgemm_block(const typename Op::A* a, int64_t lda, int64_t m0, int64_t m1, int64_t KU, const Weight& W,
                 int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  static thread_local UnitScratch pack_buf, conv_buf, a_buf;
  uint32_t* bp = pack_buf.get<uint32_t>(std::min(kZKC, KU) * kZNC);  // [kZNC/32][kc][32]
  // A sliver's rows lie lda units apart; at a stride that is a multiple of 2 KB (K = 3072 in
  // float32, 4096 or 12288 in bf16 pairs) the 14 rows' lines map to one or two of L1's 64 sets,
  // more rows than an 8- or 12-way set holds, and the sliver no longer stays in L1 while the
  // slab's panels pass over it. Such slivers are copied per K slice to a stride of kZALd units
  // (17 lines: consecutive rows in different sets). Zen 4, M = 256, K = 12288 → N = 3072: bf16
  // 60 → 85 % of the vdpbf16ps peak, as with K = 12352 in place.
  const bool copy_a = (lda * static_cast<int64_t>(sizeof(*a))) % 2048 == 0;
  typename Op::A* ab = copy_a ? a_buf.get<typename Op::A>(kZMR * kZALd) : nullptr;
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kZNC) {
    const int64_t ncn = std::min(kZNC, n1 - nc0);
    // Not a structured binding: clang 14 rejects those inside requires-expressions and lambdas.
    const auto slab_rows = Op::slab(W, nc0, ncn, KU, conv_buf);
    const auto* const src = slab_rows.first;
    const int64_t ld = slab_rows.second;
    // Bytes per stored unit for the slice prefetch: 4; 2 for halves widened to float32 units, 8
    // for float32 rounded to bf16 pairs (rounded down for an odd K: only a prefetch distance).
    const int64_t ub = ld / KU;
    const int64_t np = (ncn + kZNR - 1) / kZNR;
    for (int64_t kc0 = 0; kc0 < KU; kc0 += kZKC) {
      const int64_t kcn = std::min(kZKC, KU - kc0);
      for (int64_t p = 0; p < np; ++p)
        Op::pack(src + p * kZNR * ld, ld, static_cast<int>(std::min<int64_t>(kZNR, ncn - p * kZNR)), kc0, kcn,
                 bp + p * kcn * kZNR, W);
      const bool acc = kc0 > 0;  // later K slices add onto the partial sums already in y
      const Slivers sl(m0, m1, kZMR);
      // The next slice's weight rows, fetched while this slice computes (gemm_units.h).
      SlicePrefetch pf(src + (kc0 + kcn) * ub, ld, ncn, std::min(kZKC, KU - (kc0 + kcn)) * ub, sl.n);
      for (int64_t i = 0; i < sl.n; ++i) {
        pf.step();
        const int64_t m = sl.begin(i);
        const int rows = sl.rows(i);
        const typename Op::A* as = a + m * lda + kc0;
        int64_t la = lda;
        if (copy_a) {  // the sliver's slice at a stride of kZALd units (see above)
          for (int r = 0; r < rows; ++r) std::memcpy(ab + r * kZALd, as + r * lda, kcn * sizeof(*as));
          as = ab, la = kZALd;
        }
        for (int64_t p = 0; p < np; ++p) {
          const int64_t n = nc0 + p * kZNR;
          const int cols = static_cast<int>(std::min<int64_t>(kZNR, ncn - p * kZNR));
          zukernel_rows<Op>(rows, as, la, bp + p * kcn * kZNR, kcn, y + m * ldy + n, ldy, acc,
                            (!acc && bias) ? bias + n : nullptr, cols);
        }
      }
    }
  }
}

template <class Op>
void zgemm(const typename Op::A* a, int64_t lda, int64_t M, int64_t KU, const Weight& W, const float* bias,
           float* y, ThreadPool& pool, int64_t ldy) {
  split_gemm(M, W.rows(), kZMR, kZNR, kZNC, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    zgemm_block<Op>(a, lda, m0, m1, KU, W, n0, n1, bias, y, ldy);
  });
}

}  // namespace
}  // namespace klein::kernels
