#include "core/format_gguf.h"

#include <cstring>

#include "core/weight.h"

namespace klein::ggml_rows {
namespace {

// The blocks of row r from element c0 on, and their size (a mapped GGUF tensor is only
// `general.alignment`-aligned, and blocks of 18 or 34 bytes leave later ones unaligned: every
// multi-byte field is read through memcpy).
struct BlockWalk {
  const uint8_t* first;
  int64_t block_bytes;
};
BlockWalk walk(const Weight& w, int64_t r, int64_t c0, int64_t block_elems) {
  const int64_t bb = w.format().block_bytes;
  return {static_cast<const uint8_t*>(w.data) + r * w.row_bytes() + c0 / block_elems * bb, bb};
}

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j of the 12 packed bytes q
// (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

// block_q8_0 {f16 d; int8 qs[32]}: y = qs · d.
void q8_0(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQK);
  for (int64_t k = 0; k < n / kQK; ++k, out += kQK) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x);
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(x[2 + j])) * d;
  }
}

// block_q4_0 {f16 d; u8 qs[16]}: low nibbles are elements 0-15, high nibbles 16-31, q - 8.
void q4_0(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQK);
  for (int64_t k = 0; k < n / kQK; ++k, out += kQK) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x);
    const uint8_t* qs = x + 2;
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      out[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

// block_q4_1 {f16 d; f16 m; u8 qs[16]}: y = q · d + m.
void q4_1(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQK);
  for (int64_t k = 0; k < n / kQK; ++k, out += kQK) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x), m = half_at(x + 2);
    const uint8_t* qs = x + 4;
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      out[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// block_q5_0 {f16 d; u32 qh; u8 qs[16]}: bit j of qh is the fifth bit of element j; q - 16.
void q5_0(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQK);
  for (int64_t k = 0; k < n / kQK; ++k, out += kQK) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x);
    uint32_t qh;
    std::memcpy(&qh, x + 2, 4);
    const uint8_t* qs = x + 6;
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = ((qh >> j) << 4) & 0x10, xh1 = (qh >> (j + 12)) & 0x10;
      out[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
      out[j + 16] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
    }
  }
}

// block_q5_1 {f16 d; f16 m; u32 qh; u8 qs[16]}: y = q · d + m.
void q5_1(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQK);
  for (int64_t k = 0; k < n / kQK; ++k, out += kQK) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x), m = half_at(x + 2);
    uint32_t qh;
    std::memcpy(&qh, x + 4, 4);
    const uint8_t* qs = x + 8;
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = ((qh >> j) << 4) & 0x10, xh1 = (qh >> (j + 12)) & 0x10;
      out[j] = static_cast<float>((qs[j] & 0x0F) | xh0) * d + m;
      out[j + 16] = static_cast<float>((qs[j] >> 4) | xh1) * d + m;
    }
  }
}

// block_q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: 16 groups of 16, each a 4-bit scale and
// a 4-bit min; y = d·sc · q - dmin·m with 2-bit q.
void q2_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQKK);
  for (int64_t k = 0; k < n / kQKK; ++k) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const uint8_t* sc = x;
    const uint8_t* q = x + 16;
    const float d = half_at(x + 80), dmin = half_at(x + 82);
    int is = 0;
    for (int h = 0; h < 2; ++h, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t s = sc[is++];
          const float dl = d * static_cast<float>(s & 0xF), ml = dmin * static_cast<float>(s >> 4);
          for (int l = 0; l < 16; ++l)
            *out++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16 * half] >> shift) & 3)) - ml;
        }
      }
    }
  }
}

// block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 groups of 16 with 6-bit signed
// scales (packed: low nibbles in bytes 0-7, high pairs in 8-11); q is 2 bits of qs, minus 4
// where the hmask bit is clear.
void q3_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQKK);
  for (int64_t k = 0; k < n / kQKK; ++k) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const uint8_t* hm = x;
    const uint8_t* q = x + 32;
    const uint8_t* packed = x + 96;
    const float d_all = half_at(x + 108);
    int8_t scales[16];
    for (int s = 0; s < 16; ++s) {
      const int lo = (packed[s % 8] >> (4 * (s / 8))) & 0x0F;
      const int hi = (packed[8 + s % 4] >> (2 * (s / 4))) & 0x03;
      scales[s] = static_cast<int8_t>((lo | (hi << 4)) - 32);
    }
    int is = 0;
    uint8_t m = 1;
    for (int h = 0; h < 2; ++h, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scales[is++]);
          for (int l = 0; l < 16; ++l) {
            const int i = l + 16 * half;
            *out++ = dl * static_cast<float>(static_cast<int8_t>((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

// block_q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: 8 groups of 32 with 6-bit scales and
// mins; y = d·sc · q - dmin·m.
void q4_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQKK);
  for (int64_t k = 0; k < n / kQKK; ++k) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x), dmin = half_at(x + 2);
    const uint8_t* sc = x + 4;
    const uint8_t* q = x + 16;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t s, m;
      scale_min_k4(is, sc, &s, &m);
      const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
      scale_min_k4(is + 1, sc, &s, &m);
      const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *out++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *out++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// block_q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K with a fifth bit
// per element from qh.
void q5_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQKK);
  for (int64_t k = 0; k < n / kQKK; ++k) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const float d = half_at(x), dmin = half_at(x + 2);
    const uint8_t* sc = x + 4;
    const uint8_t* qh = x + 16;
    const uint8_t* ql = x + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t s, m;
      scale_min_k4(is, sc, &s, &m);
      const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
      scale_min_k4(is + 1, sc, &s, &m);
      const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *out++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *out++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

// block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: 6-bit q (4 low bits in ql, 2 high in
// qh) minus 32, 16 groups of 16 with signed 8-bit scales; y = d·sc · q.
void q6_k(const Weight& w, int64_t r, int64_t c0, int64_t n, float* out) {
  const BlockWalk b = walk(w, r, c0, kQKK);
  for (int64_t k = 0; k < n / kQKK; ++k, out += kQKK) {
    const uint8_t* x = b.first + k * b.block_bytes;
    const uint8_t* ql = x;
    const uint8_t* qh = x + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
    const float d = half_at(x + 208);
    float* y = out;
    for (int h = 0; h < 2; ++h, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

int half_fields(DType t, int offs[2]) {
  struct Row {
    DType t;
    int n, a, b;
  };
  // ggml-common.h's block_q* structs.
  static constexpr Row kRows[] = {
      {DType::kQ8_0, 1, 0, 0},   {DType::kQ4_0, 1, 0, 0},   {DType::kQ4_1, 2, 0, 2}, {DType::kQ5_0, 1, 0, 0},
      {DType::kQ5_1, 2, 0, 2},   {DType::kQ2_K, 2, 80, 82}, {DType::kQ3_K, 1, 108, 0}, {DType::kQ4_K, 2, 0, 2},
      {DType::kQ5_K, 2, 0, 2},   {DType::kQ6_K, 1, 208, 0},
  };
  for (const Row& r : kRows)
    if (r.t == t) {
      offs[0] = r.a;
      offs[1] = r.b;
      return r.n;
    }
  return 0;
}

}  // namespace klein::ggml_rows
