#include "pipeline/image_compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace klein {
namespace {

constexpr int kWin = 11;
constexpr double kSigma = 1.5;

std::vector<double> luma(const Image& im) {
  std::vector<double> y(static_cast<size_t>(im.width) * im.height);
  for (size_t i = 0; i < y.size(); ++i)
    y[i] = 0.299 * im.rgb[3 * i] + 0.587 * im.rgb[3 * i + 1] + 0.114 * im.rgb[3 * i + 2];
  return y;
}

// Separable Gaussian filter, 'valid' positions only: out is (w - 10) x (h - 10).
std::vector<double> filter_valid(const std::vector<double>& in, int w, int h) {
  double g[kWin], sum = 0;
  for (int i = 0; i < kWin; ++i) sum += g[i] = std::exp(-((i - 5) * (i - 5)) / (2 * kSigma * kSigma));
  for (double& v : g) v /= sum;
  const int ow = w - kWin + 1, oh = h - kWin + 1;
  std::vector<double> tmp(static_cast<size_t>(ow) * h), out(static_cast<size_t>(ow) * oh);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < ow; ++x) {
      double s = 0;
      for (int k = 0; k < kWin; ++k) s += g[k] * in[static_cast<size_t>(y) * w + x + k];
      tmp[static_cast<size_t>(y) * ow + x] = s;
    }
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < ow; ++x) {
      double s = 0;
      for (int k = 0; k < kWin; ++k) s += g[k] * tmp[static_cast<size_t>(y + k) * ow + x];
      out[static_cast<size_t>(y) * ow + x] = s;
    }
  return out;
}

double ssim_luma(const Image& a, const Image& b) {
  const int w = a.width, h = a.height;
  const std::vector<double> x = luma(a), y = luma(b);
  std::vector<double> xx(x.size()), yy(x.size()), xy(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xx[i] = x[i] * x[i];
    yy[i] = y[i] * y[i];
    xy[i] = x[i] * y[i];
  }
  const auto mx = filter_valid(x, w, h), my = filter_valid(y, w, h);
  const auto sxx = filter_valid(xx, w, h), syy = filter_valid(yy, w, h), sxy = filter_valid(xy, w, h);
  const double c1 = (0.01 * 255) * (0.01 * 255), c2 = (0.03 * 255) * (0.03 * 255);
  double total = 0;
  for (size_t i = 0; i < mx.size(); ++i) {
    const double vx = sxx[i] - mx[i] * mx[i], vy = syy[i] - my[i] * my[i], cxy = sxy[i] - mx[i] * my[i];
    total += ((2 * mx[i] * my[i] + c1) * (2 * cxy + c2)) / ((mx[i] * mx[i] + my[i] * my[i] + c1) * (vx + vy + c2));
  }
  return total / static_cast<double>(mx.size());
}

}  // namespace

Result<ImageComparison> compare_rgb(const Image& a, const Image& b) {
  if (a.width != b.width || a.height != b.height)
    return invalid_argument("compare: the images differ in size (" + std::to_string(a.width) + "x" +
                            std::to_string(a.height) + " and " + std::to_string(b.width) + "x" +
                            std::to_string(b.height) + ")");
  const size_t n = static_cast<size_t>(a.width) * a.height * 3;
  if (a.rgb.size() != n || b.rgb.size() != n) return invalid_argument("compare: an image's pixel buffer does not match its size");
  if (a.width < kWin || a.height < kWin)
    return invalid_argument("compare: images must be at least 11x11 for SSIM's window, got " + std::to_string(a.width) +
                            "x" + std::to_string(a.height));
  ImageComparison r;
  double se = 0, sa = 0, sb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a.rgb[i]) - b.rgb[i];
    se += d * d;
    sa += a.rgb[i];
    sb += b.rgb[i];
  }
  const double mse = se / n;
  r.psnr = mse == 0 ? std::numeric_limits<double>::infinity() : 10 * std::log10(255.0 * 255.0 / mse);
  const double ma = sa / n, mb = sb / n;
  double cab = 0, caa = 0, cbb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double da = a.rgb[i] - ma, db = b.rgb[i] - mb;
    cab += da * db;
    caa += da * da;
    cbb += db * db;
  }
  // Two constant images: correlated exactly when equal (undefined otherwise; reported as 0).
  r.correlation = caa > 0 && cbb > 0 ? cab / std::sqrt(caa * cbb) : (mse == 0 ? 1.0 : 0.0);
  r.ssim = ssim_luma(a, b);
  return r;
}

Result<ArrayComparison> compare_float_arrays(const FloatArray& a, const FloatArray& b) {
  auto shape_str = [](const std::vector<int64_t>& sh) {
    std::string s = "[";
    for (size_t i = 0; i < sh.size(); ++i) s += (i ? ", " : "") + std::to_string(sh[i]);
    return s + "]";
  };
  if (a.shape != b.shape)
    return invalid_argument("compare: the arrays differ in shape (" + shape_str(a.shape) + " and " +
                            shape_str(b.shape) + ")");
  if (a.data.size() != b.data.size()) return invalid_argument("compare: an array's data does not match its shape");
  ArrayComparison r;
  r.count = static_cast<int64_t>(a.data.size());
  double ab = 0, aa = 0, bb = 0, dd = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    const double x = a.data[i], y = b.data[i];
    if (!std::isfinite(x) || !std::isfinite(y))
      return invalid_argument("compare: non-finite value at flat index " + std::to_string(i) + " of the " +
                              (std::isfinite(x) ? "second" : "first") + " array");
    ab += x * y, aa += x * x, bb += y * y, dd += (x - y) * (x - y);
    r.max_abs = std::max(r.max_abs, std::fabs(x - y));
  }
  r.cosine = aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : (aa == 0 && bb == 0 ? 1.0 : 0.0);
  r.rel_l2 = aa > 0 ? std::sqrt(dd / aa) : (dd == 0 ? 0.0 : std::numeric_limits<double>::infinity());
  return r;
}

}  // namespace klein
