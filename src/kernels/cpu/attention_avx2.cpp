// AVX2 flash-style attention. Unit of work (and of parallelism): one query head × a block of
// BQ queries. It walks the visible keys in blocks of kBK with an online softmax, so only a
// kBK×BQ score tile ever exists. Both products run on the GEMM micro-kernel:
//   Sᵀ[kBK, BQ] = K[kBK, D] · Qᵀ[D, BQ]   K rows are read in place (row-major A operand);
//                                         Qᵀ is packed once per task, pre-scaled by
//                                         scale·log2(e) so scores come out in log2 units.
//   O[BQ, D]  += P[BQ, kBK] · V[kBK, D]   P is read from the transposed tile Pᵀ = Sᵀ
//                                         (column-major A operand); V block packed to panels.
// Keeping scores transposed puts the queries along the vector lanes, so the softmax max/sum
// over keys are plain vertical ops (no horizontal reductions) and exp runs 8 queries at once.
// Per query i the running max m_i and sum l_i rescale O when a block raises the max; the
// result is O / l, or zeros for a query that the mask gives no visible key. A NaN score gives
// p = NaN and so a NaN row, as do +inf (p = 2^(inf − inf)) and a row of -inf scores (l = 0,
// O / l = 0/0): the mask, not the scores, decides which keys count (kernels.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/avx2_kernels.h"

namespace klein::kernels::avx2 {
namespace {

// Queries per task (BQ): each task re-reads its head's K and V, so a larger block means less
// memory traffic per flop; but with a causal mask the diagonal block is half wasted work, so
// causal attention uses the smaller one. Multiples of 16 (Qᵀ panels) and of 6 (slivers).
constexpr int64_t kBQFull = 192;
constexpr int64_t kBQCausal = 96;
constexpr int64_t kBK = 96;  // keys per block: 16 slivers of 6
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;

struct Args {
  const float *q, *k, *v;
  float* out;
  int64_t Sq, Sk;
  int Hq, Hkv, D;
  float scale;
  AttnMask mask;
  int64_t ldq, ldk, ldv, ldo;
  int64_t bq;  // queries per task: kBQFull or kBQCausal
  int64_t first_key;  // mask.first_key(Sk)
};

struct Buffers {
  float* qt;    // [BQ/16][D][16]   Qᵀ panels, scaled
  float* st;    // [kBK][BQ]        scores, then probabilities (transposed)
  float* vp;    // [Dp/16][kBK][16] V block panels, zero padded past D
  float* o;     // [BQ][Dp]         unnormalised output
  float* m;     // [BQ] running max (log2 units)
  float* l;     // [BQ] running sum
  float* corr;  // [BQ] this block's rescale factor for O
  uint8_t* kinv;  // [kBK] 1 where key_valid says the key is masked
};

// qt[p][d][jj] = q[i0 + 16p + jj, d] · mul (zero for queries past nq).
void pack_qt(const float* q, int64_t ldq, int64_t nq, int D, float mul, float* qt) {
  const __m256 vm = _mm256_set1_ps(mul);
  for (int64_t p = 0; p * kNR < nq; ++p)
    for (int g = 0; g < 2; ++g) {
      const int64_t r0 = p * kNR + g * 8;
      float* dst = qt + p * D * kNR + g * 8;
      const int64_t rows = std::clamp<int64_t>(nq - r0, 0, 8);
      int d = 0;
      if (rows == 8) {
        const float* src = q + r0 * ldq;
        for (; d + 8 <= D; d += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ldq + d);
          transpose8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (d + i) * kNR, _mm256_mul_ps(r[i], vm));
        }
      }
      for (; d < D; ++d)
        for (int i = 0; i < 8; ++i) dst[d * kNR + i] = i < rows ? q[(r0 + i) * ldq + d] * mul : 0.0f;
    }
}

// vp[p][j][t] = v[j, 16p + t] for t < D - 16p, else 0.
void pack_v(const float* v, int64_t ldv, int64_t nk, int D, float* vp) {
  for (int64_t p = 0; p * kNR < D; ++p) {
    const int cols = static_cast<int>(std::min<int64_t>(kNR, D - p * kNR));
    float* dst = vp + p * nk * kNR;
    for (int64_t j = 0; j < nk; ++j) {
      const float* src = v + j * ldv + p * kNR;
      if (cols == kNR) {
        _mm256_storeu_ps(dst + j * kNR, _mm256_loadu_ps(src));
        _mm256_storeu_ps(dst + j * kNR + 8, _mm256_loadu_ps(src + 8));
      } else {
        for (int t = 0; t < kNR; ++t) dst[j * kNR + t] = t < cols ? src[t] : 0.0f;
      }
    }
  }
}

// Online-softmax update for one key block over queries [c, c+8): masks, finds the block max,
// turns Sᵀ[:, c..c+8) into probabilities in place and updates m, l, corr.
void softmax_block(const Args& a, const Buffers& b, int64_t i0, int64_t j0, int64_t nk, int64_t c,
                   bool causal_blk, bool any_inv) {
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  const int64_t bq = a.bq;
  float* s = b.st + c;
  if (causal_blk || any_inv) {  // write -inf where key j is not visible to query i0 + c + lane
    const __m256 qidx = _mm256_add_ps(_mm256_set1_ps(static_cast<float>(i0 + c)),
                                      _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t j = 0; j < nk; ++j) {
      float* row = s + j * bq;
      if (any_inv && b.kinv[j]) {
        _mm256_storeu_ps(row, ninf);
      } else if (causal_blk) {
        const __m256 later = _mm256_cmp_ps(_mm256_set1_ps(static_cast<float>(j0 + j)), qidx,
                                           _CMP_GT_OQ);
        _mm256_storeu_ps(row, _mm256_blendv_ps(_mm256_loadu_ps(row), ninf, later));
      }
    }
  }
  __m256 mx = ninf;
  for (int64_t j = 0; j < nk; ++j) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j * bq));
  const __m256 mold = _mm256_loadu_ps(b.m + c);
  const __m256 mnew = _mm256_max_ps(mold, mx);
  // vmaxps may drop a NaN score from the max; that key's p is NaN all the same. The offset
  // subtracted is mnew, or 0 where it is still -inf (every score so far -inf: masked keys),
  // so that a masked key gives p = 2^-inf = 0 and corr = 0 (O, l are 0), not 2^(-inf + inf).
  const __m256 moff = _mm256_blendv_ps(mnew, _mm256_setzero_ps(), _mm256_cmp_ps(mnew, ninf, _CMP_EQ_OQ));
  const __m256 corr = exp2_neg(_mm256_sub_ps(mold, moff));
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < nk; ++j) {
    const __m256 p = exp2_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j * bq), moff));  // -inf → 0, NaN → NaN
    _mm256_storeu_ps(s + j * bq, p);
    sum = _mm256_add_ps(sum, p);
  }
  _mm256_storeu_ps(b.m + c, mnew);
  _mm256_storeu_ps(b.corr + c, corr);
  _mm256_storeu_ps(b.l + c, _mm256_fmadd_ps(_mm256_loadu_ps(b.l + c), corr, sum));
}

void run_task(const Args& a, int h, int64_t i0, const Buffers& b) {
  const int D = a.D;
  const int64_t Dp = (D + kNR - 1) / kNR * kNR;
  const int g = h / (a.Hq / a.Hkv);
  const int64_t bq = a.bq;
  const int64_t nq = std::min(bq, a.Sq - i0);
  const int64_t nq8 = (nq + 7) / 8 * 8, npan = (nq + kNR - 1) / kNR;
  pack_qt(a.q + i0 * a.ldq + static_cast<int64_t>(h) * D, a.ldq, nq, D, a.scale * kLog2e, b.qt);
  std::fill(b.o, b.o + nq * Dp, 0.0f);
  std::fill(b.m, b.m + bq, kNegInf);
  std::fill(b.l, b.l + bq, 0.0f);
  const float* kh = a.k + static_cast<int64_t>(g) * D;  // K of this kv head: [Sk, D] at ldk
  const float* vh = a.v + static_cast<int64_t>(g) * D;
  // Causal: the block's last query sees keys ≤ i0 + nq - 1; later keys are masked for all.
  const int64_t kend = a.mask.causal ? std::min(a.Sk, i0 + nq) : a.Sk;
  for (int64_t j0 = 0; j0 < kend; j0 += kBK) {
    const int64_t nk = std::min(kBK, kend - j0);
    bool any_inv = false, any_ok = true;
    if (a.mask.key_valid) {
      any_ok = false;
      for (int64_t j = 0; j < nk; ++j) {
        b.kinv[j] = a.mask.key_valid[j0 + j] == 0;
        any_inv |= b.kinv[j] != 0;
        any_ok |= b.kinv[j] == 0;
      }
    }
    if (!any_ok) continue;  // e.g. a block of padding tokens
    const bool causal_blk = a.mask.causal && j0 + nk - 1 > i0;

    // Sᵀ[nk, nq] = K[j0 : j0+nk] · Qᵀ
    for (int64_t r = 0; r < nk; r += kMR) {
      const int rows = static_cast<int>(std::min<int64_t>(kMR, nk - r));
      for (int64_t p = 0; p < npan; ++p)
        ukernel_rows(rows, kh + (j0 + r) * a.ldk, a.ldk, b.qt + p * D * kNR, kNR, D,
                     b.st + r * bq + p * kNR, bq, false, nullptr);
    }
    for (int64_t c = 0; c < nq8; c += 8) softmax_block(a, b, i0, j0, nk, c, causal_blk, any_inv);
    for (int64_t i = 0; i < nq; ++i) {
      const float cf = b.corr[i];
      if (cf == 1.0f) continue;
      float* o = b.o + i * Dp;
      const __m256 vc = _mm256_set1_ps(cf);
      for (int64_t d = 0; d < Dp; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), vc));
    }

    // O[nq, Dp] += P[nq, nk] · V[j0 : j0+nk]   (P(i, j) = Pᵀ[j][i]: column-major A)
    pack_v(vh + j0 * a.ldv, a.ldv, nk, D, b.vp);
    // Meanwhile pull the next block's K and V rows towards L2: they are strided rows (ld =
    // heads·D) that the hardware prefetchers follow poorly, and without this the first touch
    // of each block stalls the micro-kernels (~20% of the time at D = 128).
    const int64_t jn = j0 + kBK, nkn = std::max<int64_t>(0, std::min(kBK, kend - jn));
    const int64_t slivers = (nq + kMR - 1) / kMR, per = (nkn + slivers - 1) / slivers;
    for (int64_t r = 0, s = 0; r < nq; r += kMR, ++s) {
      for (int64_t j = s * per; j < std::min(nkn, (s + 1) * per); ++j)
        for (int d = 0; d < D; d += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(kh + (jn + j) * a.ldk + d), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(vh + (jn + j) * a.ldv + d), _MM_HINT_T1);
        }
      const int rows = static_cast<int>(std::min<int64_t>(kMR, nq - r));
      for (int64_t p = 0; p < Dp / kNR; ++p)
        ukernel_rows<true>(rows, b.st + r, bq, b.vp + p * nk * kNR, kNR, nk,
                           b.o + r * Dp + p * kNR, Dp, true, nullptr);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* dst = a.out + (i0 + i) * a.ldo + static_cast<int64_t>(h) * D;
    const bool sees = a.first_key < a.Sk && (!a.mask.causal || a.first_key <= i0 + i);
    const float inv = sees ? 1.0f / b.l[i] : 0.0f;  // no visible key → zeros; l = 0 → 0 · inf = NaN
    for (int d = 0; d < D; ++d) dst[d] = b.o[i * Dp + d] * inv;
  }
}

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq,
               int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask,
               ThreadPool& pool, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo) {
  const int64_t bq = mask.causal ? kBQCausal : kBQFull;
  const Args a{q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, ldq, ldk, ldv, ldo, bq, mask.first_key(Sk)};
  const int64_t nqb = (Sq + bq - 1) / bq;
  const int64_t tasks = nqb * Hq;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    static thread_local Scratch buf;
    const int64_t Dp = (D + kNR - 1) / kNR * kNR;
    const size_t n_qt = bq * Dp, n_st = kBK * bq, n_vp = kBK * Dp, n_o = bq * Dp;
    float* base = buf.get(n_qt + n_st + n_vp + n_o + 3 * bq + kBK);
    Buffers b;
    b.qt = base;
    b.st = b.qt + n_qt;
    b.vp = b.st + n_st;
    b.o = b.vp + n_vp;
    b.m = b.o + n_o;
    b.l = b.m + bq;
    b.corr = b.l + bq;
    b.kinv = reinterpret_cast<uint8_t*>(b.corr + bq);
    // Dynamic scheduling, head-major so that the threads work through one head's K/V at a
    // time (it then stays in L3); within a head the last query blocks go first, as with a
    // causal mask they cost most.
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      const int64_t qblk = nqb - 1 - t % nqb;
      run_task(a, static_cast<int>(t / nqb), qblk * bq, b);
    }
  });
}

}  // namespace klein::kernels::avx2
