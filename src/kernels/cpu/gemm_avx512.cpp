// AVX-512F float32 linear layer (Precision::kFp32 — exact float32 arithmetic on the stored
// weights): y[M, N] = x[M, K] · W[N, K]ᵀ + bias, the AVX2 GEMM widened to 14×32 register tiles
// (gemm_avx512_common.h). One unit = one float, so x is read in place; F32 / BF16 / F16 weights
// are packed straight from storage (the halves widened while packing), the other formats are
// expanded to float32 per slab first (through the format table's row → f32).
// Small M (≤ 4: decode-time GEMV, memory-bound) goes to the AVX2 GEMV, which streams W once.
#include "kernels/cpu/avx2_kernels.h"
#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_avx512_common.h"

namespace klein::kernels::avx512 {
namespace {

// pack_units_z for rows of 16-bit floats (bf16 or f16, ld in bytes): each value widened to a
// float32 unit while packing, so the float32 GEMM reads such weights from storage per K slice
// instead of expanding a whole slab first (256 rows × K floats: 12 MB at K = 12288, per thread).
inline void pack_halves_z(const uint8_t* src, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst,
                          bool f16) {
  pack_panel_z(nr, nq, dst, [&](int j, int64_t q, int nu) {
    const __m256i h = _mm256_maskz_loadu_epi16(col_mask(nu), src + j * ld + (q0 + q) * 2);
    return _mm512_castps_si512(f16 ? _mm512_cvtph_ps(h) : bf16x16_to_f32(h));
  });
}

bool half_format(DType dt) { return dt == DType::kBF16 || dt == DType::kF16; }

struct F32Op : F32Dot {
  // The slab's rows (KU = K): F32 / BF16 / F16 in place, widened per K slice by pack; other
  // formats expanded to float32 rows here.
  static std::pair<const uint8_t*, int64_t> slab(const Weight& W, int64_t nc0, int64_t ncn, int64_t KU,
                                                 UnitScratch& conv) {
    if (W.dtype == DType::kF32 || half_format(W.dtype)) {
      const int64_t ld = KU * static_cast<int64_t>(dtype_size(W.dtype));
      return {static_cast<const uint8_t*>(W.data) + nc0 * ld, ld};
    }
    float* f = conv.get<float>(ncn * KU);
    for (int64_t j = 0; j < ncn; ++j) weight_row_f32(W, nc0 + j, KU, f + j * KU);
    return {reinterpret_cast<const uint8_t*>(f), KU * 4};
  }
  static void pack(const uint8_t* rows, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst, const Weight& W) {
    if (half_format(W.dtype)) pack_halves_z(rows, ld, nr, q0, nq, dst, W.dtype == DType::kF16);
    else pack_units_z(rows, ld, nr, q0, nq, dst);
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
