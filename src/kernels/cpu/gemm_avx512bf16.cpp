// AVX512_BF16 linear layer (Precision::kFast): y = bf16(x) · bf16(W)ᵀ + bias with float32 sums.
//
// vdpbf16ps multiplies pairs of bf16 and adds both products into a float32 lane, so one 4-byte
// unit = two consecutive k of one row. Two drivers:
//   - BF16 weights with an even K (the real model's): gemm_direct.h, the rows read in place and a
//     32-row × 12-column yᵀ tile over the whole K (Bf16Direct below). Against the packing form
//     (Zen 4, 2 threads, the DiT's shapes): 72-89 → 89-94 % of the vdpbf16ps peak at M = 768, with
//     the weights evicted before each call 69-90 → 86-93 %; a bf16 + fast 256² image 60.4-62.9 →
//     55.4-55.6 s (denoising -10 %): the pack's cold row loads were 6.7 % of its samples.
//   - Other formats (f32 / f16 rounded per K slice, bf16 with an odd K): the packing GEMM of
//     gemm_avx512_common.h (panels and 14×32 tiles, as the fp32 kernel).
// Per call, x is rounded to bf16 once (round-to-nearest-even, as torch's .to(bfloat16), by
// vcvtne2ps2bf16, whose flushing of denormal inputs the products do anyway: avx512_convert.h). An odd K gets a zero high half in its last pair on both sides.
//
// Numerics: the products of two bf16 are exact in float32; the instruction adds them into the
// accumulator with round-to-nearest-even and treats denormal inputs and outputs as zero (SDM), so
// the result equals ref::linear_bf16 (double sums of the same rounded operands) up to float32
// summation error (whose order differs between the two drivers).
#include <vector>

#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/avx512bf16_dot.h"
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_direct.h"
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

// BF16 weights with an even K (the real model's) on gemm_direct.h's driver: the weight rows
// read in place (bf16 pairs as stored), the tile yᵀ, as the VNNI W8A8 kernel. A tile is 32 rows
// × 12 columns: per pair unit of K, two zmm of activations (32 rows, x rounded to bf16 and
// transposed once per call) and 12 broadcast weight units, 24 vdpbf16ps into 24 float32
// accumulators over the whole K; the epilogue adds the bias and transposes into rows of y.
struct Bf16Direct {
  static constexpr int kMR = 32, kNC = 12;
  static constexpr int kElemBytes = 2;  // bf16 weights: no row sums, no scales
  static constexpr int kAPf = 32;       // activation units prefetched ahead (as the W8A8 tile)

  static void quantize_row(const float* x, int64_t K, int64_t, uint8_t* q, float* s) {
    f32_to_bf16_row_ftz(x, K, reinterpret_cast<uint16_t*>(q));  // x only feeds vdpbf16ps
    *s = 1.0f;
  }
  static void pack_rows(const uint8_t* rows_, int64_t ld, int rows, int64_t nq, uint32_t* qa) {
    pack_units_z(rows_, ld, rows, 0, nq, qa);
  }

  template <int NC>
  __attribute__((noinline)) static void tile(const uint32_t* a, const uint8_t* w, int64_t ldw, int64_t nq,
                                             SlicePrefetch* pf, const int32_t*, const float*, const float*,
                                             const float* bias, float* y, int64_t ldy, int rows) {
    KLEIN_YT_ROW_POINTERS(w)
    KLEIN_YT_ACCUMULATORS(__m512, _mm512_setzero_ps())
#define KLEIN_B_COL(j, p, off)                                                                   \
  if constexpr (NC > j) {                                                                        \
    const __m512 bv = Bf16Dot::bcast(reinterpret_cast<const uint32_t*>(p + off));                \
    c##j##_0 = Bf16Dot::madd(c##j##_0, a0, bv);                                                  \
    c##j##_1 = Bf16Dot::madd(c##j##_1, a1, bv);                                                  \
  }
    auto step = [&] {
      _mm_prefetch(reinterpret_cast<const char*>(a + kAPf * kMR), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a + kAPf * kMR + 16), _MM_HINT_T0);
      const __m512 a0 = _mm512_castsi512_ps(_mm512_loadu_si512(a)), a1 = _mm512_castsi512_ps(_mm512_loadu_si512(a + 16));
      KLEIN_YT_COLUMNS(KLEIN_B_COL)
      a += kMR;
      w0 += 4, w3 += 4, w6 += 4, w9 += 4;
    };
#undef KLEIN_B_COL
    yt_units(nq, pf, step);
    __m512i r[2][16] = {};  // columns past NC: zeros, not stored
#define KLEIN_B_OUT(j)                                                                                  \
  if constexpr (NC > j) {                                                                               \
    const __m512 bv = _mm512_set1_ps(bias ? bias[j] : 0.0f);                                            \
    r[0][j] = _mm512_castps_si512(_mm512_add_ps(c##j##_0, bv));                                         \
    r[1][j] = _mm512_castps_si512(_mm512_add_ps(c##j##_1, bv));                                         \
  }
    KLEIN_B_OUT(0) KLEIN_B_OUT(1) KLEIN_B_OUT(2) KLEIN_B_OUT(3) KLEIN_B_OUT(4) KLEIN_B_OUT(5)
    KLEIN_B_OUT(6) KLEIN_B_OUT(7) KLEIN_B_OUT(8) KLEIN_B_OUT(9) KLEIN_B_OUT(10) KLEIN_B_OUT(11)
#undef KLEIN_B_OUT
    yt_store(r, rows, NC, y, ldy);
  }

};

}  // namespace

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy) {
  if (W.dtype == DType::kBF16 && K % 2 == 0) {  // the stored rows are already bf16 pairs
    direct_linear<Bf16Direct>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
    return;
  }
  const int64_t KU = (K + 1) / 2;
  // Rows lda units apart: a stride of a multiple of 2 KB would make zgemm copy every sliver
  // (gemm_avx512_common.h), so such rows get one more cache line.
  const int64_t lda = spread_stride(KU * 4) / 4;
  std::vector<uint16_t> xa(M * lda * 2);  // [M, lda] bf16 pairs of x
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      uint16_t* d = xa.data() + m * lda * 2;
      f32_to_bf16_row_ftz(x + m * ldx, K, d);
      if (K % 2) d[K] = 0;
    }
  }, 16);
  zgemm<Bf16Op>(reinterpret_cast<const uint32_t*>(xa.data()), lda, M, KU, W, bias_f32, y, pool, ldy);
}

// The fused SwiGLU on the direct driver: BF16 weights with an even K (else false: the packing
// GEMM and silu_mul).
bool linear_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                   ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn silu_mul) {
  if (W.dtype != DType::kBF16 || K % 2 != 0) return false;
  direct_linear<Bf16Direct>(x, M, K, W, bias_f32, out, pool, ldx, ldo, silu_mul);
  return true;
}

}  // namespace klein::kernels::avx512bf16
