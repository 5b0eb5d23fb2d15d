// The bf16 pair unit of the AVX512_BF16 kernels (the GEMM, gemm_avx512bf16.cpp, and the conv,
// conv2d_avx512bf16.cpp): one 4-byte unit holds two consecutive k of a row as bf16, the lower k
// in the low half; vdpbf16ps multiplies the pairs and adds both products into a float32 lane.
// Include ONLY from *_avx512bf16.cpp files (needs -mavx512bf16).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace klein::kernels {
namespace {

struct Bf16Dot {
  using A = uint32_t;
  static __m512 bcast(const uint32_t* p) {
    int v;  // memcpy: the pairs were written as uint16_t
    std::memcpy(&v, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32(v));
  }
  static __m512 madd(__m512 c, __m512 a, __m512 b) {
    return _mm512_dpbf16_ps(c, (__m512bh)_mm512_castps_si512(a), (__m512bh)_mm512_castps_si512(b));
  }
};

}  // namespace
}  // namespace klein::kernels
