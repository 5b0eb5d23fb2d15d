// run_conv2d: argument checks, then the conv2d kernel the KernelSet chose for the weight's format
// (AVX2 implicit GEMM on capable x86 CPUs); plus the portable blocked path, the scalar row:
// im2col of kBlockElems-bounded pixel blocks into [pixels, K] rows, the scalar linear against
// the [Cout, K] weight (any format), then a transposed NCHW store.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/cpu/scalar_kernels.h"
#include "kernels/registry.h"

namespace klein::kernels {
namespace {

struct Dims {
  int64_t Cout, KH, KW, OH, OW;
};

Dims check(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
           const Weight* bias, const float* out, const Conv2dParams& p) {
  if (w.shape.size() != 4)
    throw std::invalid_argument("conv2d: weight " + w.name + " is not 4-D: " + shape_str(w.shape));
  if (w.shape[1] != Cin)
    throw std::invalid_argument("conv2d: weight " + w.name + " " + shape_str(w.shape) +
                                " expects " + std::to_string(w.shape[1]) + " input channels, got " +
                                std::to_string(Cin));
  if (N < 0 || Cin <= 0 || H < 0 || W < 0 || w.shape[0] <= 0 || w.shape[2] <= 0 || w.shape[3] <= 0)
    throw std::invalid_argument("conv2d: non-positive dimension for " + w.name);
  if (p.stride <= 0 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)
    throw std::invalid_argument("conv2d: bad stride/padding for " + w.name);
  if (bias && !bias->empty() && bias->numel() != w.shape[0])
    throw std::invalid_argument("conv2d: bias " + bias->name + " has " +
                                std::to_string(bias->numel()) + " elements, expected " +
                                std::to_string(w.shape[0]));
  Dims d{w.shape[0], w.shape[2], w.shape[3], 0, 0};
  d.OH = conv2d_out_size(H, d.KH, p.stride, p.pad_top, p.pad_bottom, p.upsample2x);
  d.OW = conv2d_out_size(W, d.KW, p.stride, p.pad_left, p.pad_right, p.upsample2x);
  const int64_t in_n = N * Cin * H * W, out_n = N * d.Cout * d.OH * d.OW;
  if (in_n > 0 && out_n > 0 && in < out + out_n && out < in + in_n)
    throw std::invalid_argument("conv2d: output overlaps input for " + w.name);
  return d;
}

inline float silu1(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

void run_conv2d(const KernelSet& set, const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W,
                const Weight& w, const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) {
  const Dims d = check(in, N, Cin, H, W, w, bias, out, p);
  if (N == 0 || d.OH <= 0 || d.OW <= 0) return;
  if (H == 0 || W == 0) throw std::invalid_argument("conv2d: empty input for " + w.name);
  set.get(Op::kConv2d, w.dtype).conv2d(in, N, Cin, H, W, w, bias, out, d.OH, d.OW, p, pool);
}

namespace blocked {

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, int64_t OH, int64_t OW, const Conv2dParams& p,
            ThreadPool& pool) {
  const Dims d{w.shape[0], w.shape[2], w.shape[3], OH, OW};
  std::vector<float> b;  // [Cout] bias as f32, converted once for all pixel blocks
  if (bias && !bias->empty()) {
    b.resize(d.Cout);
    weight_to_f32(*bias, 0, d.Cout, b.data());
  }
  const int64_t K = Cin * d.KH * d.KW, P = d.OH * d.OW, Cout = d.Cout;
  const int64_t u = p.upsample2x ? 2 : 1, Hu = H * u, Wu = W * u;
  // Pixel block: the im2col rows [nb, K] plus the GEMM result [nb, Cout] stay under ~16 MB.
  constexpr int64_t kBlockElems = int64_t{4} << 20;
  const int64_t NB = std::clamp<int64_t>(kBlockElems / std::max(K, Cout), 16, std::max<int64_t>(P, 16));
  std::vector<float> col(static_cast<size_t>(std::min(NB, P) * K));
  std::vector<float> y(static_cast<size_t>(std::min(NB, P) * Cout));
  const bool prologue = p.in_scale || p.in_shift || p.in_silu;

  for (int64_t n = 0; n < N; ++n) {
    const float* x = in + n * Cin * H * W;
    float* o = out + n * Cout * P;
    for (int64_t pix0 = 0; pix0 < P; pix0 += NB) {
      const int64_t nb = std::min(NB, P - pix0);
      pool.parallel_for(nb, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          const int64_t oy = (pix0 + j) / d.OW, ox = (pix0 + j) % d.OW;
          float* c = col.data() + j * K;
          for (int64_t ci = 0; ci < Cin; ++ci) {
            const float a = p.in_scale ? p.in_scale[ci] : 1.0f;
            const float sh = p.in_shift ? p.in_shift[ci] : 0.0f;
            for (int64_t ky = 0; ky < d.KH; ++ky) {
              const int64_t iy = oy * p.stride - p.pad_top + ky;
              for (int64_t kx = 0; kx < d.KW; ++kx, ++c) {
                const int64_t ix = ox * p.stride - p.pad_left + kx;
                if (iy < 0 || iy >= Hu || ix < 0 || ix >= Wu) {
                  *c = 0.0f;
                  continue;
                }
                float v = x[(ci * H + iy / u) * W + ix / u];
                if (prologue) {
                  v = a * v + sh;
                  if (p.in_silu) v = silu1(v);
                }
                *c = v;
              }
            }
          }
        }
      }, 16);
      scalar::linear(col.data(), nb, K, w, b.empty() ? nullptr : b.data(), y.data(), pool, K, Cout);
      pool.parallel_for(Cout, [&](int64_t b, int64_t e) {
        for (int64_t co = b; co < e; ++co) {
          float* row = o + co * P + pix0;
          if (p.accumulate)
            for (int64_t j = 0; j < nb; ++j) row[j] += y[j * Cout + co];
          else
            for (int64_t j = 0; j < nb; ++j) row[j] = y[j * Cout + co];
        }
      });
    }
  }
}

}  // namespace blocked
}  // namespace klein::kernels
