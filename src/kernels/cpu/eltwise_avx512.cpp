// The AVX-512 element-wise kernels: eltwise_simd.h over 16-lane zmm vectors (eltwise_v16.h).
// Only reached through the registry's Isa::kAvx512 element-wise row, on CPUs that have it.
#include <immintrin.h>

#include "kernels/cpu/eltwise_simd.h"
#include "kernels/cpu/eltwise_v16.h"

namespace klein::kernels::avx512 {

// constexpr: the table is data in the binary. The registry takes every ISA's table on every CPU,
// and a run-time initialisation compiled in this file may use its ISA (GCC filled a
// function-local static table with zmm stores: SIGILL on AVX2-only CPUs).
constexpr EltwiseFns kFns = EltwiseSimd<V16>::table();
const EltwiseFns& eltwise() { return kFns; }

}  // namespace klein::kernels::avx512
