// AVX-512F float32 conv2d (Precision::kFp32, exact float32 arithmetic): the AVX2 implicit GEMM
// widened to 14×32 zmm tiles — conv2d_avx512_common.h with one float per unit. Under
// Precision::kFast (conv2d_fast) the same-padded 3×3 convs take the AVX2 float32 Winograd form.
#include "kernels/cpu/conv2d_avx512_common.h"

namespace klein::kernels::avx512 {

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  conv2d_zmm<F32Dot>(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

void conv2d_fast(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
                 ThreadPool& pool) {
  if (avx2::conv2d_winograd_f32(p, Cin, w.shape[0], w.shape[2], w.shape[3]))
    avx2::conv2d_winograd(in, N, Cin, H, W, w, bias, out, p, pool);
  else
    conv2d(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::avx512
