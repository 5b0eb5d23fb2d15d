// AVX512_BF16 conv2d (Precision::kFast): the transformed input (after upsampling and the
// GroupNorm/SiLU prologue) and the weight rounded to bf16 (round-to-nearest-even, as torch), pairs
// multiplied by vdpbf16ps into float32 sums — conv2d_avx512_common.h with a bf16 pair per unit.
// ref::conv2d_bf16 is the same arithmetic with double sums. A unit holds two k, so this does
// twice the float32 zmm conv's multiply-adds per instruction.
#include "kernels/cpu/avx512bf16_dot.h"
#include "kernels/cpu/conv2d_avx512_common.h"

namespace klein::kernels::avx512bf16 {

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  conv2d_zmm<Bf16Dot>(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
}

}  // namespace klein::kernels::avx512bf16
