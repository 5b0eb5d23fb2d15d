// AVX-512F float32 conv2d (Precision::kFp32, exact float32 arithmetic): the AVX2 implicit GEMM
// widened to 14×32 zmm tiles — conv2d_avx512_common.h with one float per unit.
#include "kernels/cpu/conv2d_avx512_common.h"

namespace klein::kernels::avx512 {

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  conv2d_zmm<F32Dot>(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::avx512
