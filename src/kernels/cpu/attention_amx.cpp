// AMX flash attention (Precision::kFast): attention_bf16_common.h's algorithm — the same bf16
// operands, packing and online softmax as the AVX512_BF16 kernel, so ref::attention_bf16's
// arithmetic — with its two products as tdpbf16ps tile products, 32 × 32 outputs per 2 × 2 tiles:
//
//   scores  S[32 q][32 keys] = Qs · Kᵀ: A tiles = 16 Q rows × 16 d-pair units each, read from
//           the Q rows in place (row stride DU units, DU padded to whole 16-unit steps); B tiles =
//           16 d-pair units × 16 keys, from a 32-key K panel ([DU][32] units: row stride 128 B);
//           the sums are stored into S (stride kBK floats).
//   values  O[32 q][32 d] += P · V: A tiles = 16 P rows × 16 key-pair units (32 keys); B tiles
//           = 16 key-pair units × 16 d, from a 32-wide V panel ([SkP/2][32] units); O is loaded
//           into the accumulator tiles, and stored back after the block's keys.
//
// Rows past nq (a task's last queries) compute on stale buffer rows and are never stored;
// P is zero from nk up to the next 32 keys (attention_bf16_common.h), which these whole 32-key
// steps read.
#include "kernels/cpu/amx_common.h"
#include "kernels/cpu/attention_bf16_common.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::amx {
namespace {

struct Tiles {
  static constexpr int64_t kUnitAlign = 16;  // one tile step of units along d
  // Queries per task: one 32-row tile pair, so that a task's Q rows (8 KB), O (16 KB) and P stay
  // near L1 while the K / V panels stream past; 128 rows spilled all of them to L2, and the tile
  // loads ran at L2 speed (S = 1792: 64 → 37 ms, with kAttnBf16KeyBlock 128 → 512 and the
  // one-pass packing of attention_bf16_common.h).
  static int64_t bq(bool) { return 32; }
  // Sub-blocks per task where a head's K / V panels exceed the L2 (attention_bf16_run): S = 4608
  // (the DiT at 1024²), 2 threads, ms per call: 1 sub-block 234-238, 2: 215, 4: 194-199, 8:
  // 191-192, 16: 190.
  static constexpr int64_t kMaxSub = 8;
  static void begin() { amx_configure_tiles(); }

  static void scores(const Args& a, const HeadPanels& hp, const Buffers& b, int64_t nq, int64_t j0, int64_t nk) {
    const auto* qs = reinterpret_cast<const uint32_t*>(b.qs);
    const int64_t DU = a.DU;
    for (int64_t r = 0; r < nq; r += 32)
      for (int64_t c = 0; c < nk; c += 32) {
        const uint32_t* q0 = qs + r * DU;
        const uint32_t* kp = hp.kp + ((j0 + c) / kZNR) * DU * kZNR;
        amx_acc_zero();
        for (int64_t u = 0; u < DU; u += 16)
          amx_step<false>(q0 + u, q0 + 16 * DU + u, DU * 4, kp + u * kZNR, kp + u * kZNR + 16, kZNR * 4);
        amx_acc_store(b.s + r * kBK + c, kBK * 4);
      }
  }

  static void pv(const Args& a, const HeadPanels& hp, const Buffers& b, int64_t nq, int64_t j0, int64_t nk) {
    const int64_t DP = (a.D + kZNR - 1) / kZNR * kZNR, SU = a.SkP / 2, ldp = kBK * 2;
    const int64_t nu = (nk + 31) / 32 * 16;  // key-pair units, whole steps
    for (int64_t r = 0; r < nq; r += 32)
      for (int64_t d0 = 0; d0 < DP; d0 += kZNR) {
        float* o = b.o + r * DP + d0;
        const uint16_t* p0 = b.pb + r * kBK;
        const uint32_t* vp = hp.vp + (d0 / kZNR) * SU * kZNR + (j0 / 2) * kZNR;
        amx_acc_load(o, DP * 4);
        for (int64_t u = 0; u < nu; u += 16)
          amx_step<false>(p0 + 2 * u, p0 + 16 * kBK + 2 * u, ldp, vp + u * kZNR, vp + u * kZNR + 16, kZNR * 4);
        amx_acc_store(o, DP * 4);
      }
  }
};

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq, int Hkv,
               int D, float scale, const AttnMask& mask, ThreadPool& pool, int64_t ldq, int64_t ldk, int64_t ldv,
               int64_t ldo) {
  attention_bf16_run<Tiles>(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, pool, ldq, ldk, ldv, ldo);
}

}  // namespace klein::kernels::amx
