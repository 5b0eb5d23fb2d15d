#include "pipeline/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>

namespace klein {

namespace {

constexpr int kMinSide = 64;           // check_image_input min_side_length
constexpr int kMaxAspect = 8;          // check_image_input max_aspect_ratio
constexpr int64_t kTargetArea = 1024 * 1024;
constexpr int kMultiple = 16;          // vae_scale_factor (8) * 2

// ---- Pillow Resample.c (8 bpc path), kept in the same operation order ---------------------

constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kLanczosSupport = 3.0;

inline double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  x = x * std::numbers::pi;
  return std::sin(x) / x;
}

inline double lanczos_filter(double x) {
  if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
  return 0.0;
}

inline uint8_t clip8(int in) {
  const int v = in >> kPrecisionBits;  // arithmetic shift, as in C on the supported platforms
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // per output: xmin, xmax (count)
  std::vector<int> k;       // outSize * ksize fixed-point coefficients
};

// precompute_coeffs + normalize_coeffs_8bpc, box (in0, in1) = (0, inSize).
Coeffs precompute_coeffs(int in_size, int out_size) {
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);
  double filterscale, scale;
  filterscale = scale = static_cast<double>(in1 - in0) / out_size;
  if (filterscale < 1.0) filterscale = 1.0;
  const double support = kLanczosSupport * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  std::vector<double> kk(static_cast<size_t>(out_size) * c.ksize, 0.0);
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double* k = &kk[static_cast<size_t>(xx) * c.ksize];
    int x = 0;
    for (; x < xmax; ++x) {
      const double w = lanczos_filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    for (; x < c.ksize; ++x) k[x] = 0;
    c.bounds[xx * 2 + 0] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  c.k.resize(kk.size());
  for (size_t i = 0; i < kk.size(); ++i) {
    if (kk[i] < 0)
      c.k[i] = static_cast<int>(-0.5 + kk[i] * (1 << kPrecisionBits));
    else
      c.k[i] = static_cast<int>(0.5 + kk[i] * (1 << kPrecisionBits));
  }
  return c;
}

}  // namespace

Image resize_lanczos(const Image& in, int width, int height) {
  Image out;
  if (width == in.width && height == in.height) {  // Image.resize returns a copy
    out.width = in.width;
    out.height = in.height;
    out.rgb = in.rgb;
    return out;
  }
  const bool need_h = width != in.width;
  const bool need_v = height != in.height;
  const Coeffs cv = precompute_coeffs(in.height, height);
  // rows of the source the vertical pass reads
  const int ybox_first = cv.bounds[0];
  const int ybox_last = cv.bounds[height * 2 - 2] + cv.bounds[height * 2 - 1];

  // Horizontal pass over rows [ybox_first, ybox_last) only (what Pillow does).
  const std::vector<uint8_t>* src = &in.rgb;
  int src_w = in.width, row0 = 0;
  std::vector<uint8_t> tmp;
  if (need_h) {
    const Coeffs ch = precompute_coeffs(in.width, width);
    const int rows = ybox_last - ybox_first;
    tmp.resize(static_cast<size_t>(rows) * width * 3);
    for (int yy = 0; yy < rows; ++yy) {
      const uint8_t* srow = in.rgb.data() + static_cast<size_t>(yy + ybox_first) * in.width * 3;
      uint8_t* drow = tmp.data() + static_cast<size_t>(yy) * width * 3;
      for (int xx = 0; xx < width; ++xx) {
        const int xmin = ch.bounds[xx * 2 + 0], xmax = ch.bounds[xx * 2 + 1];
        const int* k = &ch.k[static_cast<size_t>(xx) * ch.ksize];
        int ss0 = 1 << (kPrecisionBits - 1), ss1 = ss0, ss2 = ss0;
        const uint8_t* p = srow + static_cast<size_t>(xmin) * 3;
        for (int x = 0; x < xmax; ++x, p += 3) {
          ss0 += p[0] * k[x];
          ss1 += p[1] * k[x];
          ss2 += p[2] * k[x];
        }
        drow[xx * 3 + 0] = clip8(ss0);
        drow[xx * 3 + 1] = clip8(ss1);
        drow[xx * 3 + 2] = clip8(ss2);
      }
    }
    src = &tmp;
    src_w = width;
    row0 = ybox_first;  // tmp row r holds source row r + ybox_first
  }

  out.width = need_h ? width : in.width;
  out.height = height;
  if (!need_v) {
    out.height = in.height;
    if (need_h) {
      // ybox covers every row when the height is unchanged
      out.rgb = std::move(tmp);
    } else {
      out.rgb = in.rgb;
    }
    return out;
  }
  out.rgb.resize(static_cast<size_t>(out.width) * height * 3);
  const size_t stride = static_cast<size_t>(src_w) * 3;
  for (int yy = 0; yy < height; ++yy) {
    const int ymin = cv.bounds[yy * 2 + 0] - row0, ymax = cv.bounds[yy * 2 + 1];
    const int* k = &cv.k[static_cast<size_t>(yy) * cv.ksize];
    uint8_t* drow = out.rgb.data() + static_cast<size_t>(yy) * out.width * 3;
    const uint8_t* base = src->data() + static_cast<size_t>(ymin) * stride;
    for (int xx = 0; xx < out.width * 3; xx += 3) {
      int ss0 = 1 << (kPrecisionBits - 1), ss1 = ss0, ss2 = ss0;
      const uint8_t* p = base + xx;
      for (int y = 0; y < ymax; ++y, p += stride) {
        ss0 += p[0] * k[y];
        ss1 += p[1] * k[y];
        ss2 += p[2] * k[y];
      }
      drow[xx + 0] = clip8(ss0);
      drow[xx + 1] = clip8(ss1);
      drow[xx + 2] = clip8(ss2);
    }
  }
  return out;
}

Result<ReferenceGeometry> plan_reference(int width, int height, const std::string& name) {
  const std::string times = "\xC3\x97";  // U+00D7, as in diffusers' messages
  if (width < kMinSide || height < kMinSide)
    return invalid_argument(name + ": Image too small: " + std::to_string(width) + times +
                            std::to_string(height) + ". Both dimensions must be at least " +
                            std::to_string(kMinSide) + "px");
  const double aspect = std::max(static_cast<double>(width) / height, static_cast<double>(height) / width);
  if (aspect > kMaxAspect) {
    char ratio[64];
    std::snprintf(ratio, sizeof(ratio), "%.1f", aspect);
    return invalid_argument(name + ": Aspect ratio too extreme: " + std::to_string(width) + times +
                            std::to_string(height) + " (ratio: " + ratio + ":1). Maximum allowed ratio is " +
                            std::to_string(kMaxAspect) + ":1");
  }
  ReferenceGeometry g;
  g.in_width = width;
  g.in_height = height;
  g.resized_width = width;
  g.resized_height = height;
  const int64_t area = static_cast<int64_t>(width) * height;
  if (area > kTargetArea) {
    // Python: scale = math.sqrt(target_area / (w*h)); int(w*scale); int(h*scale)
    const double scale = std::sqrt(static_cast<double>(kTargetArea) / static_cast<double>(area));
    g.resized = true;
    g.resized_width = static_cast<int>(static_cast<double>(width) * scale);
    g.resized_height = static_cast<int>(static_cast<double>(height) * scale);
  }
  g.width = g.resized_width / kMultiple * kMultiple;
  g.height = g.resized_height / kMultiple * kMultiple;
  g.crop_left = (g.resized_width - g.width) / 2;
  g.crop_top = (g.resized_height - g.height) / 2;
  return g;
}

Result<Tensor> preprocess_reference(const Image& image, const std::string& name,
                                    ReferenceGeometry* geometry) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    return invalid_argument(name + ": not a valid RGB image (" + std::to_string(image.width) + "x" +
                            std::to_string(image.height) + ", " + std::to_string(image.rgb.size()) + " bytes)");
  KLEIN_ASSIGN_OR_RETURN(ReferenceGeometry g, plan_reference(image.width, image.height, name));
  if (geometry) *geometry = g;
  Image resized;
  const Image* src = &image;
  if (g.resized) {
    resized = resize_lanczos(image, g.resized_width, g.resized_height);
    src = &resized;
  }
  Tensor t({1, 3, g.height, g.width});
  float* out = t.data();
  const size_t plane = static_cast<size_t>(g.height) * g.width;
  for (int y = 0; y < g.height; ++y) {
    const uint8_t* row = src->rgb.data() + (static_cast<size_t>(y + g.crop_top) * src->width + g.crop_left) * 3;
    for (int x = 0; x < g.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        // numpy: float32(u) / 255.0 (float32 division); torch: 2.0 * x, then - 1.0 (float32).
        // 2x is exact, so even a fused multiply-add would round the same way.
        const float v = static_cast<float>(row[x * 3 + c]) / 255.0f;
        out[c * plane + static_cast<size_t>(y) * g.width + x] = 2.0f * v - 1.0f;
      }
    }
  }
  return t;
}

std::pair<int, int> resolve_output_size(std::optional<int> width, std::optional<int> height,
                                        const std::vector<ReferenceGeometry>& references) {
  int w = width.value_or(0), h = height.value_or(0);
  if (!references.empty()) {
    if (h <= 0) h = references.front().height;
    if (w <= 0) w = references.front().width;
  }
  if (h <= 0) h = 1024;
  if (w <= 0) w = 1024;
  return {w, h};
}

}  // namespace klein
