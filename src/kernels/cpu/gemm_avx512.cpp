// AVX-512F float32 linear layer (Precision::kFp32 — exact float32 arithmetic on the stored
// weights): y[M, N] = x[M, K] · W[N, K]ᵀ + bias, the AVX2 GEMM widened to 14×32 register tiles
// (gemm_avx512_common.h). One unit = one float, so x is read in place; F32 weights are packed
// straight from storage, the other formats are expanded to float32 per slab first (BF16 / F16
// vectorised, quantized formats through the format table's row → f32).
// Small M (≤ 4: decode-time GEMV, memory-bound) goes to the AVX2 GEMV, which streams W once.
#include "kernels/cpu/avx2_kernels.h"
#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_avx512_common.h"

namespace klein::kernels::avx512 {
namespace {

struct F32Op : F32Dot {
  // The slab's rows as float32 units (KU = K).
  static std::pair<const uint8_t*, int64_t> slab(const Weight& W, int64_t nc0, int64_t ncn, int64_t KU,
                                                 UnitScratch& conv) {
    if (W.dtype == DType::kF32) return {static_cast<const uint8_t*>(W.data) + nc0 * KU * 4, KU * 4};
    float* f = conv.get<float>(ncn * KU);
    for (int64_t j = 0; j < ncn; ++j) weight_row_f32(W, nc0 + j, KU, f + j * KU);
    return {reinterpret_cast<const uint8_t*>(f), KU * 4};
  }
};

}  // namespace

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy) {
  if (M <= 4) {
    avx2::linear(x, M, K, W, bias_f32, y, pool, ldx, ldy);
    return;
  }
  zgemm<F32Op>(x, ldx, M, K, W, bias_f32, y, pool, ldy);
}

}  // namespace klein::kernels::avx512
