// AMX tile set-up shared by the AMX kernels (gemm_amx.cpp, attention_amx.cpp): every kernel uses
// palette 1 with all 8 tiles at their largest, 16 rows × 64 bytes, so one configuration serves
// all of them. The configuration is per thread; the OS permission for the tile state is asked
// once per process by CpuFeatures::host(), which reports AMX only when it was granted.
//
// Include ONLY from *_amx.cpp files (compiled with -mamx-*), which only the kernel registry
// reaches, on CPUs that have the ISA.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/eltwise_v16.h"
#include "kernels/cpu/gemm_avx512_common.h"

namespace klein::kernels {
namespace {

// The 64-byte ldtilecfg operand: palette 1, all 8 tiles 16 rows × 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;
  }
};

// Loads the configuration into this thread's tile state (cheap next to any tile product loop;
// called at the start of each kernel's per-thread work rather than tracked per thread).
inline void amx_configure_tiles() {
  static const AmxTileConfig cfg;
  _tile_loadconfig(&cfg);
}

// The 2 × 2 tile block every AMX kernel here runs: accumulators tmm0..3 hold a 32 × 32 block of
// 4-byte sums as quadrants (tmm0 rows 0-15 / columns 0-15, tmm1 rows 0-15 / columns 16-31, tmm2
// and tmm3 the same for rows 16-31); A tiles tmm4 / tmm5 are its row halves, B tiles tmm6 / tmm7
// its column halves.

// The accumulators from / to a 32 × 32 block at c (rows ld bytes apart), or zeroed.
inline void amx_acc_load(const void* c, int64_t ld) {
  const auto* p = static_cast<const uint8_t*>(c);
  _tile_loadd(0, p, ld);
  _tile_loadd(1, p + 64, ld);
  _tile_loadd(2, p + 16 * ld, ld);
  _tile_loadd(3, p + 16 * ld + 64, ld);
}
inline void amx_acc_store(void* c, int64_t ld) {
  auto* p = static_cast<uint8_t*>(c);
  _tile_stored(0, p, ld);
  _tile_stored(1, p + 64, ld);
  _tile_stored(2, p + 16 * ld, ld);
  _tile_stored(3, p + 16 * ld + 64, ld);
}
inline void amx_acc_zero() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// One step of the block: A rows 0-15 at a0 and 16-31 at a1 (rows lda bytes apart), B columns
// 0-15 at b0 and 16-31 at b1 (rows ldb bytes apart), four products into the accumulators:
// int8 (s8 × s8, tdpbssd) or bf16 pairs (tdpbf16ps).
template <bool kInt8>
inline void amx_step(const void* a0, const void* a1, int64_t lda, const void* b0, const void* b1, int64_t ldb) {
  _tile_loadd(4, a0, lda);
  _tile_loadd(5, a1, lda);
  _tile_loadd(6, b0, ldb);
  _tile_loadd(7, b1, ldb);
  if constexpr (kInt8) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  } else {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// r[i] ← column i of the 16 × 16 matrix of 32-bit lanes whose row i is r[i]: the classic unpack
// network (32-bit and 64-bit unpacks, then two 128-bit lane shuffles), 64 three-operand shuffles
// with no index registers. transpose16x16_epi32's vpermt2d stages overwrite a source each, and
// in the epilogue GCC spilled around them (~9 % of a bf16 GEMM in amx_block's epilogue).
// (GCC 12's -Wuninitialized flags the unpacks' _mm512_undefined_epi32 operand once this is
// inlined into the piecewise stores, a false positive: that operand is undefined by design.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
inline void amx_transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4b + j] now holds, per 128-bit lane L, rows 4b..4b+3 at column 4L + j.
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);       // lanes 0, 2 of rows 0-3 | 4-7
    t[4 + j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);   // lanes 1, 3
    t[8 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);        // column j      (lane 0)
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);    // column 8 + j  (lane 2)
    r[4 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0x88);   // column 4 + j  (lane 1)
    r[12 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0xdd);  // column 12 + j (lane 3)
  }
}
#pragma GCC diagnostic pop

// The AMX GEMMs compute yᵀ (tiles of weight rows × activation rows). A 32 × 32 block of 4-byte
// sums c[n][m] (n: weight row, m: activation row; rows 32 values apart) goes out to y[m][n] for
// m < rows, n < cols: per 16 × 16 quarter, 16 zmm transposed (amx_transpose16x16), then
// y[m][16q .. 16q + 15] = out(v, m, q) with v row m's 16 sums along n.
// In pieces (the GEMMs run a block's store between the next block's tile steps, see
// gemm_amx.cpp's BlockStore): amx_store_pieces(rows, cols) quarters, piece p one of them.
inline int amx_store_pieces(int rows, int cols) { return (cols + 15) / 16 * ((rows + 15) / 16); }
template <class Out>
inline void amx_store_transposed_piece(const uint32_t* c, int rows, int cols, float* y, int64_t ldy, const Out& out,
                                       int p) {
  const int nh = (rows + 15) / 16, q = p / nh, h = p % nh;
  const __mmask16 cm = col_mask(cols - q * 16);
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(c + (q * 16 + i) * 32 + h * 16);
  amx_transpose16x16(r);
  const int n = std::min(16, rows - h * 16);
  for (int i = 0; i < n; ++i) _mm512_mask_storeu_ps(y + (h * 16 + i) * ldy + q * 16, cm, out(r[i], h * 16 + i, q));
}
template <class Out>
inline void amx_store_transposed(const uint32_t* c, int rows, int cols, float* y, int64_t ldy, const Out& out) {
  for (int p = 0, n = amx_store_pieces(rows, cols); p < n; ++p) amx_store_transposed_piece(c, rows, cols, y, ldy, out, p);
}

// The fused SwiGLU's store of a 32 × 32 block of sums c[n][m] (rows 32 values apart) whose rows
// n 0-15 are 16 gate columns and rows 16-31 the same up columns: out[m][j] = SiLU(g) · u for
// m < rows, j < cols, where g = val(gate sums of row m, m, mask, 0) and u = val(…, 1) are the
// values the plain epilogue would store, combined by EltwiseSimd<V16>::silu_v and a multiply —
// the element-wise silu_mul's operations, so the bits of the unfused GEMM followed by it.
// In pieces as amx_store_transposed: amx_swiglu_pieces(rows), two per 16 rows — piece 2h the
// gate values of rows 16h.. into `gate` (16 × 16 floats, the caller's), piece 2h + 1 the up
// values and the products; run in order.
inline int amx_swiglu_pieces(int rows) { return 2 * ((rows + 15) / 16); }
template <class Val>
inline void amx_store_swiglu_piece(const uint32_t* c, int rows, int cols, float* out, int64_t ldo, const Val& val,
                                   float (*gate)[16], int p) {
  const int h = p / 2, n = std::min(16, rows - h * 16);
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(c + (p % 2 ? 16 + i : i) * 32 + h * 16);
  amx_transpose16x16(r);
  if (p % 2 == 0) {
    for (int i = 0; i < n; ++i) _mm512_store_ps(gate[i], val(r[i], h * 16 + i, 0));
    return;
  }
  const __mmask16 cm = col_mask(cols);
  for (int i = 0; i < n; ++i)
    _mm512_mask_storeu_ps(out + (h * 16 + i) * ldo, cm,
                          _mm512_mul_ps(EltwiseSimd<V16>::silu_v(_mm512_load_ps(gate[i])), val(r[i], h * 16 + i, 1)));
}
template <class Val>
inline void amx_store_swiglu(const uint32_t* c, int rows, int cols, float* out, int64_t ldo, const Val& val) {
  alignas(64) float gate[16][16];
  for (int p = 0, n = amx_swiglu_pieces(rows); p < n; ++p) amx_store_swiglu_piece(c, rows, cols, out, ldo, val, gate, p);
}

}  // namespace
}  // namespace klein::kernels
