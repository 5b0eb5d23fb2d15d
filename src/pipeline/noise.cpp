#include "pipeline/noise.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

// The emulation below states every fused multiply-add explicitly (std::fma) and relies on the
// remaining products being rounded on their own, so the compiler must not contract a*b+c.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace klein {

TorchCpuGenerator::TorchCpuGenerator(uint64_t seed)
    : engine_(static_cast<std::mt19937::result_type>(seed & 0xFFFFFFFFu)) {}

double TorchCpuGenerator::normal_double() {
  if (next_double_normal_) {
    const double v = *next_double_normal_;
    next_double_normal_.reset();
    return v;
  }
  const double u1 = uniform_double();
  const double u2 = uniform_double();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 6.283185307179586 * u1;  // 2.0 * pi<double>, folded by the compiler
  next_double_normal_ = r * std::sin(theta);
  return r * std::cos(theta);
}

namespace {

inline uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
inline float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// ---- ATen AVX2 kernel: NormalFill16<float> with avx_mathfun.h, lane by lane ---------------------
// Constants are the float32 values in torch's binary; the operation sequence (including which
// mul/add pairs GCC fused into FMAs) follows the disassembly of libtorch_cpu's AVX2 kernel.

// log256_ps (Cephes logf).
float avx2_log(float x_in) {
  const bool invalid = x_in <= 0.0f;                                  // _CMP_LE_OS
  float x = x_in > from_bits(0x00800000u) ? x_in : from_bits(0x00800000u);  // max(x, min_norm_pos)
  const int32_t imm0 = static_cast<int32_t>(bits_of(x) >> 23) - 0x7f;
  x = from_bits((bits_of(x) & ~0x7f800000u) | bits_of(0.5f));
  float e = static_cast<float>(imm0);
  e = e + 1.0f;
  const bool mask = x < from_bits(0x3f3504f3u);  // SQRTHF
  const float tmp = mask ? x : 0.0f;
  e = e - (mask ? 1.0f : 0.0f);
  x = x + -1.0f;
  x = x + tmp;
  const float z = x * x;
  float y = std::fma(from_bits(0x3d9021bbu), x, from_bits(0xbdebd1b8u));  // p0 * x + p1
  y = std::fma(y, x, from_bits(0x3def251au));                          // p2
  y = std::fma(y, x, from_bits(0xbdfe5d4fu));                          // p3
  y = std::fma(y, x, from_bits(0x3e11e9bfu));                          // p4
  y = std::fma(y, x, from_bits(0xbe2aae50u));                          // p5
  y = std::fma(y, x, from_bits(0x3e4cceacu));                          // p6
  y = std::fma(y, x, from_bits(0xbe7ffffcu));                          // p7
  y = std::fma(y, x, from_bits(0x3eaaaaaau));                          // p8
  const float eq1 = e * from_bits(0xb95e8083u);                        // e * q1
  const float yx = y * x;
  y = std::fma(yx, z, eq1);
  y = std::fma(-z, 0.5f, y);
  x = x + y;
  float r = std::fma(e, from_bits(0x3f318000u), x);  // + e * q2
  if (invalid) r = from_bits(0xffffffffu);
  return r;
}

// sincos256_ps (Cephes sinf/cosf).
void avx2_sincos(float xin, float* s, float* c) {
  uint32_t sign_bit_sin = bits_of(xin) & 0x80000000u;
  const float ax = from_bits(bits_of(xin) & 0x7fffffffu);
  const float yq = ax * from_bits(0x3fa2f983u);  // 4 / pi
  int32_t j = static_cast<int32_t>(yq);      // cvttps2dq (truncation; inputs here are small)
  j = (j + 1) & ~1;
  const float yf = static_cast<float>(j);
  const uint32_t swap_sign_sin = static_cast<uint32_t>(j & 4) << 29;
  const bool poly_mask = (j & 2) == 0;
  sign_bit_sin ^= swap_sign_sin;
  float x = std::fma(yf, from_bits(0xbf490000u), ax);  // - y * DP1
  x = std::fma(yf, from_bits(0xb97da000u), x);         // - y * DP2
  x = std::fma(yf, from_bits(0xb3222169u), x);         // - y * DP3
  const uint32_t sign_bit_cos = (~static_cast<uint32_t>(j - 2) & 4u) << 29;
  const float z = x * x;
  const float tmp = z * 0.5f;
  float y = std::fma(from_bits(0x37ccf5ceu), z, from_bits(0xbab6061au));  // coscof p0 * z + p1
  y = std::fma(y, z, from_bits(0x3d2aaaa5u));                          // + p2
  y = z * y;
  y = std::fma(z, y, -tmp);
  y = y + 1.0f;
  float y2 = std::fma(from_bits(0xb94ca1f9u), z, from_bits(0x3c08839eu));  // sincof p0 * z + p1
  y2 = std::fma(y2, z, from_bits(0xbe2aaaa3u));                         // + p2
  const float y2z = z * y2;
  y2 = std::fma(x, y2z, x);
  const float ysin2 = poly_mask ? y2 : 0.0f;
  const float ysin1 = poly_mask ? 0.0f : y;
  y2 = y2 - ysin2;
  y = y - ysin1;
  const float sn = ysin2 + ysin1;
  const float cs = y2 + y;
  *s = from_bits(bits_of(sn) ^ sign_bit_sin);
  *c = from_bits(bits_of(cs) ^ sign_bit_cos);
}

void normal_fill16_avx2(float* d) {
  const float two_pi = from_bits(0x40c90fdbu);  // (float)(2 * pi)
  float out[16];
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - d[j];
    const float u2 = d[j + 8];
    const float l = avx2_log(u1);
    const float radius = std::sqrt(l * -2.0f);
    const float theta = two_pi * u2;
    float s, c;
    avx2_sincos(theta, &s, &c);
    const float n1 = radius * c;
    const float n2 = radius * s;
    out[j] = n1 + 0.0f;  // fma(n1, std = 1, mean = 0)
    out[j + 8] = n2 + 0.0f;
  }
  std::memcpy(d, out, sizeof(out));
}

// ---- ATen DEFAULT kernel: scalar NormalFill16 with libm --------------------------------------------
void normal_fill16_default(float* d) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - d[j];
    const float u2 = d[j + 8];
    const float radius = std::sqrt(-2.0f * std::log(u1));
    const float theta = static_cast<float>(6.283185307179586 * static_cast<double>(u2));
    const float c = std::cos(theta);
    const float s = std::sin(theta);
    d[j] = radius * c + 0.0f;
    d[j + 8] = radius * s + 0.0f;
  }
}

void fill16(float* d, TorchCpuKernel k) {
  if (k == TorchCpuKernel::kAvx2) {
    normal_fill16_avx2(d);
  } else {
    normal_fill16_default(d);
  }
}

}  // namespace

void torch_normal_fill(TorchCpuGenerator& gen, float* out, int64_t n, bool bf16,
                       TorchCpuKernel kernel) {
  if (n <= 0) return;
  if (n < 16) {
    // cpu_serial_kernel with at::normal_distribution<double>, cast to the tensor dtype.
    for (int64_t i = 0; i < n; ++i) {
      const float f = static_cast<float>(gen.normal_double());
      out[i] = bf16 ? round_bf16(f) : f;
    }
    return;
  }
  if (!bf16) {
    for (int64_t i = 0; i < n; ++i) out[i] = gen.uniform_float();
    for (int64_t i = 0; i + 16 <= n; i += 16) fill16(out + i, kernel);
    if (n % 16 != 0) {
      float* t = out + n - 16;
      for (int j = 0; j < 16; ++j) t[j] = gen.uniform_float();
      fill16(t, kernel);
    }
    return;
  }
  float buf[16];
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) buf[j] = gen.uniform_float();
    fill16(buf, kernel);
    for (int j = 0; j < 16; ++j) out[i + j] = round_bf16(buf[j]);
  }
  if (n % 16 != 0) {
    for (int j = 0; j < 16; ++j) buf[j] = gen.uniform_float();
    fill16(buf, kernel);
    for (int j = 0; j < 16; ++j) out[n - 16 + j] = round_bf16(buf[j]);
  }
}

Tensor torch_randn(const std::vector<int64_t>& shape, uint64_t seed, bool bf16,
                   TorchCpuKernel kernel) {
  Tensor t(shape);
  TorchCpuGenerator gen(seed);
  torch_normal_fill(gen, t.data(), t.numel(), bf16, kernel);
  return t;
}

std::vector<int64_t> klein_noise_shape(int64_t width, int64_t height) {
  return {1, 128, height / 16, width / 16};
}

}  // namespace klein
