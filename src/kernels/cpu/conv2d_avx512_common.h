// The AVX-512 conv2d driver, written once over the unit type of gemm_avx512_common.h's 14×32 zmm
// micro-kernel: conv2d_avx512.cpp instantiates it with one float per unit (F32Dot, exact),
// conv2d_avx512bf16.cpp with a pair of bf16 per unit (Bf16Dot, Precision::kFast).
//
// As the AVX2 conv (conv2d_avx2.cpp) it is an implicit GEMM  out[Cout, P] (+)= Wf[Cout, K] ·
// col[K, P]  over tasks of (a block of 256 output pixels) × (a range of Cout rows), handed out
// dynamically. Per task and per slice of kKCU units of K:
//   - pack the block's im2col panels [8 panels][kcu][32 units] (conv2d_pack.h). For bf16 the
//     float32 panels are packed 32 k at a time into a small buffer (32 KB, L1) and rounded into
//     pairs (k even in the low half), so the transformed input is rounded exactly once per use;
//   - for every sliver of ≤ 14 weight rows (rows as bf16 pairs or float, prepared once per call):
//     the 14×32 micro-kernel against each panel, accumulating into the NCHW output in place
//     (its rows are contiguous in the pixel index; masked stores cover a last partial panel).
// The output block is first set to the bias (or has it added, when accumulating). Convs with a
// handful of output channels and stride 1 (the decoder's final 128 → 3) go to the AVX2 conv's
// direct path: there the GEMM would pack Cin·kh·kw values per pixel for ≤ 6 FMAs each. That path
// is float32 in both instantiations: it is a small share of the time, and the conv that makes the
// RGB output keeps full precision.
// Memory: the weight as units (Cout·K floats or bf16) + 256 KB of panels (+ 32 KB) per thread.
//
// Include ONLY from conv2d_avx512*.cpp (internal linkage, as gemm_avx512_common.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/conv2d_kernels.h"
#include "kernels/cpu/conv2d_pack.h"
#include "kernels/cpu/gemm_avx512_common.h"

namespace klein::kernels {
namespace {

constexpr int64_t kConvZNB = kConvMaxBlock;  // output pixels per task: 8 panels of 32
constexpr int64_t kConvZKCU = 256;           // units of K per packed slice
constexpr int64_t kConvZSub = 32;            // k per float32 packing step of the bf16 path

// k per unit: 1 for float32, 2 for a bf16 pair.
template <class Dot>
constexpr int64_t conv_k_per_unit() {
  return std::is_same_v<typename Dot::A, float> ? 1 : 2;
}

// Storage of the weight as units: float32, or bf16 halves of the pairs.
template <class Dot>
using ConvWeightBuf = std::vector<std::conditional_t<conv_k_per_unit<Dot>() == 1, float, uint16_t>>;

// The weight as units [Cout][KU]: float32 rows (in place for an F32 weight), or bf16 pairs with
// a zero high half in the last pair of an odd K. Returns the pointer; `buf` owns any copy.
template <class Dot>
const typename Dot::A* conv_weight_units(const Weight& w, int64_t Cout, int64_t K, ConvWeightBuf<Dot>& buf,
                                         ThreadPool& pool) {
  if constexpr (conv_k_per_unit<Dot>() == 1) {
    if (w.dtype == DType::kF32) return static_cast<const float*>(w.data);
    buf.resize(static_cast<size_t>(Cout * K));
    pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) weight_row_f32(w, r, K, buf.data() + r * K);
    });
    return buf.data();
  } else {
    const int64_t KU = (K + 1) / 2;
    buf.resize(static_cast<size_t>(Cout * KU * 2));
    pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
      static thread_local UnitScratch row;
      float* f = row.get<float>(K);
      for (int64_t r = b; r < e; ++r) {
        uint16_t* d = buf.data() + r * KU * 2;
        weight_row_f32(w, r, K, f);
        f32_to_bf16_row(f, K, d);
        if (K % 2) d[K] = 0;
      }
    });
    // Read back only through Bf16Dot::bcast's memcpy, as the bf16 GEMM reads its pairs.
    return reinterpret_cast<const uint32_t*>(buf.data());
  }
}

// Units [q0, q0 + kcu) of the block's panels into bp[j][kcu][32]; k0 = q0 · k_per_unit and kc the
// k values that exist there (kc < kcu·k_per_unit only at the end of an odd K).
template <class Dot>
void conv_pack_units(const ConvGeom& g, int64_t pix0, int64_t nb, int64_t k0, int64_t kc, int64_t kcu,
                     uint32_t* bp, float* sub) {
  if constexpr (conv_k_per_unit<Dot>() == 1) {
    pack_block<kZNR>(g, pix0, nb, k0, kc, reinterpret_cast<float*>(bp));
  } else {
    const int64_t n_panel = (nb + kZNR - 1) / kZNR;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t s = 0; s < kc; s += kConvZSub) {
      const int64_t ck = std::min(kConvZSub, kc - s);
      pack_block<kZNR>(g, pix0, nb, k0 + s, ck, sub);  // sub[j][ck][32] floats
      for (int64_t j = 0; j < n_panel; ++j) {
        const float* src = sub + j * ck * kZNR;
        uint32_t* d = bp + (j * kcu + s / 2) * kZNR;
        for (int64_t u = 0; 2 * u < ck; ++u, d += kZNR) {
          const float* lo = src + 2 * u * kZNR;
          const bool has_hi = 2 * u + 1 < ck;
          for (int h = 0; h < kZNR; h += 16) {
            const __m512 hi = has_hi ? _mm512_loadu_ps(lo + kZNR + h) : zero;
            _mm512_storeu_si512(d + h, f32x16x2_to_bf16_pairs(_mm512_loadu_ps(lo + h), hi));
          }
        }
      }
    }
  }
}

template <class Dot>
void conv2d_zmm(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p, ThreadPool& pool) {
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  if (avx2::conv2d_is_direct(Cout, p)) {
    avx2::conv2d(in, N, Cin, H, W, w, bias, out, OH, OW, p, pool);
    return;
  }
  constexpr int64_t kpu = conv_k_per_unit<Dot>();
  const int64_t K = Cin * KH * KW, KU = (K + kpu - 1) / kpu, P = OH * OW;
  ConvWeightBuf<Dot> wbuf;
  const typename Dot::A* wa = conv_weight_units<Dot>(w, Cout, K, wbuf, pool);
  const ConvBias cb = conv_bias(bias, Cout);

  ConvGeom g = conv_geom(Cin, H, W, KH, KW, OH, OW, p);
  const bool use_strip = (g.prologue || g.up) && !g.pointwise;
  const int64_t NB = kConvZNB;
  const int64_t n_pb = (P + NB - 1) / NB;
  // Enough tasks to balance the threads: split Cout into ranges of whole slivers when the
  // image has few pixel blocks (the low-resolution stages).
  const int64_t n_sliver = (Cout + kZMR - 1) / kZMR;
  const int64_t want = 4 * static_cast<int64_t>(pool.size());
  const int64_t n_cc = std::clamp<int64_t>((want + n_pb - 1) / n_pb, 1, n_sliver);
  const int64_t cc_rows = (n_sliver + n_cc - 1) / n_cc * kZMR;
  const int64_t n_tasks = n_pb * n_cc;
  for (int64_t n = 0; n < N; ++n) {
    g.x = in + n * Cin * H * W;
    float* o = out + n * Cout * P;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      static thread_local UnitScratch panel_buf, sub_buf, strip_buf;
      uint32_t* bp = panel_buf.get<uint32_t>(static_cast<size_t>(NB * std::min(kConvZKCU, KU)));
      float* sub = kpu == 2 ? sub_buf.get<float>(static_cast<size_t>(NB * kConvZSub)) : nullptr;
      for (int64_t t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
        const int64_t pb = t / n_cc, cc = t % n_cc;
        const int64_t pix0 = pb * NB, nb = std::min(NB, P - pix0);
        const int64_t c0 = cc * cc_rows, c1 = std::min(Cout, c0 + cc_rows);
        if (c0 >= c1) continue;
        conv_init_rows(o, P, c0, c1, pix0, nb, cb, p.accumulate);
        const int64_t n_panel = (nb + kZNR - 1) / kZNR;
        const Slivers sl(c0, c1, kZMR);
        for (int64_t q0 = 0; q0 < KU; q0 += kConvZKCU) {
          const int64_t kcu = std::min(kConvZKCU, KU - q0);
          const int64_t k0 = q0 * kpu, kc = std::min(kcu * kpu, K - k0);
          if (use_strip)
            conv_pack_units<Dot>(build_pack_strip(g, pix0, nb, k0, kc, strip_buf), pix0, nb, k0, kc, kcu, bp, sub);
          else
            conv_pack_units<Dot>(g, pix0, nb, k0, kc, kcu, bp, sub);
          for (int64_t i = 0; i < sl.n; ++i) {
            const int64_t co = sl.begin(i);
            const typename Dot::A* a = wa + co * KU + q0;
            for (int64_t j = 0; j < n_panel; ++j) {
              const int np = static_cast<int>(std::min<int64_t>(kZNR, nb - j * kZNR));
              zukernel_rows<Dot>(sl.rows(i), a, KU, bp + j * kcu * kZNR, kcu, o + co * P + pix0 + j * kZNR, P,
                                 true, nullptr, np);
            }
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace klein::kernels
