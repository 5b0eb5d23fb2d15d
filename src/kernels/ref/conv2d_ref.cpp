// Scalar reference for kernels::conv2d: build the transformed input image explicitly (prologue,
// then ×2 nearest upsampling, then zero padding), then the textbook loop over
// (n, co, oy, ox, ci, ky, kx) accumulating in double.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/conv2d.h"

namespace klein::kernels {

int64_t conv2d_out_size(int64_t in, int64_t k, int stride, int pad_a, int pad_b, bool upsample2x) {
  const int64_t span = in * (upsample2x ? 2 : 1) + pad_a + pad_b - k;
  if (span < 0 || stride <= 0) return 0;
  return span / stride + 1;
}

bool conv2d_subpixel_form(int64_t KH, int64_t KW, const Conv2dParams& p) {
  return p.upsample2x && KH == 3 && KW == 3 && p.stride == 1 && p.pad_top == 1 && p.pad_bottom == 1 &&
         p.pad_left == 1 && p.pad_right == 1;
}

bool conv2d_winograd_f32_form(int64_t KH, int64_t KW, const Conv2dParams& p) {
  return KH == 3 && KW == 3 && p.stride == 1 && p.pad_top == 1 && p.pad_bottom == 1 && p.pad_left == 1 &&
         p.pad_right == 1;
}

bool conv2d_winograd_form(int64_t KH, int64_t KW, const Conv2dParams& p) {
  return !p.upsample2x && conv2d_winograd_f32_form(KH, KW, p);
}

namespace ref {

namespace {

// xp [Cin, HP, WP] ← one batch item x [Cin, H, W] through the prologue, then ×u nearest
// upsampling, placed at (pt, pl) in a zero frame, each value rounded to bf16 when `bf16`.
void padded_input(const float* x, int64_t Cin, int64_t H, int64_t W, int u, int64_t pt, int64_t pl, int64_t HP,
                  int64_t WP, const Conv2dParams& p, bool bf16, std::vector<float>& xp) {
  std::fill(xp.begin(), xp.end(), 0.0f);
  for (int64_t c = 0; c < Cin; ++c)
    for (int64_t y = 0; y < H * u; ++y)
      for (int64_t xx = 0; xx < W * u; ++xx) {
        float v = x[(c * H + y / u) * W + xx / u];
        if (p.in_scale || p.in_shift)
          v = (p.in_scale ? p.in_scale[c] : 1.0f) * v + (p.in_shift ? p.in_shift[c] : 0.0f);
        if (p.in_silu) v = v / (1.0f + std::exp(-v));
        xp[(c * HP + y + pt) * WP + xx + pl] = bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
      }
}

// Both references; bf16 rounds the transformed input and the weight to bf16 (RNE) first.
void conv2d_impl(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, const Conv2dParams& p, bool bf16) {
  if (w.shape.size() != 4 || w.shape[1] != Cin)
    throw std::invalid_argument("ref::conv2d: weight " + w.name + " does not match Cin " +
                                std::to_string(Cin));
  const int64_t Cout = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  const int64_t OH = conv2d_out_size(H, KH, p.stride, p.pad_top, p.pad_bottom, p.upsample2x);
  const int64_t OW = conv2d_out_size(W, KW, p.stride, p.pad_left, p.pad_right, p.upsample2x);
  if (OH <= 0 || OW <= 0) return;
  const int u = p.upsample2x ? 2 : 1;
  const int64_t HP = H * u + p.pad_top + p.pad_bottom, WP = W * u + p.pad_left + p.pad_right;

  Tensor wf = weight_to_tensor(w);  // [Cout, Cin, KH, KW]
  auto round = [bf16](float v) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  if (bf16)
    for (int64_t i = 0; i < wf.numel(); ++i) wf.data()[i] = round(wf.data()[i]);
  std::vector<float> b(Cout, 0.0f);
  if (bias && !bias->empty()) weight_to_f32(*bias, 0, Cout, b.data());

  std::vector<float> xp(Cin * HP * WP);  // the padded, transformed input of one batch item
  for (int64_t n = 0; n < N; ++n) {
    padded_input(in + n * Cin * H * W, Cin, H, W, u, p.pad_top, p.pad_left, HP, WP, p, bf16, xp);
    float* o = out + n * Cout * OH * OW;
    for (int64_t co = 0; co < Cout; ++co)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          double acc = b[co];
          for (int64_t ci = 0; ci < Cin; ++ci)
            for (int64_t ky = 0; ky < KH; ++ky)
              for (int64_t kx = 0; kx < KW; ++kx)
                acc += static_cast<double>(wf.data()[((co * Cin + ci) * KH + ky) * KW + kx]) *
                       xp[(ci * HP + oy * p.stride + ky) * WP + ox * p.stride + kx];
          float& dst = o[(co * OH + oy) * OW + ox];
          dst = p.accumulate ? static_cast<float>(dst + acc) : static_cast<float>(acc);
        }
  }
}

}  // namespace

void conv2d(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
            const Weight* bias, float* out, const Conv2dParams& p) {
  conv2d_impl(in, N, Cin, H, W, w, bias, out, p, false);
}

void conv2d_bf16(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                 const Weight* bias, float* out, const Conv2dParams& p) {
  conv2d_impl(in, N, Cin, H, W, w, bias, out, p, true);
}

void conv2d_bf16_subpixel(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                          const Weight* bias, float* out, const Conv2dParams& p) {
  if (w.shape.size() != 4 || w.shape[1] != Cin || !conv2d_subpixel_form(w.shape[2], w.shape[3], p))
    throw std::invalid_argument("ref::conv2d_bf16_subpixel: weight " + w.name +
                                " is not a 3x3 upsampling conv with padding 1 over " + std::to_string(Cin) +
                                " channels");
  const int64_t Cout = w.shape[0], OW = 2 * W, HP = H + 2, WP = W + 2;
  auto round = [](float v) { return bf16_to_f32(f32_to_bf16(v)); };
  const Tensor wf = weight_to_tensor(w);  // [Cout, Cin, 3, 3]
  std::vector<float> w4(4 * Cout * Cin * 4);  // [phase][Cout][Cin][ty·2 + tx]
  for (int ph = 0; ph < 4; ++ph)
    for (int64_t k = 0; k < Cout * Cin; ++k)
      for (int t = 0; t < 4; ++t)
        w4[(ph * Cout * Cin + k) * 4 + t] = round(subpixel_tap(wf.data() + k * 9, ph / 2, ph % 2, t / 2, t % 2));
  std::vector<float> b(Cout, 0.0f);
  if (bias && !bias->empty()) weight_to_f32(*bias, 0, Cout, b.data());

  std::vector<float> xp(Cin * HP * WP);  // the transformed input, not upsampled, padded by 1
  for (int64_t n = 0; n < N; ++n) {
    padded_input(in + n * Cin * H * W, Cin, H, W, 1, 1, 1, HP, WP, p, true, xp);
    float* o = out + n * Cout * 2 * H * OW;
    for (int ph = 0; ph < 4; ++ph) {
      const int dy = ph / 2, dx = ph % 2;
      for (int64_t co = 0; co < Cout; ++co)
        for (int64_t a = 0; a < H; ++a)
          for (int64_t bx = 0; bx < W; ++bx) {
            double acc = b[co];
            // Padded row a + dy + ty is input row a − 1 + dy + ty; columns likewise.
            for (int64_t ci = 0; ci < Cin; ++ci)
              for (int t = 0; t < 4; ++t)
                acc += static_cast<double>(w4[((ph * Cout + co) * Cin + ci) * 4 + t]) *
                       xp[(ci * HP + a + dy + t / 2) * WP + bx + dx + t % 2];
            float& dst = o[(co * 2 * H + 2 * a + dy) * OW + 2 * bx + dx];
            dst = p.accumulate ? static_cast<float>(dst + acc) : static_cast<float>(acc);
          }
    }
  }
}

namespace {

// Both Winograd references: `bf16` rounds U and V to bf16 (the bf16 convs' form, no upsampling);
// without it U and V stay float (the float32 Winograd conv's form, which also takes the ×2
// upsampling: the tiles then cover the upsampled image).
void winograd_impl(const char* what, const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                   const Weight* bias, float* out, const Conv2dParams& p, bool bf16) {
  const bool form = bf16 ? conv2d_winograd_form(3, 3, p) : conv2d_winograd_f32_form(3, 3, p);
  if (w.shape.size() != 4 || w.shape[1] != Cin || w.shape[2] != 3 || w.shape[3] != 3 || !form)
    throw std::invalid_argument(std::string(what) + ": weight " + w.name +
                                " is not a 3x3 stride-1 conv with padding 1 over " + std::to_string(Cin) +
                                " channels" + (bf16 ? " without upsampling" : ""));
  const int u = p.upsample2x ? 2 : 1;
  const int64_t Cout = w.shape[0], OH = H * u, OW = W * u, TH = (OH + 1) / 2, TW = (OW + 1) / 2;
  // Padded so that every tile's 4×4 window exists: rows −1 .. 2·TH, columns likewise.
  const int64_t HP = 2 * TH + 2, WP = 2 * TW + 2;
  auto round = [bf16](float v) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  const Tensor wf = weight_to_tensor(w);  // [Cout, Cin, 3, 3]
  std::vector<float> uw(Cout * Cin * 16);  // [Cout][Cin][16]
  for (int64_t k = 0; k < Cout * Cin; ++k) {
    winograd_weight_tile(wf.data() + k * 9, uw.data() + k * 16);
    for (int x = 0; x < 16; ++x) uw[k * 16 + x] = round(uw[k * 16 + x]);
  }
  std::vector<float> b(Cout, 0.0f);
  if (bias && !bias->empty()) weight_to_f32(*bias, 0, Cout, b.data());

  std::vector<float> xp(Cin * HP * WP), v(Cin * 16);  // v: one tile's [Cin][16]
  for (int64_t n = 0; n < N; ++n) {
    padded_input(in + n * Cin * H * W, Cin, H, W, u, 1, 1, HP, WP, p, false, xp);
    float* o = out + n * Cout * OH * OW;
    for (int64_t ty = 0; ty < TH; ++ty)
      for (int64_t tx = 0; tx < TW; ++tx) {
        for (int64_t ci = 0; ci < Cin; ++ci) {
          float d[16];  // padded rows 2·ty + r, columns 2·tx + c: input row 2·ty − 1 + r
          for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) d[4 * r + c] = xp[(ci * HP + 2 * ty + r) * WP + 2 * tx + c];
          winograd_input_tile(d, v.data() + ci * 16);
          for (int x = 0; x < 16; ++x) v[ci * 16 + x] = round(v[ci * 16 + x]);
        }
        for (int64_t co = 0; co < Cout; ++co) {
          double m[16] = {};
          for (int64_t ci = 0; ci < Cin; ++ci)
            for (int x = 0; x < 16; ++x)
              m[x] += static_cast<double>(uw[(co * Cin + ci) * 16 + x]) * v[ci * 16 + x];
          double y[4];
          winograd_output_tile(m, y);
          for (int dy = 0; dy < 2; ++dy)
            for (int k = 0; k < 2; ++k) {
              const int64_t oy = 2 * ty + dy, ox = 2 * tx + k;
              if (oy >= OH || ox >= OW) continue;
              float& dst = o[(co * OH + oy) * OW + ox];
              const double acc = b[co] + y[2 * dy + k];
              dst = p.accumulate ? static_cast<float>(dst + acc) : static_cast<float>(acc);
            }
        }
      }
  }
}

}  // namespace

void conv2d_bf16_winograd(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                          const Weight* bias, float* out, const Conv2dParams& p) {
  winograd_impl("ref::conv2d_bf16_winograd", in, N, Cin, H, W, w, bias, out, p, true);
}

void conv2d_winograd(const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                     const Weight* bias, float* out, const Conv2dParams& p) {
  winograd_impl("ref::conv2d_winograd", in, N, Cin, H, W, w, bias, out, p, false);
}

}  // namespace ref
}  // namespace klein::kernels
