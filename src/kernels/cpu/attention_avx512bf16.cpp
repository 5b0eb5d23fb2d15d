// AVX512_BF16 flash attention (Precision::kFast): attention_bf16_common.h's algorithm with its
// two products on gemm_avx512_common.h's 14×32 vdpbf16ps micro-kernel.
#include "kernels/cpu/attention_bf16_common.h"
#include "kernels/cpu/avx512bf16_dot.h"
#include "kernels/cpu/gemm_kernels.h"

namespace klein::kernels::avx512bf16 {
namespace {

struct Vdp {
  static constexpr int64_t kUnitAlign = 1;
  // Queries per task: a multiple of kZMR rows; fewer with a causal mask (the diagonal block is
  // half wasted) or when a head has too few queries to keep the threads busy.
  static int64_t bq(bool causal) { return causal ? 4 * kZMR : 9 * kZMR; }
  static constexpr int64_t kMaxSub = 1;  // bq is already 126 rows
  static void begin() {}
  static void scores(const Args& a, const HeadPanels& hp, const Buffers& b, int64_t nq, int64_t j0, int64_t nk) {
    const auto* qs = reinterpret_cast<const uint32_t*>(b.qs);
    for (int64_t r = 0; r < nq; r += kZMR) {
      const int rows = static_cast<int>(std::min<int64_t>(kZMR, nq - r));
      for (int64_t c = 0; c < nk; c += kZNR)
        zukernel_rows<Bf16Dot>(rows, qs + r * a.DU, a.DU, hp.kp + ((j0 + c) / kZNR) * a.DU * kZNR, a.DU,
                               b.s + r * kBK + c, kBK, false, nullptr, static_cast<int>(std::min<int64_t>(kZNR, nk - c)));
    }
  }
  // An odd nk's last pair has P = 0 in its high half.
  static void pv(const Args& a, const HeadPanels& hp, const Buffers& b, int64_t nq, int64_t j0, int64_t nk) {
    const int64_t DP = (a.D + kZNR - 1) / kZNR * kZNR, SU = a.SkP / 2, nu = (nk + 1) / 2;
    const auto* pb = reinterpret_cast<const uint32_t*>(b.pb);
    for (int64_t r = 0; r < nq; r += kZMR) {
      const int rows = static_cast<int>(std::min<int64_t>(kZMR, nq - r));
      for (int64_t d0 = 0; d0 < DP; d0 += kZNR)
        zukernel_rows<Bf16Dot>(rows, pb + r * (kBK / 2), kBK / 2, hp.vp + (d0 / kZNR) * SU * kZNR + (j0 / 2) * kZNR,
                               nu, b.o + r * DP + d0, DP, true, nullptr, kZNR);
    }
  }
};

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out, int64_t Sq, int64_t Sk, int Hq,
               int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool, int64_t ldq, int64_t ldk,
               int64_t ldv, int64_t ldo) {
  attention_bf16_run<Vdp>(q, k, v, out, Sq, Sk, Hq, Hkv, D, scale, mask, pool, ldq, ldk, ldv, ldo);
}

}  // namespace klein::kernels::avx512bf16
