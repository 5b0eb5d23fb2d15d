#include "shape_analysis.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "klein/klein.h"
#include "testing.h"

namespace klein::testing {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Decision thresholds, from the shapes' geometry (values for ideal shapes in the comments) and
// checked on the renderer's drawings, sharp, blurred and noisy (test_demo_model.cpp).
constexpr double kMinContrast = 30;      // |fg - bg| below this: no foreground at all
constexpr double kCandidate = 24;        // first pass: a pixel this far from the background is fg
constexpr double kRingHole = 0.06;       // ring: 1 - 0.55^2 of the disc is drawn, hole ~0.30
constexpr double kStarSolidity = 0.87;   // star (inner radius 0.45) ~0.65; convex shapes ~0.95+
constexpr double kTriangleExtent = 0.69; // triangle 0.5, circle 0.785, square 1 (blur raises 0.5)
constexpr double kSquareExtent = 0.85;   // between circle 0.785 and square 1 (blur rounds corners)
constexpr double kSpeckFraction = 0.2;   // components under this share of the largest are specks
constexpr int kMinArea = 6;              // and those under this many pixels
constexpr int kNear = 3;                 // pixels this close to a standing-out one are not background
constexpr int kWindow = 20;              // the local background: a (2 kWindow + 1)^2 window
constexpr double kMinBackground = 40;    // background pixels a window needs (else the global one)
constexpr int kMargin = 2;               // the outermost pixels are never foreground
constexpr double kSplitAspect = 1.5;     // a component this much wider than tall is shapes that touch

uint8_t median(std::vector<uint8_t>& v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double circ_dist(double a, double b) {
  double d = std::fmod(std::fabs(a - b), 360.0);
  return d > 180 ? 360 - d : d;
}

double cross(const std::array<double, 2>& o, const std::array<double, 2>& a, const std::array<double, 2>& b) {
  return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]);
}

// Area of the convex hull of `p` (Andrew's monotone chain).
double hull_area(std::vector<std::array<double, 2>> p) {
  if (p.size() < 3) return 0;
  std::sort(p.begin(), p.end());
  p.erase(std::unique(p.begin(), p.end()), p.end());
  const size_t n = p.size();
  if (n < 3) return 0;
  std::vector<std::array<double, 2>> h(2 * n);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    while (k >= 2 && cross(h[k - 2], h[k - 1], p[i]) <= 0) --k;
    h[k++] = p[i];
  }
  for (size_t i = n - 1, t = k + 1; i-- > 0;) {
    while (k >= t && cross(h[k - 2], h[k - 1], p[i]) <= 0) --k;
    h[k++] = p[i];
  }
  h.resize(k - 1);
  double a = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const auto& u = h[i];
    const auto& v = h[(i + 1) % h.size()];
    a += u[0] * v[1] - v[0] * u[1];
  }
  return std::fabs(a) / 2;
}

std::string classify(const ComponentMeasures& m, std::string* why) {
  char buf[160];
  if (m.hole_fraction >= kRingHole) {
    std::snprintf(buf, sizeof buf, "hole fraction %.3f >= %.2f", m.hole_fraction, kRingHole);
    *why = buf;
    return "ring";
  }
  if (m.solidity < kStarSolidity) {
    std::snprintf(buf, sizeof buf, "no hole (%.3f), solidity %.3f < %.2f", m.hole_fraction, m.solidity, kStarSolidity);
    *why = buf;
    return "star";
  }
  if (m.extent < kTriangleExtent) {
    std::snprintf(buf, sizeof buf, "convex (solidity %.3f), extent %.3f < %.3f", m.solidity, m.extent, kTriangleExtent);
    *why = buf;
    return "triangle";
  }
  const bool square = m.extent >= kSquareExtent;
  std::snprintf(buf, sizeof buf, "convex (solidity %.3f), extent %.3f %s %.3f (circularity %.3f)", m.solidity, m.extent,
                square ? ">=" : "<", kSquareExtent, m.circularity);
  *why = buf;
  return square ? "square" : "circle";
}

}  // namespace

double hue_degrees(double r, double g, double b) {
  const double mx = std::max({r, g, b}), mn = std::min({r, g, b}), d = mx - mn;
  if (d <= 0) return -1;
  double h;
  if (mx == r) h = std::fmod((g - b) / d, 6.0);
  else if (mx == g) h = (b - r) / d + 2;
  else h = (r - g) / d + 4;
  h *= 60;
  return h < 0 ? h + 360 : h;
}

SceneAnalysis analyze_scene(const uint8_t* rgb, int width, int height, const std::vector<PaletteColour>& palette) {
  SceneAnalysis s;
  const int W = width, H = height, N = W * H;
  if (W < 2 * (kMargin + 3) || H < 2 * (kMargin + 3)) return s;  // no frame to take the background from
  // Everything below reads the picture through a 3x3 binomial filter ([1 2 1] x [1 2 1] / 16):
  // it takes the edge of a generated picture's pixel noise and changes a sharp edge by under a
  // pixel.
  std::vector<double> smooth(static_cast<size_t>(N) * 3);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) {
        double sum = 0;
        for (int dy = -1; dy <= 1; ++dy)
          for (int dx = -1; dx <= 1; ++dx) {
            const int xx = std::clamp(x + dx, 0, W - 1), yy = std::clamp(y + dy, 0, H - 1);
            sum += (2 - std::abs(dx)) * (2 - std::abs(dy)) * rgb[3 * (yy * W + xx) + c];
          }
        smooth[3 * (y * W + x) + c] = sum / 16;
      }
  auto px = [&](int i, int c) { return smooth[3 * i + c]; };

  // Background: the per-channel median of the frame 2 to 4 pixels in from the border (shapes
  // stay clear of it, and a decoder's outermost pixels may be off).
  std::vector<double> frame_dist;
  {
    std::array<std::vector<uint8_t>, 3> border;
    std::vector<int> frame;
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        if (const int edge = std::min({x, y, W - 1 - x, H - 1 - y}); edge >= kMargin && edge < kMargin + 3) {
          frame.push_back(y * W + x);
          for (int c = 0; c < 3; ++c) border[c].push_back(rgb[3 * (y * W + x) + c]);
        }
    for (int c = 0; c < 3; ++c) s.background[c] = median(border[c]);
    for (int i : frame) {
      double d2 = 0;
      for (int c = 0; c < 3; ++c) d2 += (px(i, c) - s.background[c]) * (px(i, c) - s.background[c]);
      frame_dist.push_back(std::sqrt(d2));
    }
  }
  auto distance = [&](int i, const double* b) {
    double d2 = 0;
    for (int c = 0; c < 3; ++c) d2 += (px(i, c) - b[c]) * (px(i, c) - b[c]);
    return std::sqrt(d2);
  };

  // A generated background is not flat: the background of each pixel is the mean of the
  // background pixels around it (a 41x41 window), those being the pixels not near any that
  // stand out from the frame's median by more than the frame itself varies.
  const double global_bg[3] = {double(s.background[0]), double(s.background[1]), double(s.background[2])};
  const size_t p90 = frame_dist.size() * 9 / 10;
  std::nth_element(frame_dist.begin(), frame_dist.begin() + p90, frame_dist.end());
  const double stand_out = std::max(kCandidate, 2 * frame_dist[p90]);
  std::vector<uint8_t> near(N, 0);
  for (int i = 0; i < N; ++i)
    if (distance(i, global_bg) > stand_out)
      for (int dy = -kNear; dy <= kNear; ++dy)
        for (int dx = -kNear; dx <= kNear; ++dx) {
          const int x = i % W + dx, y = i / W + dy;
          if (x >= 0 && y >= 0 && x < W && y < H) near[y * W + x] = 1;
        }
  // Integral images of the background pixels' count and channel sums.
  std::vector<double> integral(static_cast<size_t>(W + 1) * (H + 1) * 4, 0.0);
  auto at = [&](int x, int y, int k) -> double& { return integral[(static_cast<size_t>(y) * (W + 1) + x) * 4 + k]; };
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const int i = y * W + x;
      const double v[4] = {near[i] ? 0.0 : 1.0, near[i] ? 0 : px(i, 0), near[i] ? 0 : px(i, 1), near[i] ? 0 : px(i, 2)};
      for (int k = 0; k < 4; ++k) at(x + 1, y + 1, k) = v[k] + at(x, y + 1, k) + at(x + 1, y, k) - at(x, y, k);
    }
  std::vector<double> bgmap(static_cast<size_t>(N) * 3);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const int x0 = std::max(0, x - kWindow), x1 = std::min(W, x + kWindow + 1);
      const int y0 = std::max(0, y - kWindow), y1 = std::min(H, y + kWindow + 1);
      double sum[4];
      for (int k = 0; k < 4; ++k) sum[k] = at(x1, y1, k) - at(x0, y1, k) - at(x1, y0, k) + at(x0, y0, k);
      for (int c = 0; c < 3; ++c)
        bgmap[3 * (y * W + x) + c] = sum[0] >= kMinBackground ? sum[c + 1] / sum[0] : global_bg[c];
    }

  // Foreground colour: the median of the pixels farthest from their background (the interiors,
  // not the anti-aliased edges), among those clearly off it.
  std::vector<double> dist(N);
  std::vector<double> far;
  for (int i = 0; i < N; ++i) {
    dist[i] = distance(i, &bgmap[3 * i]);
    if (dist[i] > kCandidate) far.push_back(dist[i]);
  }
  if (far.size() < static_cast<size_t>(kMinArea)) return s;
  const size_t q = far.size() * 4 / 5;  // the farthest fifth
  std::nth_element(far.begin(), far.begin() + q, far.end());
  const double cut = far[q];
  {
    std::array<std::vector<uint8_t>, 3> fg;
    for (int i = 0; i < N; ++i)
      if (dist[i] >= cut)
        for (int c = 0; c < 3; ++c) fg[c].push_back(static_cast<uint8_t>(std::lround(px(i, c))));
    for (int c = 0; c < 3; ++c) s.foreground[c] = median(fg[c]);
  }
  {
    double d2 = 0;
    for (int c = 0; c < 3; ++c) d2 += (s.foreground[c] - global_bg[c]) * (s.foreground[c] - global_bg[c]);
    s.contrast = std::sqrt(d2);
  }
  if (s.contrast < kMinContrast) return s;

  // alpha: where a pixel lies between its background (0) and the foreground (1) colour.
  std::vector<double> alpha(N);
  std::vector<uint8_t> mask(N);
  for (int i = 0; i < N; ++i) {
    const double* b = &bgmap[3 * i];
    double a = 0, len2 = 0;
    for (int c = 0; c < 3; ++c) {
      const double axis = s.foreground[c] - b[c];
      a += (px(i, c) - b[c]) * axis;
      len2 += axis * axis;
    }
    alpha[i] = len2 > 0 ? std::clamp(a / len2, 0.0, 1.0) : 0.0;
    const int x = i % W, y = i / W;
    mask[i] = alpha[i] >= 0.5 && std::min({x, y, W - 1 - x, H - 1 - y}) >= kMargin;
  }

  // Connected components of the mask, 4-connected (the background is then 8-connected).
  std::vector<int> label(N, -1);
  std::vector<std::vector<int>> comps;
  for (int i = 0; i < N; ++i) {
    if (!mask[i] || label[i] >= 0) continue;
    std::vector<int> pix{i};
    label[i] = static_cast<int>(comps.size());
    for (size_t k = 0; k < pix.size(); ++k) {
      const int x = pix[k] % W, y = pix[k] / W;
      const int nb[4][2] = {{x - 1, y}, {x + 1, y}, {x, y - 1}, {x, y + 1}};
      for (const auto& q : nb) {
        if (q[0] < 0 || q[1] < 0 || q[0] >= W || q[1] >= H) continue;
        const int j = q[1] * W + q[0];
        if (mask[j] && label[j] < 0) {
          label[j] = label[i];
          pix.push_back(j);
        }
      }
    }
    comps.push_back(std::move(pix));
  }
  // Shapes of a row may touch (the renderer's big pairs and triples overlap now and then): a
  // component much wider than tall is k shapes side by side. It is cut at its narrowest columns
  // near the k equal divisions. Every single shape is about as wide as tall (triangle 1.15).
  const size_t before_split = comps.size();
  for (size_t k = 0; k < before_split; ++k) {
    int x0 = W, x1 = -1, y0 = H, y1 = -1;
    for (int i : comps[k]) {
      x0 = std::min(x0, i % W), x1 = std::max(x1, i % W);
      y0 = std::min(y0, i / W), y1 = std::max(y1, i / W);
    }
    const double bw = x1 - x0 + 1, bh = y1 - y0 + 1;
    const int parts = std::min(3, static_cast<int>(std::lround(bw / bh)));
    if (bw < kSplitAspect * bh || parts < 2) continue;
    std::vector<int> column(static_cast<size_t>(bw), 0);
    for (int i : comps[k]) column[i % W - x0]++;
    std::vector<int> cuts;  // first column of each later part
    for (int j = 1; j < parts; ++j) {
      const double ideal = j * bw / parts;
      const int reach = static_cast<int>(bw / parts / 4);
      int best = static_cast<int>(ideal);
      for (int c = std::max(1, static_cast<int>(ideal) - reach); c <= std::min<int>(bw - 2, ideal + reach); ++c)
        if (column[c] < column[best] || (column[c] == column[best] && std::fabs(c - ideal) < std::fabs(best - ideal)))
          best = c;
      cuts.push_back(best);
    }
    std::vector<std::vector<int>> split(parts);
    for (int i : comps[k]) {
      int p = 0;
      while (p + 1 < parts && i % W - x0 >= cuts[p]) ++p;
      split[p].push_back(i);
    }
    comps[k] = std::move(split[0]);
    for (int p = 1; p < parts; ++p) {
      for (int i : split[p]) label[i] = static_cast<int>(comps.size());
      comps.push_back(std::move(split[p]));
    }
    s.merged++;
  }
  size_t largest = 0;
  for (const auto& c : comps) largest = std::max(largest, c.size());

  for (size_t k = 0; k < comps.size(); ++k) {
    const auto& pix = comps[k];
    if (pix.size() < static_cast<size_t>(kMinArea) || pix.size() < kSpeckFraction * largest) {
      ++s.specks;
      continue;
    }
    const int id = static_cast<int>(k);
    ComponentMeasures m;
    int x0 = W, y0 = H, x1 = -1, y1 = -1;
    for (int i : pix) {
      const int x = i % W, y = i / W;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
      m.cx += x, m.cy += y;
    }
    m.cx /= pix.size(), m.cy /= pix.size();
    m.box_x = x0, m.box_y = y0, m.box_w = x1 - x0 + 1, m.box_h = y1 - y0 + 1;

    // A local grid, padded by 2: this component's alpha on its pixels and on the rim around
    // them that no other component owns, 0 elsewhere.
    const int gx0 = x0 - 2, gy0 = y0 - 2, GW = m.box_w + 4, GH = m.box_h + 4;
    std::vector<double> g(static_cast<size_t>(GW) * GH, 0.0);
    std::vector<uint8_t> own(g.size(), 0);
    for (int gy = 0; gy < GH; ++gy)
      for (int gx = 0; gx < GW; ++gx) {
        const int x = gx0 + gx, y = gy0 + gy;
        if (x < 0 || y < 0 || x >= W || y >= H) continue;
        const int i = y * W + x;
        if (label[i] == id) {
          own[gy * GW + gx] = 1;
          g[gy * GW + gx] = alpha[i];
          continue;
        }
        if (label[i] >= 0) continue;
        bool rim = false;
        for (int dy = -1; dy <= 1 && !rim; ++dy)
          for (int dx = -1; dx <= 1 && !rim; ++dx) {
            const int xx = x + dx, yy = y + dy;
            rim = xx >= 0 && yy >= 0 && xx < W && yy < H && label[yy * W + xx] == id;
          }
        if (rim) g[gy * GW + gx] = alpha[i];
      }
    for (double v : g) m.area += v;

    // Holes: pixels not the component's that the outside cannot reach (8-connected).
    std::vector<uint8_t> outside(g.size(), 0);
    std::vector<int> stack{0};
    outside[0] = 1;
    while (!stack.empty()) {
      const int j = stack.back();
      stack.pop_back();
      const int gx = j % GW, gy = j / GW;
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) {
          const int xx = gx + dx, yy = gy + dy;
          if (xx < 0 || yy < 0 || xx >= GW || yy >= GH) continue;
          const int q = yy * GW + xx;
          if (!own[q] && !outside[q]) {
            outside[q] = 1;
            stack.push_back(q);
          }
        }
    }
    int holes = 0;
    for (size_t j = 0; j < g.size(); ++j) holes += !own[j] && !outside[j];
    m.hole_fraction = static_cast<double>(holes) / (holes + pix.size());

    // The alpha = 0.5 contour by marching squares: its length, its points' box and hull.
    std::vector<std::array<double, 2>> pts;
    double bx0 = 1e9, by0 = 1e9, bx1 = -1e9, by1 = -1e9;
    for (int gy = 0; gy + 1 < GH; ++gy)
      for (int gx = 0; gx + 1 < GW; ++gx) {
        const double v[4] = {g[gy * GW + gx], g[gy * GW + gx + 1], g[(gy + 1) * GW + gx + 1], g[(gy + 1) * GW + gx]};
        const double cx[4] = {0, 1, 1, 0}, cy[4] = {0, 0, 1, 1};  // corners, clockwise
        std::array<double, 2> cr[4];
        int n = 0;
        for (int e = 0; e < 4; ++e) {
          const int a = e, b = (e + 1) % 4;
          if ((v[a] >= 0.5) == (v[b] >= 0.5)) continue;
          const double t = (0.5 - v[a]) / (v[b] - v[a]);
          cr[n++] = {gx0 + gx + cx[a] + t * (cx[b] - cx[a]), gy0 + gy + cy[a] + t * (cy[b] - cy[a])};
        }
        // 2 crossings: one segment; 4 (a saddle): two, either pairing gives about the same length.
        for (int e = 0; e + 1 < n; e += 2)
          m.perimeter += std::hypot(cr[e][0] - cr[e + 1][0], cr[e][1] - cr[e + 1][1]);
        for (int e = 0; e < n; ++e) {
          pts.push_back(cr[e]);
          bx0 = std::min(bx0, cr[e][0]), bx1 = std::max(bx1, cr[e][0]);
          by0 = std::min(by0, cr[e][1]), by1 = std::max(by1, cr[e][1]);
        }
      }
    if (m.perimeter > 0) m.circularity = 4 * kPi * m.area / (m.perimeter * m.perimeter);
    if (bx1 > bx0 && by1 > by0) m.extent = m.area / ((bx1 - bx0) * (by1 - by0));
    const double hull = hull_area(pts);
    if (hull > 0) m.solidity = m.area / hull;
    m.shape = classify(m, &m.why);
    s.components.push_back(std::move(m));
  }
  std::sort(s.components.begin(), s.components.end(),
            [](const ComponentMeasures& a, const ComponentMeasures& b) { return a.cx < b.cx; });
  s.count = static_cast<int>(s.components.size());

  // Shape: the majority; a tie goes to the shape of the larger total area.
  std::map<std::string, std::pair<int, double>> votes;
  for (const auto& m : s.components) {
    votes[m.shape].first++;
    votes[m.shape].second += m.area;
  }
  for (const auto& [name, v] : votes)
    if (s.shape.empty() || v > votes[s.shape]) s.shape = name;

  // Colour: the circular mean hue of confident, saturated foreground pixels, named by the
  // nearest palette hue.
  double sx = 0, sy = 0;
  for (int i = 0; i < N; ++i) {
    if (label[i] < 0 || alpha[i] < 0.75) continue;
    const double r = px(i, 0), gg = px(i, 1), b = px(i, 2);
    const double mx = std::max({r, gg, b}), mn = std::min({r, gg, b});
    if (mx < 40 || (mx - mn) < 0.25 * mx) continue;
    const double h = hue_degrees(r, gg, b) * kPi / 180;
    sx += std::cos(h), sy += std::sin(h);
    ++s.colour_pixels;
  }
  if (s.colour_pixels > 0) {
    s.hue = std::atan2(sy, sx) * 180 / kPi;
    if (s.hue < 0) s.hue += 360;
    s.hue_error = 1e9;
    for (const auto& p : palette) {
      const double d = circ_dist(s.hue, hue_degrees(p.rgb[0], p.rgb[1], p.rgb[2]));
      if (d < s.hue_error) s.hue_error = d, s.colour = p.name;
    }
  }
  return s;
}

std::string SceneAnalysis::summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %s x%d | hue %.1f (off %.1f, %d px) bg %d,%d,%d fg %d,%d,%d specks %d merged %d",
                colour.empty() ? "-" : colour.c_str(), shape.empty() ? "-" : shape.c_str(), count, hue, hue_error,
                colour_pixels, background[0], background[1], background[2], foreground[0], foreground[1],
                foreground[2], specks, merged);
  std::string r = buf;
  for (const auto& m : components) {
    std::snprintf(buf, sizeof buf, " | %s A%.0f circ%.2f ext%.2f sol%.2f hole%.2f", m.shape.c_str(), m.area,
                  m.circularity, m.extent, m.solidity, m.hole_fraction);
    r += buf;
  }
  return r;
}

std::vector<uint8_t> box_blur(const std::vector<uint8_t>& rgb, int width, int height, int radius) {
  std::vector<uint8_t> out(rgb.size());
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        int sum = 0, n = 0;
        for (int dy = -radius; dy <= radius; ++dy)
          for (int dx = -radius; dx <= radius; ++dx) {
            const int xx = std::clamp(x + dx, 0, width - 1), yy = std::clamp(y + dy, 0, height - 1);
            sum += rgb[3 * (yy * width + xx) + c];
            ++n;
          }
        out[3 * (y * width + x) + c] = static_cast<uint8_t>((sum + n / 2) / n);
      }
  return out;
}

std::vector<uint8_t> add_noise(const std::vector<uint8_t>& rgb, double sigma, unsigned seed) {
  // Box-Muller on mt19937's raw output: the same noise with every standard library.
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(rgb.size());
  for (size_t i = 0; i < rgb.size(); ++i) {
    const double u1 = (gen() + 1.0) / 4294967297.0, u2 = gen() / 4294967296.0;
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2);
    out[i] = static_cast<uint8_t>(std::clamp(std::lround(rgb[i] + sigma * z), 0L, 255L));
  }
  return out;
}

std::vector<uint8_t> add_shading(const std::vector<uint8_t>& rgb, int width, int height, double amplitude, int phase) {
  std::vector<uint8_t> out(rgb.size());
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        const size_t k = 3 * (static_cast<size_t>(y) * width + x) + c;
        const double v = rgb[k] + amplitude * (std::sin(0.05 * x + c + phase) + std::cos(0.04 * y + 2 * c));
        out[k] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
  return out;
}

DemoCheckData load_demo_check() {
  DemoCheckData d;
  const auto path = data_dir() / "demo_check" / "prompts.json";
  std::ifstream f(path);
  if (!f) {
    d.error = "cannot open " + path.string();
    return d;
  }
  try {
    const auto j = nlohmann::json::parse(f);
    d.size = j.at("size").get<int>();
    for (const auto& [name, rgb] : j.at("colour_rgb").items()) {
      PaletteColour c{name, {}};
      for (int k = 0; k < 3; ++k) c.rgb[k] = rgb.at(k).get<uint8_t>();
      d.palette.push_back(c);
    }
    for (const auto& p : j.at("prompts"))
      d.prompts.push_back({p.at("prompt"), p.at("colour"), p.at("shape"), p.at("background"), p.at("count"),
                           (data_dir() / "demo_check" / p.at("rendered").get<std::string>()).string(),
                           p.value("held_out_combo", false)});
  } catch (const std::exception& e) {
    d.error = path.string() + ": " + e.what();
  }
  return d;
}

RgbImage read_rgb_image(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto img = klein::decode_image(bytes, path);
  if (!img.ok()) return {};
  return {img->width, img->height, std::move(img->rgb)};
}

}  // namespace klein::testing
