// The integer arithmetic of the fast GGUF linear (Precision::kFast on ggml block weights: Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K), shared by the scalar reference (ref::linear_ggml) and the
// SIMD kernels (gemm_ggml_*.cpp), which must all give the same bits.
//
// As llama.cpp computes these formats: the activations are quantized to int8 per block — blocks
// of 32 with an fp16 scale for the 32-element formats (block_q8_0, as ggml's x86
// quantize_row_q8_0: d = fp16(amax / 127), q = round-half-even(x · (127 / amax))), blocks of 256
// with a float scale for the K-quants (block_q8_K, quantize_row_q8_K_ref: iscale = −127 / max
// where max is the element of largest |x|, q = min(127, round-half-even(iscale · x)),
// d = 1 / iscale) — and each weight block is an int8 dot product per sub-block with the
// sub-block's scale. Every format is brought to one form, a row at a time:
//
//   w[k]   the weight's integer code as a signed byte (Q4_0: q − 8, Q6_K: q − 32, Q3_K: q − 4·!h,
//          Q4_K: q, ...), so that dequant(W)[k] = fw_j · w[k] + o_j · 1 for k in sub-block j;
//   fw_j   the sub-block's float scale (Q8_0 / Q4_0: d; Q4_K: d · sc_j; Q6_K: d · sc_j; ...);
//   o_j    the sub-block's float offset where the format has one (Q4_1 / Q5_1: m; Q2_K, Q4_K,
//          Q5_K: −(dmin · m_j)), else none (`mins` false);
//
// and then, per output y[m, n], over the sub-blocks j of K in order, each step rounded to float32
// (std::fma / vfmadd: one rounding):
//
//   c_j = Σ_{k∈j} q[k] · w[k]                       (int32, exact)
//   f   = fma(float(c_j), fw_j · dx_j, f)            (dx_j: the activation scale of j's block)
//   f   = fma(xs_j, o_j, f)     where mins,           xs_j = dx_j · float(Σ_{k∈j} q[k])
//   y   = f + bias[n]
//
// — x_q · dequant(W)ᵀ exactly up to float32 rounding. Sub-blocks are 32 elements (16 for Q2_K,
// Q3_K, Q6_K, whose scales are per 16). The float steps are ours (ggml sums a block's integer
// products with their sub-block scales in int32 before one float multiply; Q4_1 / Q5_1 use ggml's
// block_q8_1 sums in fp16 there): the integer dot products and activation codes are llama.cpp's.
//
// Plain C++ with internal linkage: included by the reference and by each SIMD file, compiled with
// that file's flags (the results are exact IEEE operations either way; no sum to contract).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/format.h"
#include "core/weight.h"

namespace klein::kernels::ggml_dot {
namespace {

// How a format's integer codes enter a SIMD dot product: kSigned codes span the full int8 range
// (Q8_0: AVX2 multiplies by |w| with the activation's sign moved); kOffset codes are small
// signed ones that become unsigned bytes w + off (AVX2's vpmaddubsw wants its first operand
// unsigned), the activations' off · Σ q then subtracted; kMins codes are unsigned already and
// the format has per-sub-block offsets o_j.
enum class Kind : uint8_t { kSigned, kOffset, kMins };

struct Form {
  int sub = 32;         // elements per sub-block: one int32 dot product, one fw_j (and o_j)
  int act_block = 32;   // elements per activation scale: 32 (block_q8_0) or 256 (block_q8_K)
  Kind kind = Kind::kSigned;
  int off = 0;          // kOffset: w + off ≥ 0 (AVX2); 0 otherwise
  int umax = 127;       // the largest code as AVX2 multiplies it (w + off; kSigned: |w| ≤ 128)
  bool mins() const { return kind == Kind::kMins; }
};

// The form of a ggml block format; false for every other format.
inline bool form_of(DType t, Form* f) {
  switch (t) {
    case DType::kQ8_0: *f = {32, 32, Kind::kSigned, 0, 128}; return true;
    case DType::kQ4_0: *f = {32, 32, Kind::kOffset, 8, 15}; return true;
    case DType::kQ4_1: *f = {32, 32, Kind::kMins, 0, 15}; return true;
    case DType::kQ5_0: *f = {32, 32, Kind::kOffset, 16, 31}; return true;
    case DType::kQ5_1: *f = {32, 32, Kind::kMins, 0, 31}; return true;
    case DType::kQ2_K: *f = {16, 256, Kind::kMins, 0, 3}; return true;
    case DType::kQ3_K: *f = {16, 256, Kind::kOffset, 4, 7}; return true;
    case DType::kQ4_K: *f = {32, 256, Kind::kMins, 0, 15}; return true;
    case DType::kQ5_K: *f = {32, 256, Kind::kMins, 0, 31}; return true;
    case DType::kQ6_K: *f = {16, 256, Kind::kOffset, 32, 63}; return true;
    default: return false;
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// One row of activations (K a multiple of f.act_block): codes q [K], and per sub-block j the
// activation scale dx[j], xs[j] = dx[j] · Σ q (mins formats; may be null otherwise) and
// bsum[j] = Σ q (may be null). A block with a NaN or infinity gets q = 0 and dx = NaN, so its
// outputs are NaN, as a float GEMM's would be non-finite.
inline void quantize_act(const Form& f, const float* x, int64_t K, int8_t* q, float* dx, float* xs, int32_t* bsum) {
  const int per = f.act_block / f.sub;  // sub-blocks per activation block
  const int n = f.act_block;
  for (int64_t b0 = 0; b0 < K; b0 += n) {
    const float* xb = x + b0;
    int8_t* qb = q + b0;
    // amax as the largest |x| bit pattern (an integer max, which the SIMD files' compilers
    // vectorize; a float one they keep scalar): above that of FLT_MAX is an inf or a NaN.
    uint32_t abits = 0;
    for (int j = 0; j < n; ++j) abits = std::max(abits, std::bit_cast<uint32_t>(xb[j]) & 0x7fffffffu);
    const float amax = std::bit_cast<float>(abits);
    float d;
    if (abits > 0x7f7fffffu) {
      std::fill(qb, qb + n, int8_t{0});
      d = std::numeric_limits<float>::quiet_NaN();
    } else if (n == 32) {  // block_q8_0 (x86 form)
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (int j = 0; j < 32; ++j) qb[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
      d = f16_to_f32(f32_to_f16(amax / 127.0f));
    } else if (abits == 0) {  // block_q8_K of zeros
      std::fill(qb, qb + n, int8_t{0});
      d = 0.0f;
    } else {  // block_q8_K: max is the first element of largest |x|, sign included
      float mx = amax;
      for (int j = 0; j < n; ++j)
        if ((std::bit_cast<uint32_t>(xb[j]) & 0x7fffffffu) == abits) {
          mx = xb[j];
          break;
        }
      const float iscale = -127.0f / mx;
      for (int j = 0; j < n; ++j) qb[j] = static_cast<int8_t>(std::min(127.0f, std::nearbyint(iscale * xb[j])));
      d = 1.0f / iscale;
    }
    for (int s = 0; s < per; ++s) {
      const int64_t j = b0 / f.sub + s;
      int32_t t = 0;
      for (int k = 0; k < f.sub; ++k) t += qb[s * f.sub + k];
      dx[j] = d;
      if (xs) xs[j] = d * static_cast<float>(t);
      if (bsum) bsum[j] = t;
    }
  }
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j of the 12 packed bytes p (ggml's
// get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* p, int* d, int* m) {
  if (j < 4) {
    *d = p[j] & 63;
    *m = p[j + 4] & 63;
  } else {
    *d = (p[j + 4] & 0xF) | ((p[j - 4] >> 6) << 4);
    *m = (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
  }
}

// Row r of W in the form above: w [K] codes, fw [K / sub] scales, o [K / sub] offsets (mins
// formats; untouched otherwise). Transcribes format_gguf.cpp's dequantisers (ggml's layouts).
inline void unpack_row(const Weight& W, int64_t r, int8_t* w, float* fw, float* o) {
  const int64_t K = W.cols(), bb = W.format().block_bytes, be = W.format().block_elems;
  const uint8_t* row = static_cast<const uint8_t*>(W.data) + r * W.row_bytes();
  for (int64_t b = 0; b < K / be; ++b, w += be) {
    const uint8_t* x = row + b * bb;
    switch (W.dtype) {
      case DType::kQ8_0:
        fw[b] = half_at(x);
        std::memcpy(w, x + 2, 32);
        break;
      case DType::kQ4_0:
      case DType::kQ4_1: {
        const bool q41 = W.dtype == DType::kQ4_1;
        const uint8_t* qs = x + (q41 ? 4 : 2);
        const int s = q41 ? 0 : 8;
        fw[b] = half_at(x);
        if (q41) o[b] = half_at(x + 2);
        for (int j = 0; j < 16; ++j) {
          w[j] = static_cast<int8_t>((qs[j] & 0xF) - s);
          w[j + 16] = static_cast<int8_t>((qs[j] >> 4) - s);
        }
        break;
      }
      case DType::kQ5_0:
      case DType::kQ5_1: {
        const bool q51 = W.dtype == DType::kQ5_1;
        uint32_t qh;
        std::memcpy(&qh, x + (q51 ? 4 : 2), 4);
        const uint8_t* qs = x + (q51 ? 8 : 6);
        const int s = q51 ? 0 : 16;
        fw[b] = half_at(x);
        if (q51) o[b] = half_at(x + 2);
        for (int j = 0; j < 16; ++j) {
          const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
          w[j] = static_cast<int8_t>(((qs[j] & 0xF) | h0) - s);
          w[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | h1) - s);
        }
        break;
      }
      case DType::kQ2_K: {  // {sc[16]; qs[64]; d; dmin}: sub-block is = 16 elements
        const float d = half_at(x + 80), dmin = half_at(x + 82);
        const uint8_t* q = x + 16;
        int is = 0;
        int8_t* out = w;
        for (int h = 0; h < 2; ++h, q += 32)
          for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; ++half, ++is) {
              fw[b * 16 + is] = d * static_cast<float>(x[is] & 0xF);
              o[b * 16 + is] = -(dmin * static_cast<float>(x[is] >> 4));
              for (int l = 0; l < 16; ++l) *out++ = static_cast<int8_t>((q[l + 16 * half] >> shift) & 3);
            }
        break;
      }
      case DType::kQ3_K: {  // {hmask[32]; qs[64]; scales[12]; d}
        const uint8_t* hm = x;
        const uint8_t* q = x + 32;
        const uint8_t* packed = x + 96;
        const float d = half_at(x + 108);
        for (int s = 0; s < 16; ++s) {
          const int lo = (packed[s % 8] >> (4 * (s / 8))) & 0x0F;
          const int hi = (packed[8 + s % 4] >> (2 * (s / 4))) & 0x03;
          fw[b * 16 + s] = d * static_cast<float>((lo | (hi << 4)) - 32);
        }
        int8_t* out = w;
        uint8_t m = 1;
        for (int h = 0; h < 2; ++h, q += 32)
          for (int shift = 0; shift < 8; shift += 2, m <<= 1)
            for (int half = 0; half < 2; ++half)
              for (int l = 0; l < 16; ++l) {
                const int i = l + 16 * half;
                *out++ = static_cast<int8_t>(((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
              }
        break;
      }
      case DType::kQ4_K:
      case DType::kQ5_K: {  // {d; dmin; scales[12]; (Q5_K: qh[32];) qs[128]}
        const bool q5 = W.dtype == DType::kQ5_K;
        const float d = half_at(x), dmin = half_at(x + 2);
        const uint8_t* sc = x + 4;
        const uint8_t* qh = x + 16;
        const uint8_t* q = x + (q5 ? 48 : 16);
        for (int is = 0; is < 8; is += 2, q += 32) {
          for (int t = 0; t < 2; ++t) {
            int s, m;
            scale_min_k4(is + t, sc, &s, &m);
            fw[b * 8 + is + t] = d * static_cast<float>(s);
            o[b * 8 + is + t] = -(dmin * static_cast<float>(m));
            const int bit = is + t;  // qh bit of this sub-block
            for (int l = 0; l < 32; ++l) {
              const int lo = t ? q[l] >> 4 : q[l] & 0xF;
              w[(is + t) * 32 + l] = static_cast<int8_t>(lo + (q5 && (qh[l] >> bit) & 1 ? 16 : 0));
            }
          }
        }
        break;
      }
      case DType::kQ6_K: {  // {ql[128]; qh[64]; scales[16] (int8); d}
        const float d = half_at(x + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
        for (int s = 0; s < 16; ++s) fw[b * 16 + s] = d * static_cast<float>(sc[s]);
        const uint8_t* ql = x;
        const uint8_t* qh = x + 128;
        for (int h = 0; h < 2; ++h, ql += 64, qh += 32) {
          int8_t* y = w + h * 128;
          for (int l = 0; l < 32; ++l) {
            y[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
        break;
      }
      default: break;
    }
  }
}

}  // namespace
}  // namespace klein::kernels::ggml_dot
