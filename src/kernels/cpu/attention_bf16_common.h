// The bf16 flash attention (Precision::kFast) shared by the AVX512_BF16 kernel (vdpbf16ps,
// attention_avx512bf16.cpp) and the AMX one (tile products, attention_amx.cpp): Q·Kᵀ and P·V as
// bf16 products with float32 sums, the online softmax in float32 over key blocks of 128 — ref::attention_bf16's
// arithmetic (see there).
//
// Per kv head, K and V are first rounded to bf16 and laid out as the B panels of
// gemm_avx512_common.h's 14×32 micro-kernel (the AMX tiles read the same units), shared by every query block of the head:
//   Kp[key/32][D/2][32]   unit (d-pair, key): K[key][2d'], K[key][2d'+1]
//   Vp[D/32][Sk/2][32]    unit (key-pair, d):  V[2j][d],   V[2j+1][d]
// (~4·Sk·D bytes, one head at a time). A task is one query head × a block of BQ queries:
//   S[BQ, kBK] = Qs[BQ, D/2 pairs] · Kp    Qs = bf16(q · scale · log2 e): scores in log2 units
//   online softmax per query row (the keys along the lanes): mask, row max, P = 2^(S − m),
//     l = l·corr + ΣP, O·= corr; P rounded to bf16 pairs along the keys is the next A operand
//   O[BQ, D] += P[BQ, kBK/2 pairs] · Vp
// and O / l is stored (zeros for a query that saw no visible key). Every operand of both
// products is thus contiguous: no transposes inside the key loop.
//
// Include ONLY from attention_avx512bf16.cpp / attention_amx.cpp: everything has internal linkage.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "core/attn_mask.h"
#include "core/thread_pool.h"
#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/kernels.h"

namespace klein::kernels {
namespace {


constexpr int64_t kBK = ref::kAttnBf16KeyBlock;  // keys per block: four 32-key panels (the arithmetic: kernels.h)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;

// 2^x for 16 lanes with x ≤ 0 (the softmax after subtracting the max), relative error ≤ 3e-7
// (degree-5 minimax on [-0.5, 0.5]). x ≤ -127, -inf and NaN give exactly 0: max() returns its
// second operand for NaN, and -127's exponent field is 0.
inline __m512 exp2_neg16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3276445e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6755372e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5507135e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022120e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314694e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0000001f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// The operands' layouts and the products over them are the micro-kernels' (Mm below); the rest —
// packing, online softmax, task split — is shared.
struct Args {
  const float *q, *k, *v;
  float* out;
  int64_t Sq, Sk;
  int Hq, Hkv, D;
  float scale;
  AttnMask mask;
  int64_t ldq, ldk, ldv, ldo;
  int64_t bq;   // queries per task
  int64_t DU;   // D/2 rounded up, then to the products' unit multiple: units of a Q / K row
  int64_t SkP;  // Sk rounded up to whole 32-key panels
};

// One kv head's K and V as bf16 B panels (layouts above), keys past Sk and an odd D's last half
// zero.
struct HeadPanels {
  uint32_t* kp;  // [SkP/32][DU][32]
  uint32_t* vp;  // [DP/32][SkP/2][32], DP = D rounded up to 32
};

// Rows [r0, r1) of 32-key panels: K rows → bf16 pairs, transposed to [DU][32] per panel.
void pack_k(const Args& a, const float* kh, int64_t p0, int64_t p1, uint32_t* kp) {
  std::vector<uint16_t> row(a.DU * 2);
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* dst = kp + p * a.DU * kZNR;
    for (int j = 0; j < kZNR; ++j) {
      const int64_t key = p * kZNR + j;
      if (key < a.Sk) {
        f32_to_bf16_row(kh + key * a.ldk, a.D, row.data());
        std::fill(row.begin() + a.D, row.end(), uint16_t{0});
      } else {
        std::fill(row.begin(), row.end(), uint16_t{0});
      }
      for (int64_t u = 0; u < a.DU; ++u) std::memcpy(dst + u * kZNR + j, row.data() + 2 * u, 4);
    }
  }
}

// Key pairs [u0, u1) of every 32-wide d panel of V: units (V[2u][d], V[2u+1][d]).
void pack_v(const Args& a, const float* vh, int64_t u0, int64_t u1, uint32_t* vp) {
  const int64_t DP = (a.D + kZNR - 1) / kZNR * kZNR, SU = a.SkP / 2;
  alignas(64) float lo[kZNR], hi[kZNR];
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t k0 = 2 * u, k1 = 2 * u + 1;
    for (int64_t d0 = 0; d0 < DP; d0 += kZNR) {
      const int n = static_cast<int>(std::clamp<int64_t>(a.D - d0, 0, kZNR));
      for (int t = 0; t < kZNR; ++t) {
        lo[t] = (t < n && k0 < a.Sk) ? vh[k0 * a.ldv + d0 + t] : 0.0f;
        hi[t] = (t < n && k1 < a.Sk) ? vh[k1 * a.ldv + d0 + t] : 0.0f;
      }
      uint32_t* dst = vp + (d0 / kZNR) * SU * kZNR + u * kZNR;
      for (int h = 0; h < kZNR; h += 16)
        _mm512_storeu_si512(dst + h, f32x16x2_to_bf16_pairs(_mm512_load_ps(lo + h), _mm512_load_ps(hi + h)));
    }
  }
}

struct Buffers {
  uint16_t* qs;  // [bq][DU·2]   scaled Q rows as bf16 pairs
  float* s;      // [bq][kBK]    scores, then probabilities
  uint16_t* pb;  // [bq][kBK]    probabilities as bf16 pairs along the keys
  float* o;      // [bq][DP]     unnormalised output
  float* m;      // [bq] running max (log2 units)
  float* l;      // [bq] running sum
};

// Mm supplies scores(a, hp, b, nq, j0, nk): b.s[i][c] = Qs_i · K_{j0+c} for c < nk (rounded up to
// whole 32-key panels), and pv(a, hp, b, nq, j0, nk): b.o[i] += P_i · V[j0 : j0 + nk].
template <class Mm>
void run_task(const Args& a, const HeadPanels& hp, int h, int64_t i0, const Buffers& b) {
  const int64_t DU = a.DU, DP = (a.D + kZNR - 1) / kZNR * kZNR;
  const int64_t nq = std::min(a.bq, a.Sq - i0);
  const float mul = a.scale * kLog2e;
  std::vector<float> tmp(a.D);
  for (int64_t i = 0; i < nq; ++i) {
    const float* src = a.q + (i0 + i) * a.ldq + static_cast<int64_t>(h) * a.D;
    for (int d = 0; d < a.D; ++d) tmp[d] = src[d] * mul;
    uint16_t* dst = b.qs + i * DU * 2;
    f32_to_bf16_row(tmp.data(), a.D, dst);
    std::fill(dst + a.D, dst + DU * 2, uint16_t{0});
  }
  std::fill(b.o, b.o + nq * DP, 0.0f);
  std::fill(b.m, b.m + nq, kNegInf);
  std::fill(b.l, b.l + nq, 0.0f);
  const int64_t kend = a.mask.causal ? std::min(a.Sk, i0 + nq) : a.Sk;
  for (int64_t j0 = 0; j0 < kend; j0 += kBK) {
    const int64_t nk = std::min(kBK, kend - j0);
    if (a.mask.key_valid && std::all_of(a.mask.key_valid + j0, a.mask.key_valid + j0 + nk,
                                        [](uint8_t v) { return v == 0; }))
      continue;  // e.g. a block of padding tokens
    Mm::scores(a, hp, b, nq, j0, nk);  // S[nq, nk] = Qs · Kᵀ
    // Online softmax, one query row at a time (keys along the lanes).
    const int nv = static_cast<int>((nk + 15) / 16);
    for (int64_t i = 0; i < nq; ++i) {
      float* s = b.s + i * kBK;
      const int64_t qi = i0 + i;
      __m512 mx = _mm512_set1_ps(kNegInf);
      for (int v = 0; v < nv; ++v) {
        const int64_t jb = j0 + 16 * v;
        __mmask16 vis = col_mask(static_cast<int>(std::min<int64_t>(16, nk - 16 * v)));
        if (a.mask.causal && jb + 15 > qi)
          vis &= static_cast<__mmask16>(qi - jb >= 15 ? 0xffff : qi < jb ? 0 : (1u << (qi - jb + 1)) - 1);
        if (a.mask.key_valid) {
          const __m128i kv = _mm_maskz_loadu_epi8(vis, a.mask.key_valid + jb);
          vis &= _mm_cmpneq_epi8_mask(kv, _mm_setzero_si128());
        }
        const __m512 x = _mm512_mask_blend_ps(vis, _mm512_set1_ps(kNegInf), _mm512_loadu_ps(s + 16 * v));
        _mm512_storeu_ps(s + 16 * v, x);
        mx = _mm512_max_ps(mx, x);
      }
      const float mold = b.m[i], mnew = std::max(mold, _mm512_reduce_max_ps(mx));
      // Still -inf only when nothing was visible so far; then corr = 2^NaN = 0 keeps O, l at 0.
      const float corr = _mm512_cvtss_f32(exp2_neg16(_mm512_set1_ps(mold - mnew)));
      const __m512 vm = _mm512_set1_ps(mnew);
      __m512 sum = _mm512_setzero_ps();
      for (int v = 0; v < nv; ++v) {
        const __mmask16 in = col_mask(static_cast<int>(std::min<int64_t>(16, nk - 16 * v)));
        const __m512 p = _mm512_maskz_mov_ps(in, exp2_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * v), vm)));
        sum = _mm512_add_ps(sum, p);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.pb + i * kBK + 16 * v), f32x16_to_bf16(p));
      }
      // Zeros up to the next 32 keys: products over whole 32-key steps read them (times V rows
      // that may be real keys past a causal block's end, or zero padding).
      for (int64_t c = 16 * nv; c < std::min<int64_t>(kBK, (nk + 31) / 32 * 32); ++c) b.pb[i * kBK + c] = 0;
      b.m[i] = mnew;
      b.l[i] = b.l[i] * corr + _mm512_reduce_add_ps(sum);
      if (corr != 1.0f) {
        float* o = b.o + i * DP;
        const __m512 vc = _mm512_set1_ps(corr);
        for (int64_t d = 0; d < DP; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), vc));
      }
    }
    // O[nq, D] += P · V[j0 : j0+nk]; P rows are zero from nk to the next 32 keys (above).
    Mm::pv(a, hp, b, nq, j0, nk);
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* dst = a.out + (i0 + i) * a.ldo + static_cast<int64_t>(h) * a.D;
    const float inv = b.l[i] > 0.0f ? 1.0f / b.l[i] : 0.0f;  // no visible key → zeros
    for (int d = 0; d < a.D; ++d) dst[d] = b.o[i * DP + d] * inv;
  }
}


// The whole attention (kernels::attention semantics) with the products of Mm, which also gives
// kUnitAlign (Q / K rows padded to a multiple of that many units), bq(causal) (queries per task)
// and begin() (per-thread set-up before a thread's first task).
template <class Mm>
void attention_bf16_run(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
                        int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool, int64_t ldq, int64_t ldk,
                        int64_t ldv, int64_t ldo) {
  Args a{q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, ldq, ldk, ldv, ldo, 0,
         ((D + 1) / 2 + Mm::kUnitAlign - 1) / Mm::kUnitAlign * Mm::kUnitAlign, (Sk + kZNR - 1) / kZNR * kZNR};
  a.bq = Mm::bq(mask.causal);
  const int64_t DP = (D + kZNR - 1) / kZNR * kZNR;
  std::vector<uint32_t> kp(a.SkP / kZNR * a.DU * kZNR), vp(DP / kZNR * (a.SkP / 2) * kZNR);
  const HeadPanels hp{kp.data(), vp.data()};
  const int group = Hq / Hkv;
  const int64_t nqb = (Sq + a.bq - 1) / a.bq, tasks = nqb * group;
  for (int g = 0; g < Hkv; ++g) {
    const float* kh = k + static_cast<int64_t>(g) * D;
    const float* vh = v + static_cast<int64_t>(g) * D;
    pool.parallel_for(a.SkP / kZNR, [&](int64_t p0, int64_t p1) { pack_k(a, kh, p0, p1, kp.data()); });
    pool.parallel_for(a.SkP / 2, [&](int64_t u0, int64_t u1) { pack_v(a, vh, u0, u1, vp.data()); });
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      Mm::begin();
      static thread_local UnitScratch buf;
      const size_t n_qs = a.bq * a.DU * 2 * 2, n_s = a.bq * kBK * 4, n_pb = a.bq * kBK * 2, n_o = a.bq * DP * 4;
      uint8_t* base = buf.get<uint8_t>(n_qs + n_s + n_pb + n_o + 2 * a.bq * 4 + 4 * 64);
      auto carve = [&](size_t bytes) {
        uint8_t* p = base;
        base += (bytes + 63) / 64 * 64;
        return p;
      };
      Buffers b;
      b.qs = reinterpret_cast<uint16_t*>(carve(n_qs));
      b.s = reinterpret_cast<float*>(carve(n_s));
      b.pb = reinterpret_cast<uint16_t*>(carve(n_pb));
      b.o = reinterpret_cast<float*>(carve(n_o));
      b.m = reinterpret_cast<float*>(carve(a.bq * 4));
      b.l = reinterpret_cast<float*>(carve(a.bq * 4));
      // The last query blocks first: with a causal mask they cost most.
      for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
        const int64_t qblk = nqb - 1 - t % nqb;
        run_task<Mm>(a, hp, g * group + static_cast<int>(t / nqb), qblk * a.bq, b);
      }
    });
  }
}

}  // namespace
}  // namespace klein::kernels
