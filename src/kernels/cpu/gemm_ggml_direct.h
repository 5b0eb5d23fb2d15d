// The driver of the fast GGUF linear (ggml block weights under Precision::kFast; arithmetic:
// kernels/ggml_dot.h, ref::linear_ggml), shared by the AVX2 and AVX512_VNNI kernels
// (gemm_ggml_avx2.cpp, gemm_ggml_avx512vnni.cpp). As the W4A8 direct driver
// (gemm_w4a8_direct.h) the tile computes yᵀ: its vector lanes run along M and it broadcasts
// 4-byte units of weight rows, so a slab of weight rows is decoded once (row after row, in
// order) into int8 codes and per-sub-block scales, stays in L2, and every block of activation
// rows passes over it.
//
//   1. x is quantized per block as ggml_dot::quantize_act, into blocks of UK::kMR rows stored
//      [K/4][kMR] 4-byte units (bytes XOR UK::kActXor: 0x80 gives u8 = q + 128 for vpdpbusd),
//      and per sub-block [S][kMR]: the activation scale dx, xs = dx · Σq (mins formats) and
//      off · Σq (kOffset formats, for the AVX2 kernel's unsigned codes).
//   2. Threads take work items of columns (split_gemm). Per slab of weight rows (≤ a quarter of
//      L2 decoded): ggml_dot::unpack_row, then UK::prep_row (the ISA's byte form and a per
//      sub-block int32 start), scales and offsets stored sub-block-major [S][SL]; the next slab's
//      blocks are prefetched into L2 over this one's tiles.
//   3. Per kMR-row block of x, across the slab's kNC-row tiles, over the whole K:
//      UK::tile<NC, SUBU, KIND> (SUBU = units per sub-block: 4 or 8).
//
// Include ONLY from the gemm_ggml_*.cpp files: everything has internal linkage.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "core/weight.h"
#include "kernels/cpu/gemm_direct.h"
#include "kernels/cpu/gemm_units.h"
#include "kernels/ggml_dot.h"

namespace klein::kernels {
namespace {

struct GgmlAct {
  const uint32_t* qa;    // [blocks][K/4][kMR] units
  const float* dx;       // [blocks][S][kMR] activation scales (0 for pad rows)
  const float* xs;       // [blocks][S][kMR] dx · Σq
  const int32_t* ioff;   // [blocks][S][kMR] off · Σq
};

// Step 1 for all M rows (pad rows of the last block: q = 0, scales 0).
template <class UK>
void ggml_quantize(const ggml_dot::Form& f, const float* x, int64_t M, int64_t K, int64_t ldx, ThreadPool& pool,
                   uint32_t* qa, float* dx, float* xs, int32_t* ioff) {
  constexpr int MR = UK::kMR;
  const int64_t KQ = K / 4, S = K / f.sub, blocks = (M + MR - 1) / MR;
  const uint32_t pad = UK::kActXor * 0x01010101u;
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    std::vector<int8_t> q(K);
    std::vector<float> d(S), s(S);
    std::vector<int32_t> bs(S);
    for (int64_t b = b0; b < b1; ++b)
      for (int r = 0; r < MR; ++r) {
        const int64_t m = b * MR + r;
        uint32_t* ua = qa + b * KQ * MR + r;
        float* db = dx + b * S * MR + r;
        float* sb = xs + b * S * MR + r;
        int32_t* ib = ioff + b * S * MR + r;
        if (m >= M) {
          for (int64_t u = 0; u < KQ; ++u) ua[u * MR] = pad;
          for (int64_t j = 0; j < S; ++j) db[j * MR] = 0.0f, sb[j * MR] = 0.0f, ib[j * MR] = 0;
          continue;
        }
        ggml_dot::quantize_act(f, x + m * ldx, K, q.data(), d.data(), s.data(), bs.data());
        for (int64_t u = 0; u < KQ; ++u) {
          uint32_t v;
          std::memcpy(&v, q.data() + u * 4, 4);
          ua[u * MR] = v ^ pad;
        }
        for (int64_t j = 0; j < S; ++j) db[j * MR] = d[j], sb[j * MR] = s[j], ib[j * MR] = f.off * bs[j];
      }
  }, 1);
}

// y[m0:m1, n0:n1] (m0 % UK::kMR == 0).
template <class UK>
void ggml_direct_block(const GgmlAct& act, const ggml_dot::Form& f, int64_t m0, int64_t m1, int64_t K,
                       const Weight& W, int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int MR = UK::kMR, NC = UK::kNC;
  const int64_t S = K / f.sub, KQ = K / 4, RB = W.row_bytes();
  const int64_t ldw = spread_stride(K);  // the tile streams NC rows at once
  const int64_t SL = std::clamp<int64_t>(direct_slab_bytes() / ldw / NC * NC, NC, UK::kSlabMax);
  static thread_local UnitScratch wu_buf, sc_buf, ns_buf;
  uint8_t* wu = wu_buf.get<uint8_t>(SL * ldw);
  float* fw = sc_buf.get<float>(2 * S * SL + 2 * S);  // fw, o [S][SL]; row scratch tf, to [S]
  float* o = fw + S * SL;
  float* tf = o + S * SL;
  float* to = tf + S;
  int32_t* nsum = ns_buf.get<int32_t>(S * SL + S);  // [S][SL]; row scratch tn [S]
  int32_t* tn = nsum + S * SL;
  std::fill(to, to + S, 0.0f);
  for (int64_t sb = n0; sb < n1; sb += SL) {
    const int64_t sn = std::min(SL, n1 - sb);
    for (int64_t j = 0; j < sn; ++j) {
      int8_t* row = reinterpret_cast<int8_t*>(wu + j * ldw);
      ggml_dot::unpack_row(W, sb + j, row, tf, to);
      UK::prep_row(row, K, f, tn);
      for (int64_t s = 0; s < S; ++s) fw[s * SL + j] = tf[s], o[s * SL + j] = to[s], nsum[s * SL + j] = tn[s];
    }
    const int64_t next = std::clamp<int64_t>(n1 - sb - SL, 0, SL);
    const int64_t tiles = ((m1 - m0 + MR - 1) / MR) * ((sn + NC - 1) / NC);
    const auto* base = static_cast<const uint8_t*>(W.data);
    SlicePrefetch pf(base + (next > 0 ? (sb + SL) * RB : 0), RB, next, RB, tiles * S);
    for (int64_t m = m0; m < m1; m += MR) {
      const int64_t b = m / MR;
      const int rows = static_cast<int>(std::min<int64_t>(MR, m1 - m));
      for (int64_t nb = 0; nb < sn; nb += NC)
        with_cols<NC>(static_cast<int>(std::min<int64_t>(NC, sn - nb)), [&](auto nc) {
          UK::template run<nc()>(f, act.qa + b * KQ * MR, wu + nb * ldw, ldw, S, SL, fw + nb, o + nb, nsum + nb,
                                 act.dx + b * S * MR, act.xs + b * S * MR, act.ioff + b * S * MR, &pf,
                                 bias ? bias + sb + nb : nullptr, y + m * ldy + sb + nb, ldy, rows);
        });
    }
  }
}

// The whole linear (kernels.h semantics) of a ggml block weight with UK.
template <class UK>
void ggml_direct_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y,
                        ThreadPool& pool, int64_t ldx, int64_t ldy) {
  constexpr int MR = UK::kMR;
  ggml_dot::Form f;
  ggml_dot::form_of(W.dtype, &f);  // the registry routes only ggml block formats here
  const int64_t KQ = K / 4, S = K / f.sub, blocks = (M + MR - 1) / MR;
  static thread_local UnitScratch qa_buf, dx_buf, xs_buf, io_buf;  // grow-only, reused between calls
  uint32_t* qa = qa_buf.get<uint32_t>(blocks * KQ * MR);
  float* dx = dx_buf.get<float>(blocks * S * MR);
  float* xs = xs_buf.get<float>(blocks * S * MR);
  int32_t* io = io_buf.get<int32_t>(blocks * S * MR);
  ggml_quantize<UK>(f, x, M, K, ldx, pool, qa, dx, xs, io);
  const GgmlAct act{qa, dx, xs, io};
  split_gemm(M, W.rows(), MR, UK::kNC, UK::kItem, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    ggml_direct_block<UK>(act, f, m0, m1, K, W, n0, n1, bias, y, ldy);  // m0 % MR == 0
  });
}

}  // namespace
}  // namespace klein::kernels
