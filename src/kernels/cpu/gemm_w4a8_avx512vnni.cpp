// AVX512_VNNI W4A8 GEMM for Q4_G64 weights (Precision::kFast; arithmetic: ref::linear_w4a8).
//
// x is quantized per row as the W8A8 kernels do (gemm_int8_common.h: signed int8, sliver-packed
// 4-byte units) and each row's per-group sums X_g = Σ q are kept. The weight nibbles are unpacked
// to bytes 0..15 straight into NR-column panels of 4-byte units, so vpdpbusd takes them as its
// unsigned operand and the int8 activations as the signed one — no +128 shift and no correction.
// Per group of 64 (16 units) a 6×32 tile sums int32 A_g exactly, then folds it into float32
// accumulators: f += s_g · float(A_g) + o_g · X_g (per-column s_g, o_g). After the last K slice,
// y = f · s_x + bias. Registers: 12 int32 + 12 float accumulators, 2 panel vectors, 1 broadcast,
// 4 scale/offset vectors = 31 of 32 (hence 6 rows, not the W8A8 kernel's 12).
//
// Measured (bench_kernels, DiT shapes, 2 threads): this against the bf16-tile alternative
// (the slab unpacked to bf16, then vdpbf16ps) — see tools/bench_kernels.cpp's Q4_G64 rows.
#include "kernels/cpu/gemm_int8_common.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/q4_unpack.h"

namespace klein::kernels::avx512vnni {
namespace {

constexpr int kMR = 6, kNR = 32;
constexpr int64_t kKG = 8;    // groups per K slice: 512 k, a 32-column panel of 16 KB
constexpr int64_t kNC = 256;  // columns per slab

inline __mmask16 lanes(int n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1); }

// c[R×32] = (acc ? c : 0) + Σ_g (s[g] · A_g + o[g] · xs[r][g]) over ng groups; when `sx` is set
// (last slice) then c = c · sx[r] + bias. a: sliver-packed units [ng·16][kMR]; b: panel
// [ng·16][32]; s, o: [ng][32]; xs: row r's group sums at xs + r·ldxs.
template <int R>
__attribute__((noinline)) void tile(const uint32_t* a, const uint32_t* b, int64_t ng, const float* s, const float* o,
                                    const float* xs, int64_t ldxs, float* c, int64_t ldc, bool acc, int cols,
                                    const float* sx, const float* bias) {
  const __mmask16 k0 = lanes(cols), k1 = lanes(cols - 16);
#define KW_DECL(r)                                                   \
  __m512 f##r##_0 = _mm512_setzero_ps(), f##r##_1 = _mm512_setzero_ps(); \
  if (R > r && acc) {                                                \
    f##r##_0 = _mm512_maskz_loadu_ps(k0, c + r * ldc);               \
    f##r##_1 = _mm512_maskz_loadu_ps(k1, c + r * ldc + 16);          \
  }
  KW_DECL(0) KW_DECL(1) KW_DECL(2) KW_DECL(3) KW_DECL(4) KW_DECL(5)
#undef KW_DECL
  for (int64_t g = 0; g < ng; ++g) {
#define KW_IDECL(r) __m512i i##r##_0 = _mm512_setzero_si512(), i##r##_1 = _mm512_setzero_si512();
    KW_IDECL(0) KW_IDECL(1) KW_IDECL(2) KW_IDECL(3) KW_IDECL(4) KW_IDECL(5)
#undef KW_IDECL
    // Fully unrolled: with GCC's default unroll by 2 the 12 accumulators rotated through
    // registers with a vmovdqa64 per vpdpbusd (seen in perf annotate), ~1/3 of the issue slots.
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {
      const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 16);
#define KW_ROW(r)                                                          \
  if constexpr (R > r) {                                                   \
    const __m512i av = _mm512_set1_epi32(static_cast<int>(a[q * kMR + r])); \
    i##r##_0 = _mm512_dpbusd_epi32(i##r##_0, b0, av);                      \
    i##r##_1 = _mm512_dpbusd_epi32(i##r##_1, b1, av);                      \
  }
      KW_ROW(0) KW_ROW(1) KW_ROW(2) KW_ROW(3) KW_ROW(4) KW_ROW(5)
#undef KW_ROW
      b += kNR;
    }
    a += 16 * kMR;
    const __m512 s0 = _mm512_loadu_ps(s + g * kNR), s1 = _mm512_loadu_ps(s + g * kNR + 16);
    const __m512 o0 = _mm512_loadu_ps(o + g * kNR), o1 = _mm512_loadu_ps(o + g * kNR + 16);
#define KW_FOLD(r)                                                    \
  if constexpr (R > r) {                                              \
    const __m512 xv = _mm512_set1_ps(xs[r * ldxs + g]);               \
    f##r##_0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r##_0), s0, f##r##_0); \
    f##r##_1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r##_1), s1, f##r##_1); \
    f##r##_0 = _mm512_fmadd_ps(xv, o0, f##r##_0);                     \
    f##r##_1 = _mm512_fmadd_ps(xv, o1, f##r##_1);                     \
  }
    KW_FOLD(0) KW_FOLD(1) KW_FOLD(2) KW_FOLD(3) KW_FOLD(4) KW_FOLD(5)
#undef KW_FOLD
  }
  const __m512 bb0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
  const __m512 bb1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
#define KW_STORE(r)                                                          \
  if constexpr (R > r) {                                                     \
    if (sx) {                                                                \
      const __m512 sv = _mm512_set1_ps(sx[r]);                               \
      f##r##_0 = _mm512_fmadd_ps(f##r##_0, sv, bb0);                         \
      f##r##_1 = _mm512_fmadd_ps(f##r##_1, sv, bb1);                         \
    }                                                                        \
    _mm512_mask_storeu_ps(c + r * ldc, k0, f##r##_0);                        \
    _mm512_mask_storeu_ps(c + r * ldc + 16, k1, f##r##_1);                   \
  }
  KW_STORE(0) KW_STORE(1) KW_STORE(2) KW_STORE(3) KW_STORE(4) KW_STORE(5)
#undef KW_STORE
}

void tile_rows(int rows, const uint32_t* a, const uint32_t* b, int64_t ng, const float* s, const float* o,
               const float* xs, int64_t ldxs, float* c, int64_t ldc, bool acc, int cols, const float* sx,
               const float* bias) {
  switch (rows) {
    case 6: tile<6>(a, b, ng, s, o, xs, ldxs, c, ldc, acc, cols, sx, bias); break;
    case 5: tile<5>(a, b, ng, s, o, xs, ldxs, c, ldc, acc, cols, sx, bias); break;
    case 4: tile<4>(a, b, ng, s, o, xs, ldxs, c, ldc, acc, cols, sx, bias); break;
    case 3: tile<3>(a, b, ng, s, o, xs, ldxs, c, ldc, acc, cols, sx, bias); break;
    case 2: tile<2>(a, b, ng, s, o, xs, ldxs, c, ldc, acc, cols, sx, bias); break;
    default: tile<1>(a, b, ng, s, o, xs, ldxs, c, ldc, acc, cols, sx, bias); break;
  }
}

// Panel of `nr` ≤ 32 weight rows from row n0, groups [g0, g0 + ng): nibbles → bytes as 4-byte
// units (dst[q][j]), and the rows' scales and offsets per group (s, o [ng][32]); padded columns
// get zero weights, scales and offsets.
void pack_q4_panel(const Weight& W, int64_t n0, int nr, int64_t g0, int64_t ng, uint32_t* dst, float* s, float* o) {
  const int64_t K = W.cols(), G = K / 64;
  alignas(64) uint8_t row[kKG * 64];
  for (int j = 0; j < kNR; ++j) {
    if (j >= nr) {
      for (int64_t q = 0; q < ng * 16; ++q) dst[q * kNR + j] = 0;
      for (int64_t g = 0; g < ng; ++g) s[g * kNR + j] = o[g * kNR + j] = 0.0f;
      continue;
    }
    const uint8_t* src = static_cast<const uint8_t*>(W.data) + (n0 + j) * (K / 2) + g0 * 32;
    for (int64_t h = 0; h < ng * 2; ++h)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + h * 32), q4_spread16(src + h * 16));
    for (int64_t q = 0; q < ng * 16; ++q) std::memcpy(dst + q * kNR + j, row + q * 4, 4);
    for (int64_t g = 0; g < ng; ++g) {
      s[g * kNR + j] = scale_at(W.scales, W.scale_dtype, (n0 + j) * G + g0 + g);
      o[g * kNR + j] = scale_at(W.offsets, W.scale_dtype, (n0 + j) * G + g0 + g);
    }
  }
}

void w4a8_block(const uint32_t* qa, const float* sx, const float* xs, int64_t m0, int64_t m1, int64_t K,
                const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t G = K / 64, KQ = K / 4;
  static thread_local UnitScratch pack_buf, scale_buf;
  uint32_t* bp = pack_buf.get<uint32_t>(kKG * 16 * kNC);
  float* sp = scale_buf.get<float>(2 * kKG * kNC);  // per panel: s [kg][32], o [kg][32]
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kNC) {
    const int64_t ncn = std::min(kNC, n1 - nc0), np = (ncn + kNR - 1) / kNR;
    for (int64_t g0 = 0; g0 < G; g0 += kKG) {
      const int64_t ng = std::min(kKG, G - g0);
      for (int64_t p = 0; p < np; ++p)
        pack_q4_panel(W, nc0 + p * kNR, static_cast<int>(std::min<int64_t>(kNR, ncn - p * kNR)), g0, ng,
                      bp + p * ng * 16 * kNR, sp + p * 2 * ng * kNR, sp + p * 2 * ng * kNR + ng * kNR);
      const bool acc = g0 > 0, last = g0 + ng == G;
      // The next slice's nibbles (32 bytes per group per row), fetched while this one computes.
      SlicePrefetch pf(static_cast<const uint8_t*>(W.data) + nc0 * (K / 2) + (g0 + ng) * 32, K / 2, ncn,
                       std::min(kKG, G - (g0 + ng)) * 32, (m1 - m0 + kMR - 1) / kMR);
      for (int64_t m = m0; m < m1; m += kMR) {
        pf.step();
        const int rows = static_cast<int>(std::min<int64_t>(kMR, m1 - m));
        for (int64_t p = 0; p < np; ++p) {
          const int64_t n = nc0 + p * kNR;
          const float* s = sp + p * 2 * ng * kNR;
          tile_rows(rows, qa + (m / kMR) * KQ * kMR + g0 * 16 * kMR, bp + p * ng * 16 * kNR, ng, s, s + ng * kNR,
                    xs + m * G + g0, G, y + m * ldy + n, ldy, acc,
                    static_cast<int>(std::min<int64_t>(kNR, ncn - p * kNR)), last ? sx + m : nullptr,
                    last && bias ? bias + n : nullptr);
        }
      }
    }
  }
}

}  // namespace

void linear_q4(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t KQ = K / 4, G = K / 64, slivers = (M + kMR - 1) / kMR;  // Q4_G64: K % 64 == 0
  std::vector<uint32_t> qa(slivers * KQ * kMR, 0);  // [slivers][KQ][kMR] int8 units of x
  std::vector<float> sx(M), xs(M * G);                // row scales; per-group sums of q, [M][G]
  pool.parallel_for(slivers, [&](int64_t s0, int64_t s1) {
    std::vector<uint8_t> row(K);
    for (int64_t sl = s0; sl < s1; ++sl)
      for (int64_t m = sl * kMR; m < std::min(M, (sl + 1) * kMR); ++m) {
        quantize_row_avx2(x + m * ldx, K, K, 0, row.data(), &sx[m]);  // signed: no shift
        for (int64_t g = 0; g < G; ++g) {
          int32_t t = 0;
          for (int k = 0; k < 64; ++k) t += static_cast<int8_t>(row[g * 64 + k]);
          xs[m * G + g] = static_cast<float>(t);
        }
        uint32_t* d = qa.data() + sl * KQ * kMR + (m - sl * kMR);
        for (int64_t q = 0; q < KQ; ++q) std::memcpy(d + q * kMR, row.data() + q * 4, 4);
      }
  }, 2);
  split_gemm(M, W.rows(), kMR, kNR, kNC, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    w4a8_block(qa.data(), sx.data(), xs.data(), m0, m1, K, W, n0, n1, bias_f32, y, ldy);  // m0 % kMR == 0
  });
}

}  // namespace klein::kernels::avx512vnni
