// AVX512_BF16 linear layer (Precision::kFast): y = bf16(x) · bf16(W)ᵀ + bias with float32 sums.
//
// vdpbf16ps multiplies pairs of bf16 and adds both products into a float32 lane, so one 4-byte
// unit = two consecutive k of one row (gemm_avx512_common.h's panels and 14×32 tiles, as the
// fp32 kernel). Per call, x is rounded to bf16 once (round-to-nearest-even, as torch's
// .to(bfloat16): avx512_convert.h) into [M, ceil(K/2)] pairs; BF16 weights with even K are packed
// straight from storage, every other format is expanded to float32 and rounded to bf16 per slab.
// An odd K gets a zero high half in its last pair on both sides.
//
// Numerics: the products of two bf16 are exact in float32; the instruction adds them into the
// accumulator with round-to-nearest-even and treats denormal inputs and outputs as zero (SDM), so
// the result equals ref::linear_bf16 (double sums of the same rounded operands) up to float32
// summation error.
#include <vector>

#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/avx512bf16_dot.h"
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx512bf16 {
namespace {

// pack_units_z for rows of f32 / f16 / bf16 values (ld in bytes) that are not bf16 pairs as
// stored — float formats, or bf16 with an odd K — rounded to bf16 (RNE, as f32_to_bf16) and
// paired while packing: unit u = values 2u (low half) and 2u + 1 (high half), zero past K.
// So these formats need no per-slab copy (256 rows × K, 6 MB at K = 12288, per thread).
inline void pack_pairs_z(const uint8_t* src, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst, DType dt,
                         int64_t K) {
  const auto mask16 = [](int64_t n) { return col_mask(static_cast<int>(std::clamp<int64_t>(n, 0, 16))); };
  pack_panel_z(nr, nq, dst, [&](int j, int64_t q, int) {
    const uint8_t* p = src + j * ld;
    const int64_t e0 = 2 * (q0 + q), n = std::min<int64_t>(32, K - e0);  // values of these units
    if (dt == DType::kBF16)
      return _mm512_maskz_loadu_epi16(n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1, p + e0 * 2);
    __m512 lo, hi;
    if (dt == DType::kF16) {
      lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n), p + e0 * 2));
      hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n - 16), p + (e0 + 16) * 2));
    } else {
      lo = _mm512_maskz_loadu_ps(mask16(n), p + e0 * 4);
      hi = _mm512_maskz_loadu_ps(mask16(n - 16), p + (e0 + 16) * 4);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(f32x16_to_bf16(lo)), f32x16_to_bf16(hi), 1);
  });
}

bool float_format(DType dt) { return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16; }

struct Bf16Op : Bf16Dot {
  // The slab's rows: f32 / f16 / bf16 in place (bf16 with an even K already as pairs; the others
  // rounded and paired per K slice by pack), other formats converted to bf16 pairs [ncn][KU] here.
  static std::pair<const uint8_t*, int64_t> slab(const Weight& W, int64_t nc0, int64_t ncn, int64_t KU,
                                                 UnitScratch& conv) {
    const int64_t K = W.cols();
    if (float_format(W.dtype)) {
      const int64_t ld = K * static_cast<int64_t>(dtype_size(W.dtype));
      return {static_cast<const uint8_t*>(W.data) + nc0 * ld, ld};
    }
    uint16_t* h = conv.get<uint16_t>(ncn * KU * 2);
    static thread_local UnitScratch row;  // one row as float32
    float* f = row.get<float>(K);
    for (int64_t j = 0; j < ncn; ++j) {
      uint16_t* d = h + j * KU * 2;
      weight_row_f32(W, nc0 + j, K, f);
      f32_to_bf16_row(f, K, d);
      if (K < 2 * KU) d[K] = 0;
    }
    return {reinterpret_cast<const uint8_t*>(h), KU * 4};
  }
  static void pack(const uint8_t* rows, int64_t ld, int nr, int64_t q0, int64_t nq, uint32_t* dst, const Weight& W) {
    const int64_t K = W.cols();
    if (!float_format(W.dtype) || (W.dtype == DType::kBF16 && K % 2 == 0))
      pack_units_z(rows, ld, nr, q0, nq, dst);
    else
      pack_pairs_z(rows, ld, nr, q0, nq, dst, W.dtype, K);
  }
};

}  // namespace

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t KU = (K + 1) / 2;
  // Rows lda units apart: a stride of a multiple of 2 KB would make zgemm copy every sliver
  // (gemm_avx512_common.h), so such rows get one more cache line.
  const int64_t lda = spread_stride(KU * 4) / 4;
  std::vector<uint16_t> xa(M * lda * 2);  // [M, lda] bf16 pairs of x
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      uint16_t* d = xa.data() + m * lda * 2;
      f32_to_bf16_row(x + m * ldx, K, d);
      if (K % 2) d[K] = 0;
    }
  }, 16);
  zgemm<Bf16Op>(reinterpret_cast<const uint32_t*>(xa.data()), lda, M, KU, W, bias_f32, y, pool, ldy);
}

}  // namespace klein::kernels::avx512bf16
