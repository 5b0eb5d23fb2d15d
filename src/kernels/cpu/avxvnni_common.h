// ymm helpers of the AVX-VNNI kernels (gemm_int8_avxvnni.cpp, gemm_w4a8_avxvnni.cpp).
// (avx2_common.h has the same transpose, but for the *_avx2.cpp files only: its inline functions
// have external linkage, and a copy compiled with -mavxvnni could be the one the linker keeps.
// Everything here has internal linkage.)
//
// Include ONLY from *_avxvnni.cpp files.
#pragma once

#include <immintrin.h>

namespace klein::kernels {
namespace {

// r[i] ← column i of the 8×8 block of 32-bit lanes whose row i is r[i].
inline void transpose8x8(__m256i r[8]) {
  const __m256 a0 = _mm256_castsi256_ps(r[0]), a1 = _mm256_castsi256_ps(r[1]), a2 = _mm256_castsi256_ps(r[2]),
               a3 = _mm256_castsi256_ps(r[3]), a4 = _mm256_castsi256_ps(r[4]), a5 = _mm256_castsi256_ps(r[5]),
               a6 = _mm256_castsi256_ps(r[6]), a7 = _mm256_castsi256_ps(r[7]);
  const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
  const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
  const __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
  const __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_castps_si256(_mm256_permute2f128_ps(s0, s4, 0x20));
  r[1] = _mm256_castps_si256(_mm256_permute2f128_ps(s1, s5, 0x20));
  r[2] = _mm256_castps_si256(_mm256_permute2f128_ps(s2, s6, 0x20));
  r[3] = _mm256_castps_si256(_mm256_permute2f128_ps(s3, s7, 0x20));
  r[4] = _mm256_castps_si256(_mm256_permute2f128_ps(s0, s4, 0x31));
  r[5] = _mm256_castps_si256(_mm256_permute2f128_ps(s1, s5, 0x31));
  r[6] = _mm256_castps_si256(_mm256_permute2f128_ps(s2, s6, 0x31));
  r[7] = _mm256_castps_si256(_mm256_permute2f128_ps(s3, s7, 0x31));
}

inline __m256i first_lanes(int n) {  // all-ones in the first n (0..8) 32-bit lanes
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace
}  // namespace klein::kernels
