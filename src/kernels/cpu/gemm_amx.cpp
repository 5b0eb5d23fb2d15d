// AMX GEMMs (Precision::kFast): W8A8 for Q8_ROW weights with tdpbssd, and bf16 for the float
// weight formats with tdpbf16ps. One tile is 16 rows × 64 bytes; a tdpbssd multiplies a 16 × 64
// int8 tile by a 64 × 16 one (16 384 multiply-adds): measured on a Xeon, ~6 300 GOP/s per core
// against ~790 for vpdpbusd zmm, and tdpbf16ps ~3 100 GFLOP/s, 29× vdpbf16ps.
//
// Design, as the VNNI direct driver (gemm_direct.h): the weights are read where they lie and
// the tiles compute yᵀ. A tile's A operand is 16 rows × 64 bytes with any row stride, which is
// exactly 16 weight rows [N, K] in place (64 int8, or 32 bf16, of K each); its B operand wants
// 4-byte units of K down its rows and 16 columns across — the activations, packed once per call
// as [blocks of 32 rows][K units][32] (gemm_units.h's units: 4 int8 or 2 bf16). So each tile
// product is C[16 weight rows][16 activation rows] += W · xᵀ, and no weight byte is packed (a
// packed-panel design transposes every weight unit per call, ~14 % of a VNNI W8A8 GEMM, which
// would be ~4× that next to AMX's arithmetic).
//
// Micro-kernel: 32 weight rows × 32 activation rows, 2 × 2 tiles: per 64 bytes of K two weight
// tiles (tmm4, tmm5) and two activation tiles (tmm6, tmm7) are loaded and four products
// accumulate into tmm0..3 (the 8 tiles AMX has). The int32 (or float) sums are stored to a
// 32 × 32 scratch and the epilogue transposes them (16 × 16 zmm transposes) into rows of y.
//
// Numerics. int8: x is quantized exactly as ref::quantize_row_int8 (as signed bytes: tdpbssd
// multiplies s8 × s8, so unlike vpdpbusd no +128 correction), the int32 sums are exact, and the
// rescale is y = (float(acc) · s_x) · s_w + bias in float32 steps — bit for bit ref::linear_w8a8
// (this file is compiled with -ffp-contract=off). bf16: x and W rounded to bf16 (RNE), products
// exact in float32, sums in float32 by the tile unit (which flushes denormals, as vdpbf16ps), so
// the result equals ref::linear_bf16 up to float32 summation error.
//
// Edges: K is padded to whole 64-byte steps — the activations with zeros when packed, the weights
// through a zero-padded copy of the slab (the tile would read past the row, and for bf16
// past-the-row bytes could be NaN, which times 0 is NaN); so do slabs of fewer than 32-row
// groups, misaligned weights and formats the tiles cannot read (F32/F16 for bf16, converted);
// rows past M are zero in the packed activations and never stored.
//
// Tile set-up: amx_common.h (loaded at the start of every block).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_common.h"
#include "kernels/cpu/avx512_convert.h"
#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_units.h"

namespace klein::kernels::amx {
namespace {

constexpr int kMR = 32;               // activation rows per micro-kernel (two B tiles)
constexpr int kNR = 32;               // weight rows (columns of y) per micro-kernel (two A tiles)
constexpr int64_t kStepUnits = 16;    // 4-byte units of K per tile step (64 bytes)
constexpr int64_t kSlab = 128;        // weight rows per slab (a multiple of kNR)...
constexpr int64_t kSlabMax = 256;     // ...or twice that where short rows allow (slab_rows_for)
constexpr int64_t kItem = 384;        // columns per thread work item (split_gemm; 2 slabs at least)

// Weight rows per slab. Every activation block is read from L3 once per slab, and that stream is
// what bounds these GEMMs (results.md), so W8A8 takes kSlabMax rows (long rows in K chunks, as
// before); 2 threads, 2 MB L2, ms against 128 rows: K = 3072, M = 1536, N = 9216 19.4-21.2 →
// 17.3-19.1; M = 768, N = 3072 3.38-3.56 → 3.03-3.17; M = 4608, N = 3072 22.5-24.4 → 20.2-22.4;
// M = 512, K = 2560, N = 9728 5.28-5.58 → 5.16-5.28; M = 1536, K = 9216, N = 3072 22.5-23.2 →
// 21.4-21.8; K = 12288 27.5-29.3 → 26.2-28.2. bf16 (twice the bytes per product) was no faster
// with 256 rows at K = 3072 (38.2-40.4 against 39.0-39.6 ms), so it takes them only where they
// fit 3/8 of the L2 whole (K ≤ 1536 with 2 MB).
inline int64_t slab_rows_for(bool int8, int64_t row_bytes) {
  return int8 || kSlabMax * row_bytes <= l2_cache_bytes() * 3 / 8 ? kSlabMax : kSlab;
}

// The weight rows of one slab as the tiles read them: rows `ld` bytes apart (ld a multiple of 64,
// rows on cache lines), each readable for `steps` whole 64-byte steps. Group g's two A tiles
// (16 rows each) start at rows + g · group and rows + g · group + second: 32 consecutive rows
// (group = 32 · ld, second = 16 · ld), or for the fused SwiGLU in place 16 gate rows and the 16
// up rows F rows further (group = 16 · ld, second = F · ld).
struct SlabRows {
  const uint8_t* rows = nullptr;
  int64_t ld = 0, steps = 0, group = 0, second = 0;
  bool in_place = false;  // rows are the weight's own storage
};

// Partial sums of a 32 × 32 block over tile steps [s0, s1): c[n][m] (n: weight row, m: activation row), 32 × 4 bytes
// apart, start from `cin` (null: zero) and go to `cout`. a: the block's packed activations
// [KU][32] units (KU a multiple of kStepUnits). pf->step() once per kPfSteps steps: the driver's
// prefetch of the next slab, spread thin (all of a tile's share at once stalled on the fill
// buffers: 38 % of the driver's samples sat on it). store->step() once per kStoreSteps steps:
// a piece of the previous block's epilogue (BlockStore), whose vector work then overlaps these
// tile products.
constexpr int64_t kPfSteps = 4;
constexpr int64_t kStoreSteps = 8;  // a multiple of kPfSteps
template <bool kInt8, class Store>
__attribute__((noinline)) void tile_32x32(const uint8_t* w, int64_t ldw, int64_t second, int64_t s0, int64_t s1,
                                          const uint32_t* a, SlicePrefetch* pf, SlicePrefetch* pf2, Store* store,
                                          const void* cin, void* cout) {
  if (cin)
    amx_acc_load(cin, kMR * 4);
  else
    amx_acc_zero();
  // Step i: weight rows 0-15 / 16-31 (at w / w + second) × 64 bytes of K at + 64 i; activation
  // units [16 i, 16 i + 16) of rows 0-15 / 16-31 of the block.
  auto step = [&](int64_t i) {
    const uint8_t* wp = w + i * 64;
    const uint32_t* ap = a + i * kStepUnits * kMR;
    amx_step<kInt8>(wp, wp + second, ldw, ap, ap + 16, kMR * 4);
  };
  int64_t s = s0;
  for (; s + kPfSteps <= s1; s += kPfSteps) {
    pf->step();
    pf2->step();
    for (int64_t i = s; i < s + kPfSteps; ++i) step(i);
    if ((s - s0) % kStoreSteps == kStoreSteps - kPfSteps) store->step();
  }
  for (; s < s1; ++s) step(s);
  amx_acc_store(cout, kMR * 4);  // c[n][m]: tmm0 n 0-15 m 0-15, tmm1 m 16-31, tmm2 / tmm3 n 16-31
}

// One output value from a block sum v of activation row m (16 weight rows along the lanes):
// int8: (float(acc) · sx[m]) · sw + bias; bf16: acc + bias.
template <bool kInt8>
inline __m512 rescale(__m512i v, float sx, __m512 vw, __m512 vb) {
  if constexpr (kInt8) {
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(sx));
    return _mm512_add_ps(_mm512_mul_ps(t, vw), vb);
  } else {
    return _mm512_add_ps(_mm512_castsi512_ps(v), vb);
  }
}

// A finished block's epilogue, y[rows × cols] from its sums c[n][m], kept to be run in pieces
// (16 × 16 quarters, amx_store_transposed; SwiGLU: per 16 rows the gate values, then the up
// values and products, amx_store_swiglu) between the next block's tile steps (tile_32x32), so
// that its transposes, rescales and stores overlap the tile unit's products instead of following
// them: in a stand-alone loop of the GEMM's pattern the store in line took 12-14 % of the time,
// 6-9 % so interleaved. The caller double-buffers c. Each value is rescale<kInt8>'s with sw[n]
// and bias[n] (SwiGLU: _u for the up columns), so the bits are the in-line store's.
template <bool kInt8, bool kSwiglu>
struct BlockStore {
  const uint32_t* c = nullptr;
  const float* sx = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int rows = 0, cols = 0, pieces = 0, done = 0;
  __m512 vw[2], vb[2];  // per 16 columns (SwiGLU: gate, up)
  alignas(64) float gate[kSwiglu ? 16 : 1][16];  // SwiGLU: the gate values between pieces

  void set(const uint32_t* c_, int rows_, int cols_, const float* sx_, const float* sw, const float* sw_u,
           const float* bias, const float* bias_u, float* y_, int64_t ldy_) {
    c = c_, rows = rows_, cols = cols_, sx = sx_, y = y_, ldy = ldy_, done = 0;
    for (int q = 0; q < 2; ++q) {
      // SwiGLU: q is the half (gate, up), over the same columns; else columns 16q ...
      const __mmask16 cm = col_mask(kSwiglu ? cols : std::max(0, cols - q * 16));
      const float* b = kSwiglu ? (q ? bias_u : bias) : (bias ? bias + q * 16 : nullptr);
      const float* w = kSwiglu ? (q ? sw_u : sw) : sw + q * 16;
      vb[q] = b ? _mm512_maskz_loadu_ps(cm, b) : _mm512_setzero_ps();
      vw[q] = kInt8 ? _mm512_maskz_loadu_ps(cm, w) : _mm512_setzero_ps();
    }
    pieces = kSwiglu ? amx_swiglu_pieces(rows) : amx_store_pieces(rows, cols);
  }
  void piece(int p) {
    auto val = [&](__m512i v, int m, int q) { return rescale<kInt8>(v, sx[m], vw[q], vb[q]); };
    if constexpr (kSwiglu)
      amx_store_swiglu_piece(c, rows, cols, y, ldy, val, gate, p);
    else
      amx_store_transposed_piece(c, rows, cols, y, ldy, val, p);
  }
  void step() {
    if (done < pieces) piece(done++);
  }
  void finish() {
    while (done < pieces) piece(done++);
  }
};

// The tiles' view of a slab: weight rows [r0, r0 + n), or with kSwiglu (W = [gate; up], F rows
// each) output columns [r0, r0 + n), i.e. gate rows r0 .. and up rows F + r0 .. in 16-row
// halves of each group. In place when the format is the tiles' own, n fills whole groups (32
// rows; 16 columns) and every row starts on a cache line, else a (converted) copy zero-padded to
// whole 32-row groups (SwiGLU: 16 gate rows, then their 16 up rows) and 64-byte steps. row_bytes
// = bytes of K per row in the tiles' element type.
template <bool kInt8, bool kSwiglu>
SlabRows slab_rows(const Weight& W, int64_t r0, int64_t n, int64_t K, int64_t row_bytes, UnitScratch& conv) {
  const int64_t step_bytes = kStepUnits * 4;
  const int64_t F = W.rows() / 2, per_group = kSwiglu ? 16 : kNR;
  const bool native = kInt8 ? W.dtype == DType::kQ8Row : W.dtype == DType::kBF16;
  SlabRows s;
  // In place only when every tile row starts on a cache line: a misaligned tile load touches two
  // lines per row (a stand-alone 2 × 2 tile loop ran ~40 % slower with a 16-byte offset; in the
  // GEMM the per-slab copy cost about what it saved). Safetensors data is only 8-byte aligned;
  // klein's own writers pad the header so that tensor data starts on 64 bytes.
  const bool aligned = reinterpret_cast<uintptr_t>(W.data) % 64 == 0 && row_bytes % 64 == 0;
  if (native && n % per_group == 0 && aligned) {
    s.rows = static_cast<const uint8_t*>(W.data) + r0 * row_bytes;
    s.ld = row_bytes;
    s.steps = row_bytes / step_bytes;
    s.group = per_group * row_bytes;
    s.second = kSwiglu ? F * row_bytes : 16 * row_bytes;
    s.in_place = true;
    return s;
  }
  const int64_t ld = (row_bytes + step_bytes - 1) / step_bytes * step_bytes;
  const int64_t groups = (n + per_group - 1) / per_group;
  uint8_t* d = conv.get<uint8_t>(groups * kNR * ld);
  std::memset(d, 0, groups * kNR * ld);
  // Slab row j → copy row: j itself, or for SwiGLU gate column j at 32 (j / 16) + j % 16 and its
  // up row 16 further.
  auto put = [&](int64_t wrow, int64_t dst) {
    if (native) {
      std::memcpy(d + dst * ld, static_cast<const uint8_t*>(W.data) + wrow * row_bytes, row_bytes);
    } else {  // bf16 tiles from F32 / F16 / ... weights: expanded to float32, rounded to bf16
      static thread_local UnitScratch row;
      float* f = row.get<float>(K);
      weight_row_f32(W, wrow, K, f);
      f32_to_bf16_row(f, K, reinterpret_cast<uint16_t*>(d + dst * ld));
    }
  };
  for (int64_t j = 0; j < n; ++j) {
    if constexpr (kSwiglu) {
      put(r0 + j, kNR * (j / 16) + j % 16);
      put(F + r0 + j, kNR * (j / 16) + 16 + j % 16);
    } else {
      put(r0 + j, j);
    }
  }
  s.rows = d;
  s.ld = ld;
  s.steps = ld / step_bytes;
  s.group = kNR * ld;
  s.second = 16 * ld;
  return s;
}

// y[m0:m1, n0:n1] (m0 % kMR == 0), blocked as a GotoBLAS GEMM: slabs of `slab` weight rows;
// per slab, K in chunks whose rows fit half the L2 (with 2 MB: rows up to 8 KB whole, so the
// DiT's K = 3072 is one chunk; a quarter measured 1-4 points of the tile peak lower); per chunk,
// every 32-row activation block runs across the slab's 32-row groups, the partial sums of each
// (block, group) parked in `part` between chunks. Without the chunks, a slab of long rows held
// few groups (32 rows at bf16 K = 9216) and every activation block was streamed from L3 once per
// 32 weight rows (bf16 K = 9216: 1 200 GFLOP/s at M = 768).
// kSwiglu: W = [gate; up] (F rows each), y = out [M, F] and [n0, n1) its columns: a slab is
// slab / 2 columns (their gate and up rows, slab weight rows), a group 16 columns.
template <bool kInt8, bool kSwiglu>
void amx_block(const uint32_t* qa, int64_t KU, const float* sx, int64_t m0, int64_t m1, int64_t K, const Weight& W,
               int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, int64_t slab) {
  amx_configure_tiles();
  const int64_t row_bytes = kInt8 ? K : 2 * K;
  const int64_t F = W.rows() / 2;
  const int64_t SL = kSwiglu ? slab / 2 : slab, per_group = kSwiglu ? 16 : kNR;  // in columns of y
  const int64_t KC = std::max<int64_t>(8, l2_cache_bytes() / 2 / (slab * 64));  // tile steps per chunk
  const int64_t nblk = (m1 - m0 + kMR - 1) / kMR;
  static thread_local UnitScratch conv, part_buf;
  alignas(64) uint32_t c[2][kNR * kMR];  // sums of the block being computed / being stored
  BlockStore<kInt8, kSwiglu> store[2];
  int cur = 0;  // store[cur ^ 1] (of c[cur ^ 1]) runs during the next tile loop
  alignas(64) float sw[kSlabMax];  // rows' scales; SwiGLU: the gate rows' then (from SL) the up rows'
  for (int64_t sb = n0; sb < n1; sb += SL) {
    const int64_t sn = std::min(SL, n1 - sb), ng = (sn + per_group - 1) / per_group;
    const SlabRows s = slab_rows<kInt8, kSwiglu>(W, sb, sn, K, row_bytes, conv);
    if constexpr (kInt8) {
      scales_to_f32(W.scales, W.scale_dtype, sb, sn, sw);
      if constexpr (kSwiglu) scales_to_f32(W.scales, W.scale_dtype, F + sb, sn, sw + SL);
    }
    const bool chunked = s.steps > KC;
    uint32_t* part = chunked ? part_buf.get<uint32_t>(nblk * ng * kNR * kMR) : nullptr;  // [block][group][32][32]
    for (int64_t k0 = 0; k0 == 0 || k0 < s.steps; k0 += KC) {
      const int64_t k1 = std::min(s.steps, k0 + KC);
      const bool last = k1 == s.steps;
      // The next chunk's weight bytes (or the next slab's first chunk) stream into L2 meanwhile,
      // when the rows are read in place (SwiGLU: its gate rows by pf, its up rows by pf2).
      const uint8_t* pbase = s.rows;
      int64_t prow = 0, pbytes = 0;
      if (s.in_place && !last) {
        pbase = s.rows + k1 * 64, prow = sn, pbytes = (std::min(s.steps, k1 + KC) - k1) * 64;
      } else if (s.in_place && sb + SL < n1) {
        pbase = s.rows + SL * row_bytes, prow = std::min(SL, n1 - sb - SL), pbytes = std::min(s.steps, KC) * 64;
      }
      const int64_t pf_steps = nblk * ng * std::max<int64_t>(1, (k1 - k0) / kPfSteps);
      SlicePrefetch pf(pbase, row_bytes, prow, pbytes, pf_steps);
      SlicePrefetch pf2(kSwiglu ? pbase + F * row_bytes : pbase, row_bytes, prow, kSwiglu ? pbytes : 0, pf_steps);
      for (int64_t m = m0; m < m1; m += kMR) {
        const int64_t mb = (m - m0) / kMR;
        const uint32_t* a = qa + (m / kMR) * KU * kMR;
        const int rows = static_cast<int>(std::min<int64_t>(kMR, m1 - m));
        for (int64_t g = 0; g < ng; ++g) {
          const int64_t nb = g * per_group;
          uint32_t* pn = chunked ? part + (mb * ng + g) * kNR * kMR : nullptr;
          tile_32x32<kInt8>(s.rows + g * s.group, s.ld, s.second, k0, k1, a, &pf, &pf2, &store[cur ^ 1],
                            k0 > 0 ? pn : nullptr, last ? c[cur] : pn);
          store[cur ^ 1].finish();
          if (!last) continue;
          const int cols = static_cast<int>(std::min<int64_t>(per_group, sn - nb));
          // sw is the slab's: set() takes its values now, before the next slab overwrites it.
          store[cur].set(c[cur], rows, cols, sx + m, sw + nb, kSwiglu ? sw + SL + nb : nullptr,
                         bias ? bias + sb + nb : nullptr, kSwiglu && bias ? bias + F + sb + nb : nullptr,
                         y + m * ldy + sb + nb, ldy);
          cur ^= 1;
        }
      }
    }
  }
  store[cur ^ 1].finish();
}

// The whole linear (kernels.h semantics): x packed into [blocks][KU][32] units (int8: quantized
// per row; bf16: rounded), K padded with zeros to whole tile steps, then amx_block over a split
// (kSwiglu: of out's F columns, W = [gate; up]).
template <bool kInt8, bool kSwiglu>
void amx_linear(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias, float* y, ThreadPool& pool,
                int64_t ldx, int64_t ldy) {
  const int64_t elems_per_unit = kInt8 ? 4 : 2;
  const int64_t KU = ((K + elems_per_unit - 1) / elems_per_unit + kStepUnits - 1) / kStepUnits * kStepUnits;
  const int64_t blocks = (M + kMR - 1) / kMR;
  static thread_local UnitScratch qa_buf, sx_buf;
  uint32_t* qa = qa_buf.get<uint32_t>(blocks * KU * kMR);
  float* sx = sx_buf.get<float>(blocks * kMR);
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    static thread_local UnitScratch rows_buf;
    for (int64_t b = b0; b < b1; ++b) {
      const int n = static_cast<int>(std::min<int64_t>(kMR, M - b * kMR));
      for (int r = n; r < kMR; ++r) sx[b * kMR + r] = 0.0f;
      if constexpr (kInt8) {
        // The row's scale needs its whole |max| first: quantized row-major, then transposed.
        uint8_t* rows = rows_buf.get<uint8_t>(kMR * KU * 4);  // [32][KU · 4 bytes]
        for (int r = 0; r < n; ++r)
          quantize_row_int8_z(x + (b * kMR + r) * ldx, K, KU * 4, rows + r * KU * 4, &sx[b * kMR + r], 0);
        pack_units_z(rows, KU * 4, n, 0, KU, qa + b * KU * kMR);  // zero above row n
      } else {
        // bf16: rounded as the units are transposed, 32 floats of a row per 16 units (no
        // row-major bf16 copy: it and its pass were ~3.4 % of a 512² bf16 + fast image), by
        // vcvtne2ps2bf16 (avx512_convert.h: x only feeds tdpbf16ps); past K the masked loads
        // give zeros.
        const float* xb = x + b * kMR * ldx;
        pack_panel_z(n, KU, qa + b * KU * kMR,
                     [&](int j, int64_t q, int) { return bf16_units16_ftz_at(xb + j * ldx, 2 * q, K); });
      }
    }
  });
  const int64_t N = kSwiglu ? W.rows() / 2 : W.rows();
  const int64_t slab = slab_rows_for(kInt8, kInt8 ? K : 2 * K), item = std::max(kItem, 2 * slab);
  split_gemm(M, N, kMR, kSwiglu ? 16 : kNR, kSwiglu ? item / 2 : item, pool,
             [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
               amx_block<kInt8, kSwiglu>(qa, KU, sx, m0, m1, K, W, n0, n1, bias, y, ldy, slab);
             });
}

}  // namespace

void linear_q8(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
               ThreadPool& pool, int64_t ldx, int64_t ldy) {
  amx_linear<true, false>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

void linear_bf16(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* y,
                 ThreadPool& pool, int64_t ldx, int64_t ldy) {
  amx_linear<false, false>(x, M, K, W, bias_f32, y, pool, ldx, ldy);
}

// The epilogue applies EltwiseSimd<V16>::silu_v itself, which is the AVX-512 set's silu_mul (the
// one an AMX kernel set has), so silu_mul is not called.
bool linear_q8_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                      ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn) {
  amx_linear<true, true>(x, M, K, W, bias_f32, out, pool, ldx, ldo);
  return true;
}

bool linear_bf16_swiglu(const float* x, int64_t M, int64_t K, const Weight& W, const float* bias_f32, float* out,
                        ThreadPool& pool, int64_t ldx, int64_t ldo, SiluMulFn) {
  amx_linear<false, true>(x, M, K, W, bias_f32, out, pool, ldx, ldo);
  return true;
}

}  // namespace klein::kernels::amx
