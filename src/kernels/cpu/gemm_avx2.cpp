// AVX2/FMA linear layer: y[M, N] = x[M, K] · W[N, K]ᵀ + bias.
//
// Large M (packed GEMM, BLIS-style):
//   for each NC-wide slab of W rows (output columns) owned by this thread:
//     for each KC-deep slice of K:
//       pack W[nc, kc] into 16-column panels Bp[panel][kc][16] (converting bf16/f16 → f32), so
//       the micro-kernel streams contiguous f32 and the conversion cost is paid once per M rows;
//       for each block of MC = 48 rows of x: for each panel: for every 6-row sliver of the
//       block: 6×16 FMA micro-kernel, accumulating in y.
//   KC×NC = 256×256 floats = 256 KB keeps the packed slab in L2 (512 KB); a KC×16 panel (16 KB)
//   stays in L1 while the block's slivers (48 KB of x) stream from L2 over it. The panel is
//   what the micro-kernel reads most (64 B per k against 24 B of x): with the sliver outside
//   the panel loop instead, every panel came from L2 and the GEMM ran at 77 % of the FMA peak
//   on Zen 2, against 88-90 % so. Threads take N slabs dynamically (each slab packed once, so
//   no redundant conversion); when N is too narrow they split M instead.
// Small M (≤ 4, e.g. GEMV when decoding): memory-bound, so no packing — each W row is converted
//   on the fly and dotted with the M rows of x while it is in registers.
// Quantized weights (kQ8Row, kQ4G64, f8, ggml blocks) are expanded to f32 once per slab, one K
//   slice at a time just before it is packed (Q4_G64 with the AVX2 unpack of q4_unpack.h, Q8_G64
//   with q8_unpack.h, F8_E4M3_SCALED with f8_unpack.h, the others through the format table's
//   row_to_f32).
#include <algorithm>
#include <atomic>
#include <vector>

#include "core/format.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/avx2_kernels.h"
#include "kernels/cpu/f8_unpack.h"
#include "kernels/cpu/q4_unpack.h"
#include "kernels/cpu/q8_unpack.h"

namespace klein::kernels::avx2 {
namespace {

constexpr int64_t kKC = 256;  // K depth of a packed slice
constexpr int64_t kNC = 256;  // output columns per packed slab (multiple of kNR)
constexpr int64_t kGemvMaxM = 4;
constexpr int64_t kMC = 48;   // rows of x per block over which a panel is reused (multiple of kMR)

// The element types load8_f32 widens in registers; other formats are expanded row-wise first.
bool is_plain(DType dt) { return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16; }

// A row-major [rows, ld] matrix of f32/bf16/f16 elements.
struct Mat {
  const uint8_t* base;
  DType dt;
  size_t esz;  // bytes per element
  int64_t ld;  // row stride in elements
  const uint8_t* at(int64_t r, int64_t c) const { return base + (r * ld + c) * esz; }
};

// dst[kc][16]: dst[k*16 + j] = src(row0 + j, col0 + k) for j < nr, 0 for nr ≤ j < 16.
// Full 8-row groups go through an 8×8 register transpose; the (rare) partial group is scalar.
void pack_panel(const Mat& s, int64_t row0, int64_t col0, int nr, int64_t kc, float* dst) {
  for (int g = 0; g < 2; ++g) {
    float* d = dst + g * 8;
    const int rows = std::clamp(nr - g * 8, 0, 8);
    if (rows < 8) {
      for (int64_t k = 0; k < kc; ++k)
        for (int i = 0; i < 8; ++i)
          d[k * kNR + i] = i < rows ? load1_f32(s.at(row0 + g * 8 + i, col0 + k), s.dt) : 0.0f;
      continue;
    }
    const uint8_t* rp[8];
    for (int i = 0; i < 8; ++i) rp[i] = s.at(row0 + g * 8 + i, col0);
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
      const size_t off = k * s.esz;
      __m256 r0 = load8_f32(rp[0] + off, s.dt), r1 = load8_f32(rp[1] + off, s.dt);
      __m256 r2 = load8_f32(rp[2] + off, s.dt), r3 = load8_f32(rp[3] + off, s.dt);
      __m256 r4 = load8_f32(rp[4] + off, s.dt), r5 = load8_f32(rp[5] + off, s.dt);
      __m256 r6 = load8_f32(rp[6] + off, s.dt), r7 = load8_f32(rp[7] + off, s.dt);
      transpose8(r0, r1, r2, r3, r4, r5, r6, r7);  // now r_i = column k+i of the 8 rows
      float* o = d + k * kNR;
      _mm256_storeu_ps(o + 0 * kNR, r0);
      _mm256_storeu_ps(o + 1 * kNR, r1);
      _mm256_storeu_ps(o + 2 * kNR, r2);
      _mm256_storeu_ps(o + 3 * kNR, r3);
      _mm256_storeu_ps(o + 4 * kNR, r4);
      _mm256_storeu_ps(o + 5 * kNR, r5);
      _mm256_storeu_ps(o + 6 * kNR, r6);
      _mm256_storeu_ps(o + 7 * kNR, r7);
    }
    for (; k < kc; ++k)
      for (int i = 0; i < 8; ++i) d[k * kNR + i] = load1_f32(rp[i] + k * s.esz, s.dt);
  }
}

// y[m0:m1, n0:n1] over the whole K. bias: [≥ round_up(N, 16)] f32 (zero padded) or null.
void gemm_block(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K, const Weight& W,
                int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  static thread_local Scratch pack_buf, conv_buf;
  const int64_t kc_max = std::min(kKC, K);
  float* bp = pack_buf.get(kc_max * kNC);  // [kNC/16][kc][16]
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kNC) {
    const int64_t ncn = std::min(kNC, n1 - nc0);
    // Rows of this slab, W[nc0 : nc0 + ncn, :]. Quantized rows are expanded to f32 one K slice at a
    // time, just before that slice is packed: each element once per slab as before, in a [ncn, kKC]
    // buffer (256 KB) rather than whole rows (256 × K floats: 12.6 MB at K = 12288).
    const bool plain = is_plain(W.dtype);
    const size_t esz = plain ? dtype_size(W.dtype) : 4;
    const int64_t np = (ncn + kNR - 1) / kNR;
    for (int64_t kc0 = 0; kc0 < K; kc0 += kKC) {
      const int64_t kcn = std::min(kKC, K - kc0);
      Mat src;
      int64_t col0 = kc0;
      if (plain) {
        src = {static_cast<const uint8_t*>(W.data) + nc0 * K * esz, W.dtype, esz, K};
      } else {
        float* conv = conv_buf.get(ncn * kc_max);
        const auto row_to_f32 = format_traits(W.dtype).row_to_f32;
        for (int64_t j = 0; j < ncn; ++j) {
          float* o = conv + j * kcn;
          if (W.dtype == DType::kQ4G64) q4g64_row_avx2(W, nc0 + j, kc0, kcn, o);  // q4_unpack.h
          else if (W.dtype == DType::kF8E4M3Scaled) f8scaled_row_avx2(W, nc0 + j, kc0, kcn, o);  // f8_unpack.h
          else if (W.dtype == DType::kQ8G64) q8g64_row_avx2(W, nc0 + j, kc0, kcn, o);  // q8_unpack.h
          else row_to_f32(W, nc0 + j, kc0, kcn, o);
        }
        src = {reinterpret_cast<const uint8_t*>(conv), DType::kF32, 4, kcn};
        col0 = 0;
      }
      for (int64_t p = 0; p < np; ++p)
        pack_panel(src, p * kNR, col0, static_cast<int>(std::min<int64_t>(kNR, ncn - p * kNR)),
                   kcn, bp + p * kcn * kNR);
      const bool acc = kc0 > 0;  // later K slices add onto the partial sums already in y
      // Per block of kMC rows, each 16 KB panel stays in L1 while the block's slivers pass over it.
      for (int64_t mb = m0; mb < m1; mb += kMC) {
        const int64_t me = std::min(m1, mb + kMC);
        for (int64_t p = 0; p < np; ++p) {
          const int64_t n = nc0 + p * kNR;
          const int cols = static_cast<int>(std::min<int64_t>(kNR, ncn - p * kNR));
          const float* init = (!acc && bias) ? bias + n : nullptr;
          for (int64_t m = mb; m < me; m += kMR) {
            const int rows = static_cast<int>(std::min<int64_t>(kMR, me - m));
            const float* a = x + m * ldx + kc0;
            float* c = y + m * ldy + n;
            if (cols == kNR)
              ukernel_rows(rows, a, ldx, bp + p * kcn * kNR, kNR, kcn, c, ldy, acc, init);
            else
              ukernel_edge(rows, cols, a, ldx, bp + p * kcn * kNR, kNR, kcn, c, ldy, acc, init);
          }
        }
      }
    }
  }
}

// out[r] = dot(x row r, w) for r < R; w is K elements of dtype dt (f32/bf16/f16).
template <int R>
void gemv_rows(const float* x, int64_t ldx, const uint8_t* w, DType dt, size_t esz, int64_t K,
               float* out) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 w0 = load8_f32(w + k * esz, dt), w1 = load8_f32(w + (k + 8) * esz, dt);
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k), w0, a0[r]);
      a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k + 8), w1, a1[r]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 w0 = load8_f32(w + k * esz, dt);
    for (int r = 0; r < R; ++r) a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k), w0, a0[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(a0[r], a1[r]));
    for (int64_t kk = k; kk < K; ++kk) s += x[r * ldx + kk] * load1_f32(w + kk * esz, dt);
    out[r] = s;
  }
}

void gemv(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
          ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  const bool plain = is_plain(W.dtype);
  pool.parallel_for(
      N,
      [&](int64_t nb, int64_t ne) {
        static thread_local Scratch row_buf;
        float* conv = plain ? nullptr : row_buf.get(K);  // [K]
        for (int64_t n = nb; n < ne; ++n) {
          const uint8_t* w;
          DType dt = W.dtype;
          if (plain) {
            w = static_cast<const uint8_t*>(W.data) + n * K * dtype_size(dt);
          } else {
            if (W.dtype == DType::kQ4G64) q4g64_row_avx2(W, n, 0, K, conv);
            else if (W.dtype == DType::kF8E4M3Scaled) f8scaled_row_avx2(W, n, 0, K, conv);
            else if (W.dtype == DType::kQ8G64) q8g64_row_avx2(W, n, 0, K, conv);
            else weight_row_to_f32(W, n, conv);
            w = reinterpret_cast<const uint8_t*>(conv);
            dt = DType::kF32;
          }
          const size_t esz = dtype_size(dt);
          float out[kGemvMaxM];
          switch (M) {
            case 4: gemv_rows<4>(x, ldx, w, dt, esz, K, out); break;
            case 3: gemv_rows<3>(x, ldx, w, dt, esz, K, out); break;
            case 2: gemv_rows<2>(x, ldx, w, dt, esz, K, out); break;
            default: gemv_rows<1>(x, ldx, w, dt, esz, K, out); break;
          }
          const float b = bias ? bias[n] : 0.0f;
          for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = out[m] + b;
        }
      },
      /*grain=*/64);
}

}  // namespace

void linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32,
            float* y, ThreadPool& pool, int64_t ldx, int64_t ldy) {
  const int64_t N = W.rows();
  if (M <= kGemvMaxM) {
    gemv(x, M, K, W, bias_f32, y, pool, ldx, ldy);
    return;
  }
  // The micro-kernel reads 16 bias values per panel, so pad the tail panel with zeros.
  std::vector<float> bias_pad;
  if (bias_f32) {
    bias_pad.assign((N + kNR - 1) / kNR * kNR, 0.0f);
    std::copy(bias_f32, bias_f32 + N, bias_pad.begin());
  }
  const float* bias = bias_f32 ? bias_pad.data() : nullptr;

  const int nt = pool.size();
  const int64_t panels = (N + kNR - 1) / kNR;
  if (nt == 1 || (panels < nt && M < 2 * kMR * nt)) {
    gemm_block(x, ldx, 0, M, K, W, 0, N, bias, y, ldy);
  } else if (panels >= 8 * nt || M < 4 * kMR * nt) {
    // Split N into slabs handed out dynamically: each slab of W is packed and converted by
    // exactly one thread, and a thread that gets less CPU (shared machine) simply takes fewer
    // slabs. Slabs are ≤ kNC wide and narrow enough to give every thread at least two.
    const int64_t width = std::min<int64_t>(kNC, (N + 2 * nt * kNR - 1) / (2 * nt * kNR) * kNR);
    const int64_t slabs = (N + width - 1) / width;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      for (int64_t sl; (sl = next.fetch_add(1, std::memory_order_relaxed)) < slabs;)
        gemm_block(x, ldx, 0, M, K, W, sl * width, std::min(N, (sl + 1) * width), bias, y, ldy);
    });
  } else {
    // Narrow W, tall x: split M in whole 6-row slivers; each thread packs all of (small) W.
    const int64_t slivers = (M + kMR - 1) / kMR;
    pool.run([&](int t, int n) {
      const int64_t sb = slivers * t / n, se = slivers * (t + 1) / n;
      if (sb < se) gemm_block(x, ldx, sb * kMR, std::min(M, se * kMR), K, W, 0, N, bias, y, ldy);
    });
  }
}

}  // namespace klein::kernels::avx2
