#include "kernels/scratch.h"

#include <algorithm>
#include <atomic>

namespace klein::kernels {

namespace {
std::atomic<int64_t> g_scratch{0};
}  // namespace

uint64_t scratch_bytes() { return static_cast<uint64_t>(std::max<int64_t>(0, g_scratch.load())); }
void note_scratch_bytes(int64_t delta) { g_scratch.fetch_add(delta, std::memory_order_relaxed); }

uint64_t scratch_bytes_per_thread(const ScratchShape& s) {
  // The blocking constants of src/kernels/cpu (kKC = kNC = 256 for every GEMM family, attention
  // query blocks of ≤ 192 and key blocks of 96, conv strips of 4 output rows and 256-pixel
  // tasks); the bound takes the largest of each, as floats.
  constexpr uint64_t kKC = 256, kNC = 256, kBQ = 192, kBK = 96, kStripRows = 4, kNB = 256;
  const uint64_t k = static_cast<uint64_t>(std::max<int64_t>(s.max_k, 0));
  // packed W slice + one converted row (gemv, bf16) + the AVX2 W8A8's widened block of x (48 rows
  // of 256 int16 pairs, gemm_int8_common.h)
  uint64_t floats = kKC * kNC + k + 48 * kKC;
  if (s.converts_weights) floats += kNC * k;        // a slab of weight rows expanded to f32
  // The AMX GEMMs' copy of a slab (128 rows of ≤ 2 bytes per element, gemm_amx.cpp), made for
  // any format when the stored rows do not start on cache lines — the case of safetensors data,
  // which is only 8-byte aligned — or the slab is not whole tiles.
  floats += 128 * 2 * k / 4;
  floats *= 2;                                      // the int8 / AVX-512 families keep their own copies
  if (s.attn_head_dim > 0) {
    const uint64_t dp = (static_cast<uint64_t>(s.attn_head_dim) + 15) / 16 * 16;
    floats += 2 * kBQ * dp + kBK * kBQ + kBK * dp + 3 * kBQ + kBK;
  }
  if (s.conv_cin > 0) {
    const uint64_t c = static_cast<uint64_t>(s.conv_cin);
    floats += c * (kStripRows + 2) * (static_cast<uint64_t>(s.conv_width) + 34) + kNB * kKC + c * 9 * kNB;
    // The float32 Winograd conv's transformed weights U [Cout][16·Cin + 16] (Cout ≤ the widest
    // Cin in the VAE), kept by the calling thread; counted for every thread, as an upper bound.
    floats += c * (16 * c + 16);
  }
  return floats * sizeof(float);
}

uint64_t activation_copy_bytes(const ScratchShape& s) {
  // Bytes per element of x: the bf16 GEMM's copy (2, freed after the call), the AMX bf16 GEMM's
  // tiles (2), the W8A8 and W4A8 families' int8 copies (1 each, kept by their call sites), the
  // W4A8's group sums (a float per 64) and every int8 copy's row scales (a float per row, at
  // most one per 64 elements for K ≥ 64; the 4 KB covers shorter rows of small inputs).
  // The ggml block kernels (gemm_ggml_direct.h): int8 codes (1) and, per sub-block of ≥ 16, an
  // activation scale, a scaled sum and an integer sum (12 / 16), in blocks of 32 rows (a partial
  // last block: counted as up to 2 ×).
  const uint64_t x = static_cast<uint64_t>(std::max<int64_t>(s.max_x, 0));
  return 6 * x + x / 16 + 2 * (x / 16) + 4096 + 2 * (x + 12 * (x / 16));
}

uint64_t scratch_bound_bytes(const ScratchShape& s, int threads) {
  return static_cast<uint64_t>(std::max(threads, 1)) * scratch_bytes_per_thread(s) + activation_copy_bytes(s);
}

}  // namespace klein::kernels
