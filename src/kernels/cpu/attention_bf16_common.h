// The bf16 flash attention (Precision::kFast) shared by the AVX512_BF16 kernel (vdpbf16ps,
// attention_avx512bf16.cpp) and the AMX one (tile products, attention_amx.cpp): Q·Kᵀ and P·V as
// bf16 products with float32 sums, the online softmax in float32 over key blocks of kBK — ref::attention_bf16's
// arithmetic (see there).
//
// Per kv head, K and V are first rounded to bf16 (as Q and P, by vcvtne(2)ps2bf16: they only feed
// the bf16 products, see avx512_convert.h) and laid out as the B panels of
// gemm_avx512_common.h's 14×32 micro-kernel (the AMX tiles read the same units), shared by every query block of the head:
//   Kp[key/32][D/2][32]   unit (d-pair, key): K[key][2d'], K[key][2d'+1]
//   Vp[D/32][Sk/2][32]    unit (key-pair, d):  V[2j][d],   V[2j+1][d]
// (~4·Sk·D bytes per kv head; all heads are packed in one pass). A task is one query head × a
// block of BQ queries:
//   S[BQ, kBK] = Qs[BQ, D/2 pairs] · Kp    Qs = bf16(q · scale · log2 e): scores in log2 units
//   online softmax per query row (the keys along the lanes): mask, row max, P = 2^(S − m),
//     l = l·corr + ΣP, O·= corr; P rounded to bf16 pairs along the keys is the next A operand
//   O[BQ, D] += P[BQ, kBK/2 pairs] · Vp
// and O / l is stored (zeros for a query that the mask gives no visible key; a NaN score, +inf or
// a row of -inf scores give NaN, as attention_avx2.cpp says). Every operand of both products is
// thus contiguous: no transposes inside the key loop.
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


constexpr int64_t kBK = ref::kAttnBf16KeyBlock;  // keys per block: 32-key panels (the arithmetic: kernels.h)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;

// 2^x for 16 lanes with x ≤ 0 (the softmax after subtracting the max), relative error ≤ 3e-7
// (degree-5 minimax on [-0.5, 0.5]). x < -126.5 (whose 2^n would be denormal) and -inf give
// exactly 0: the zeroing mask drops every such lane, whatever the polynomial made of it (NaN for
// -inf). NaN gives NaN: the mask is "not less than", true for NaN (unordered), so a NaN score
// reaches the output (kernels.h). vscalefps puts n into the exponent in one step (p · 2^n is
// exact for n ≥ -126).
inline __m512 exp2_neg16(__m512 x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.5f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3276445e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6755372e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5507135e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022120e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314694e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0000001f));
  return _mm512_maskz_scalef_ps(normal, p, n);
}

// Probabilities (0 ≤ p ≤ 1, or NaN from a NaN score) → bf16 for the P · V product:
// vcvtneps2bf16 rounds to nearest even as f32_to_bf16 does (a NaN stays NaN), except that it
// flushes a denormal p to zero — which the product's units (tdpbf16ps, vdpbf16ps) do with a
// denormal bf16 input anyway, so the sums are the same. One instruction instead of
// f32x16_to_bf16's integer rounding (~11).
inline __m256i p_to_bf16(__m512 p) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p)); }

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
  int64_t bq;   // queries per sub-block (the products' and the softmax's unit)
  int64_t DU;   // D/2 rounded up, then to the products' unit multiple: units of a Q / K row
  int64_t SkP;  // Sk rounded up to whole 32-key panels
  int64_t kv_end = 0;  // 1 + the last key that key_valid lets any query see (Sk without key_valid)
  int64_t first_key = 0;  // mask.first_key(Sk)
  int64_t nsub = 1;    // sub-blocks of bq per task, which share each key block's K / V panels
};

// One kv head's K and V as bf16 B panels (layouts above), keys past Sk and an odd D's last half
// zero.
struct HeadPanels {
  uint32_t* kp;  // [SkP/32][DU][32]
  uint32_t* vp;  // [DP/32][SkP/2][32], DP = D rounded up to 32
};

// 32-key panels [p0, p1) of K: per 16 keys × 16 d-pair units, the units of each key (bf16 pairs,
// zero past D and for keys past Sk) transposed so that each unit's row holds the keys — zmm
// transposes; one 4-byte store per unit was ~15 % of the AMX attention at S = 1792.
void pack_k(const Args& a, const float* kh, int64_t p0, int64_t p1, uint32_t* kp) {
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* dst = kp + p * a.DU * kZNR;
    for (int jh = 0; jh < kZNR; jh += 16)
      for (int64_t u0 = 0; u0 < a.DU; u0 += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; ++j) {
          const int64_t key = p * kZNR + jh + j;
          if (key >= a.Sk) {
            r[j] = _mm512_setzero_si512();
            continue;
          }
          const float* row = kh + key * a.ldk;
          r[j] = bf16_units16_ftz_at(row, 2 * u0, a.D);
        }
        transpose16x16_epi32(r);
        const int nu = static_cast<int>(std::min<int64_t>(16, a.DU - u0));
        for (int i = 0; i < nu; ++i) _mm512_storeu_si512(dst + (u0 + i) * kZNR + jh, r[i]);
      }
  }
}

// Key pairs [u0, u1) of every 32-wide d panel of V: units (V[2u][d], V[2u+1][d]).
void pack_v(const Args& a, const float* vh, int64_t u0, int64_t u1, uint32_t* vp) {
  const int64_t DP = (a.D + kZNR - 1) / kZNR * kZNR, SU = a.SkP / 2;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t k0 = 2 * u, k1 = 2 * u + 1;
    for (int64_t d0 = 0; d0 < DP; d0 += 16) {
      const __mmask16 m = col_mask(static_cast<int>(std::clamp<int64_t>(a.D - d0, 0, 16)));
      const __m512 lo = k0 < a.Sk ? _mm512_maskz_loadu_ps(m, vh + k0 * a.ldv + d0) : _mm512_setzero_ps();
      const __m512 hi = k1 < a.Sk ? _mm512_maskz_loadu_ps(m, vh + k1 * a.ldv + d0) : _mm512_setzero_ps();
      _mm512_storeu_si512(vp + (d0 / kZNR) * SU * kZNR + u * kZNR + d0 % kZNR, bf16_pairs_ftz(lo, hi));
    }
  }
}

// One sub-block's view; qs, o, m and l are the task's (nsub · bq rows), s and pb shared by its
// sub-blocks.
struct Buffers {
  uint16_t* qs;  // [bq][DU·2]   scaled Q rows as bf16 pairs
  float* s;      // [bq][kBK]    scores, then probabilities
  uint16_t* pb;  // [bq][kBK]    probabilities as bf16 pairs along the keys
  float* o;      // [bq][DP]     unnormalised output
  float* m;      // [bq] running max (log2 units)
  float* l;      // [bq] running sum
  Buffers sub(int64_t r, int64_t DU, int64_t DP) const {  // the sub-block from row r
    return {qs + r * DU * 2, s, pb, o + r * DP, m + r, l + r};
  }
};

// The rows the thread's next task reads first (its Q rows) and writes last (its output rows), as
// the current task's first key block fetches them: each task's first Q loads and last stores
// otherwise wait on memory (the fused QKV rows are 4-5 floats × D apart and long evicted); under
// perf that was ~11 % of the AMX attention's samples at 512².
struct NextRows {
  const float* q = nullptr;  // row 0 of the next task's Q (null: no next task)
  float* o = nullptr;        // row 0 of its output
  int64_t n = 0;             // its rows
};

// Mm supplies scores(a, hp, b, nq, j0, nk): b.s[i][c] = Qs_i · K_{j0+c} for c < nk (rounded up to
// whole 32-key panels), and pv(a, hp, b, nq, j0, nk): b.o[i] += P_i · V[j0 : j0 + nk].
// One sub-block's (nq ≤ bq queries from i0) step over keys [j0, j0 + nk): scores, the online
// softmax, P · V. next: the rows to prefetch meanwhile (see NextRows), or null.
template <class Mm>
void key_block(const Args& a, const HeadPanels& hp, const Buffers& b, int64_t i0, int64_t nq, int64_t j0,
               int64_t nk, const NextRows* next) {
  const int64_t DP = (a.D + kZNR - 1) / kZNR * kZNR;
  Mm::scores(a, hp, b, nq, j0, nk);  // S[nq, nk] = Qs · Kᵀ
  // Online softmax, one query row at a time (keys along the lanes).
  const int nv = static_cast<int>((nk + 15) / 16);
  const __mmask16 tail = col_mask(static_cast<int>(nk - 16 * (nv - 1)));  // the last vector's keys
  for (int64_t i = 0; i < nq; ++i) {
    float* s = b.s + i * kBK;
    const int64_t qi = i0 + i;
    if (next)  // one row of the next task's per softmax row (see NextRows)
      for (int64_t r = i; r < next->n; r += nq)
        for (int64_t d = 0; d < a.D; d += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(next->q + r * a.ldq + d), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(next->o + r * a.ldo + d), _MM_HINT_ET0);
        }
    // Two maxima in flight: a load and a max per step would otherwise wait on the max's latency.
    __m512 mx0 = _mm512_set1_ps(kNegInf), mx1 = mx0;
    if (!a.mask.key_valid && (!a.mask.causal || j0 + nk - 1 <= qi)) {
      // Every key of the block is visible (the DiT's case): the scores stay as they are, and
      // the lanes past nk (scores of zero-padded keys) count as -inf.
      int v = 0;
      for (; v + 2 < nv; v += 2) {
        mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(s + 16 * v));
        mx1 = _mm512_max_ps(mx1, _mm512_loadu_ps(s + 16 * v + 16));
      }
      for (; v < nv; ++v)
        mx0 = _mm512_max_ps(mx0, _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), v == nv - 1 ? tail : 0xffff,
                                                      s + 16 * v));
    } else {
      for (int v = 0; v < nv; ++v) {
        const int64_t jb = j0 + 16 * v;
        __mmask16 vis = v == nv - 1 ? tail : static_cast<__mmask16>(0xffff);
        if (a.mask.causal && jb + 15 > qi)
          vis &= static_cast<__mmask16>(qi - jb >= 15 ? 0xffff : qi < jb ? 0 : (1u << (qi - jb + 1)) - 1);
        if (a.mask.key_valid) {
          const __m128i kv = _mm_maskz_loadu_epi8(vis, a.mask.key_valid + jb);
          vis &= _mm_cmpneq_epi8_mask(kv, _mm_setzero_si128());
        }
        const __m512 x = _mm512_mask_blend_ps(vis, _mm512_set1_ps(kNegInf), _mm512_loadu_ps(s + 16 * v));
        _mm512_storeu_ps(s + 16 * v, x);
        mx0 = _mm512_max_ps(mx0, x);
      }
    }
    const float mold = b.m[i], mnew = std::max(mold, _mm512_reduce_max_ps(_mm512_max_ps(mx0, mx1)));
    // The maxima may drop a NaN score; that key's p is NaN all the same. The offset subtracted
    // is mnew, or 0 while it is -inf (every score so far -inf: masked keys), so that a masked
    // key gives p = 2^-inf = 0 and corr = 0 (O, l are 0), not 2^(-inf + inf) = NaN.
    const float moff = mnew == kNegInf ? 0.0f : mnew;
    const float corr = _mm512_cvtss_f32(exp2_neg16(_mm512_set1_ps(mold - moff)));
    const __m512 vm = _mm512_set1_ps(moff);
    __m512 sum = _mm512_setzero_ps();
    uint16_t* pb = b.pb + i * kBK;
    auto prob = [&](int v) { return exp2_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * v), vm)); };
    // Pairs of vectors before the last, converted to bf16 by one vcvtne2ps2bf16 (the rounding of
    // p_to_bf16); only the last vector has lanes past nk to zero.
    int v = 0;
    for (; v + 2 < nv; v += 2) {
      const __m512 p0 = prob(v), p1 = prob(v + 1);
      sum = _mm512_add_ps(_mm512_add_ps(sum, p0), p1);
      _mm512_storeu_si512(pb + 16 * v, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    }
    for (; v < nv; ++v) {
      const __m512 p = v == nv - 1 ? _mm512_maskz_mov_ps(tail, prob(v)) : prob(v);
      sum = _mm512_add_ps(sum, p);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + 16 * v), p_to_bf16(p));
    }
    // Zeros up to the next 32 keys: products over whole 32-key steps read them (times V rows
    // that may be real keys past a causal block's end, or zero padding).
    for (int64_t c = 16 * nv; c < std::min<int64_t>(kBK, (nk + 31) / 32 * 32); ++c) pb[c] = 0;
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

// A task: `rows` queries of head h from i0, in sub-blocks of bq that take each key block in turn,
// so that the block's K / V panels are fetched once for all of them (see attention_bf16_run).
// Every sub-block sees the same key blocks, in the same order, as a task of its own would: the
// same sums.
template <class Mm>
void run_task(const Args& a, const HeadPanels& hp, int h, int64_t i0, int64_t rows, const Buffers& b,
              const NextRows& next) {
  const int64_t DU = a.DU, DP = (a.D + kZNR - 1) / kZNR * kZNR;
  const float mul = a.scale * kLog2e;
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = a.q + (i0 + i) * a.ldq + static_cast<int64_t>(h) * a.D;
    uint16_t* dst = b.qs + i * DU * 2;
    for (int64_t d = 0; d < DU * 2; d += 16) {  // zeros past D
      const __mmask16 m = col_mask(static_cast<int>(std::clamp<int64_t>(a.D - d, 0, 16)));
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + d), _mm512_set1_ps(mul));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), bf16x16_ftz(x));
    }
  }
  std::fill(b.o, b.o + rows * DP, 0.0f);
  std::fill(b.m, b.m + rows, kNegInf);
  std::fill(b.l, b.l + rows, 0.0f);
  // Keys past kv_end are masked for every query: their scores would be -inf, their P exactly 0,
  // so leaving them out changes no sum (the text encoder's 512 keys are mostly padding, and one
  // key block spans them all). A causal sub-block ends at its last query.
  auto key_end = [&](int64_t q0, int64_t nq) {
    return std::min(a.kv_end, a.mask.causal ? std::min(a.Sk, q0 + nq) : a.Sk);
  };
  const int64_t kend = key_end(i0, rows);
  for (int64_t j0 = 0; j0 < kend; j0 += kBK)
    for (int64_t r = 0; r < rows; r += a.bq) {
      const int64_t nq = std::min(a.bq, rows - r), ke = key_end(i0 + r, nq);
      if (j0 >= ke) continue;
      const int64_t nk = std::min(kBK, ke - j0);
      if (a.mask.key_valid && std::all_of(a.mask.key_valid + j0, a.mask.key_valid + j0 + nk,
                                          [](uint8_t v) { return v == 0; }))
        continue;  // e.g. a block of padding tokens
      key_block<Mm>(a, hp, b.sub(r, DU, DP), i0 + r, nq, j0, nk, j0 == 0 && r == 0 && next.q ? &next : nullptr);
    }
  for (int64_t i = 0; i < rows; ++i) {
    float* dst = a.out + (i0 + i) * a.ldo + static_cast<int64_t>(h) * a.D;
    const bool sees = a.first_key < a.Sk && (!a.mask.causal || a.first_key <= i0 + i);
    const __m512 inv = _mm512_set1_ps(sees ? 1.0f / b.l[i] : 0.0f);  // no visible key → zeros; l = 0 → NaN
    for (int64_t d = 0; d < a.D; d += 16)
      _mm512_mask_storeu_ps(dst + d, col_mask(static_cast<int>(std::min<int64_t>(16, a.D - d))),
                            _mm512_mul_ps(_mm512_loadu_ps(b.o + i * DP + d), inv));
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
  a.kv_end = Sk;
  a.first_key = mask.first_key(Sk);
  if (mask.key_valid)
    while (a.kv_end > 0 && mask.key_valid[a.kv_end - 1] == 0) --a.kv_end;
  const int64_t DP = (D + kZNR - 1) / kZNR * kZNR;
  // Every kv head's panels at once (~4·Sk·D·Hkv bytes, half the size of K and V themselves), so
  // that the whole call is one packing pass and one task queue: per-head passes synchronised the
  // threads 3 × Hkv times, which on a 2-vCPU VM cost more than the packing (~15 % at S = 1792).
  const int64_t kp_n = a.SkP / kZNR * a.DU * kZNR, vp_n = DP / kZNR * (a.SkP / 2) * kZNR;
  static thread_local UnitScratch panels;
  uint32_t* const kp = panels.get<uint32_t>((kp_n + vp_n) * Hkv);
  uint32_t* const vp = kp + kp_n * Hkv;
  // Items [0, Hkv · per_head) over the pool, each thread's range cut at head boundaries:
  // fn(head, first item, end item) within that head.
  auto per_head = [&](int64_t n, auto fn) {
    pool.parallel_for(Hkv * n, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1;) {
        const int64_t g = w / n, e = std::min(w1, (g + 1) * n);
        fn(g, w - g * n, e - g * n);
        w = e;
      }
    });
  };
  // Only the panels up to kv_end: the products never read past the 32-key panel holding it.
  const int64_t kv_panels = (a.kv_end + kZNR - 1) / kZNR;
  per_head(kv_panels, [&](int64_t g, int64_t p0, int64_t p1) { pack_k(a, k + g * D, p0, p1, kp + g * kp_n); });
  per_head(kv_panels * kZNR / 2, [&](int64_t g, int64_t u0, int64_t u1) { pack_v(a, v + g * D, u0, u1, vp + g * vp_n); });
  // Each task fetches every key block's K / V panels once for its nsub sub-blocks of queries.
  // Where a head's panels fit the L2 they stay there across tasks, and one sub-block per task
  // keeps each task's rows near L1; where they do not (the DiT at 1024²: 2.4 MB at S = 4608),
  // every task streams them from L3, and that stream was what bounded the products (P · V took
  // 3.4× its tile time).
  a.nsub = Mm::kMaxSub > 1 && (kp_n + vp_n) * 4 > l2_cache_bytes() / 2 ? Mm::kMaxSub : 1;
  const int group = Hq / Hkv;
  const int64_t tq = a.bq * a.nsub;  // queries per task
  const int64_t nqb = (Sq + tq - 1) / tq, per_kv = nqb * group, tasks = per_kv * Hkv;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    Mm::begin();
    static thread_local UnitScratch buf;
    const size_t n_qs = tq * a.DU * 2 * 2, n_s = a.bq * kBK * 4, n_pb = a.bq * kBK * 2, n_o = tq * DP * 4;
    uint8_t* base = buf.get<uint8_t>(n_qs + n_s + n_pb + n_o + 2 * tq * 4 + 6 * 64);
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
    b.m = reinterpret_cast<float*>(carve(tq * 4));
    b.l = reinterpret_cast<float*>(carve(tq * 4));
    // kv head by kv head (its panels stay in L2 while the threads share its tasks); within one,
    // the last query blocks first: with a causal mask they cost most.
    // task t → its query head and first query
    auto where = [&](int64_t t, int64_t* i0) {
      const int64_t r = t % per_kv;
      *i0 = (nqb - 1 - r % nqb) * tq;
      return static_cast<int>(t / per_kv) * group + static_cast<int>(r / nqb);
    };
    // The next task is claimed before this one runs, so that its rows can be fetched meanwhile.
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < tasks;) {
      const int64_t tn = next.fetch_add(1, std::memory_order_relaxed);
      int64_t i0 = 0;
      const int h = where(t, &i0);
      NextRows nr;
      if (tn < tasks) {
        int64_t n0 = 0;
        const int hn = where(tn, &n0);
        nr = {q + n0 * ldq + static_cast<int64_t>(hn) * D, out + n0 * ldo + static_cast<int64_t>(hn) * D,
              std::min(tq, Sq - n0)};
      }
      const int g = static_cast<int>(t / per_kv);
      run_task<Mm>(a, HeadPanels{kp + g * kp_n, vp + g * vp_n}, h, i0, std::min(tq, Sq - i0), b, nr);
      t = tn;
    }
  });
}

}  // namespace
}  // namespace klein::kernels
