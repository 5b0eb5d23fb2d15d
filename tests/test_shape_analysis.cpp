// The demo check's picture analysis (shape_analysis.h) against ground truth: the dataset
// renderer's own drawings of the test prompts (tests/data/demo_check) are read as their prompts
// say, sharp, blurred and noisy; shapes drawn here from their definitions are told apart; and
// pictures changed to show something else (another colour, a filled ring, a shape fewer, nothing)
// are read as what they now show. test_demo_model.cpp runs the same analysis on the demo model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>

#include "shape_analysis.h"
#include "testing.h"

namespace kt = klein::testing;

namespace {

const kt::DemoCheckData& shape_data() {
  static const kt::DemoCheckData d = kt::load_demo_check();
  return d;
}

// A scene's picture, or a fatal failure naming the file.
kt::RgbImage scene_image(const kt::DemoPrompt& p) {
  kt::RgbImage img = kt::read_rgb_image(p.rendered);
  EXPECT_EQ(img.width, shape_data().size) << p.rendered;
  EXPECT_EQ(img.height, shape_data().size) << p.rendered;
  return img;
}

// How many of the scenes, each changed by `change`, are read as their prompts say; the
// misreadings are reported.
int scenes_read_right(const std::function<std::vector<uint8_t>(const kt::RgbImage&, int)>& change,
                      const std::string& what) {
  int right = 0, i = 0;
  for (const auto& p : shape_data().prompts) {
    const kt::RgbImage img = scene_image(p);
    const auto a = kt::analyze_scene(change(img, i++), img.width, img.height, shape_data().palette);
    if (a.colour == p.colour && a.shape == p.shape && a.count == p.count) ++right;
    else ADD_FAILURE() << what << ": \"" << p.prompt << "\" read as " << a.summary();
  }
  return right;
}

}  // namespace

TEST(ShapeAnalysis, DemoCheckDataIsComplete) {
  const auto& d = shape_data();
  ASSERT_TRUE(d.error.empty()) << d.error;
  EXPECT_EQ(d.size, 128);
  EXPECT_EQ(d.palette.size(), 6u);
  EXPECT_GE(d.prompts.size(), 20u);  // the "fixed set of >= 20 prompts"
  for (const char* shape : {"circle", "square", "triangle", "star", "ring"})
    EXPECT_TRUE(std::any_of(d.prompts.begin(), d.prompts.end(), [&](const auto& p) { return p.shape == shape; }))
        << shape;
  for (int n = 1; n <= 3; ++n)
    EXPECT_TRUE(std::any_of(d.prompts.begin(), d.prompts.end(), [&](const auto& p) { return p.count == n; })) << n;
}

TEST(ShapeAnalysis, RenderedScenesReadAsTheirPrompts) {
  ASSERT_TRUE(shape_data().error.empty()) << shape_data().error;
  const int n = static_cast<int>(shape_data().prompts.size());
  EXPECT_EQ(scenes_read_right([](const kt::RgbImage& im, int) { return im.rgb; }, "sharp"), n);
}

// A generative model's pictures have soft edges, some pixel noise and uneven backgrounds.
TEST(ShapeAnalysis, BlurredAndNoisyScenesReadAsTheirPrompts) {
  ASSERT_TRUE(shape_data().error.empty()) << shape_data().error;
  const int n = static_cast<int>(shape_data().prompts.size());
  EXPECT_EQ(scenes_read_right([](const kt::RgbImage& im, int) { return kt::box_blur(im.rgb, im.width, im.height, 1); },
                              "blur 1"), n);
  EXPECT_EQ(scenes_read_right([](const kt::RgbImage& im, int) { return kt::box_blur(im.rgb, im.width, im.height, 2); },
                              "blur 2"), n);
  EXPECT_EQ(scenes_read_right([](const kt::RgbImage& im, int i) { return kt::add_noise(im.rgb, 12, i); }, "noise 12"), n);
  EXPECT_EQ(scenes_read_right(
                [](const kt::RgbImage& im, int i) {
                  return kt::add_noise(kt::box_blur(im.rgb, im.width, im.height, 1), 8, 100 + i);
                },
                "blur 1 + noise 8"),
            n);
  EXPECT_EQ(scenes_read_right(
                [](const kt::RgbImage& im, int i) {
                  return kt::add_noise(kt::add_shading(kt::box_blur(im.rgb, im.width, im.height, 1), im.width,
                                                       im.height, 10, i), 6, 200 + i);
                },
                "blur 1 + shading 10 + noise 6"),
            n);
}

namespace {

// A shape drawn here from its definition (not the renderer's code): 4x4 supersampled coverage of
// `inside(x, y)` (pixel units) blended from `bg` to `fg`.
std::vector<uint8_t> draw_shape(int size, const uint8_t bg[3], const uint8_t fg[3],
                                const std::function<bool(double, double)>& inside) {
  std::vector<uint8_t> img(static_cast<size_t>(size) * size * 3);
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      int hits = 0;
      for (int sy = 0; sy < 4; ++sy)
        for (int sx = 0; sx < 4; ++sx) hits += inside(x + (sx + 0.5) / 4, y + (sy + 0.5) / 4);
      for (int c = 0; c < 3; ++c)
        img[3 * (y * size + x) + c] = static_cast<uint8_t>(std::lround(bg[c] + (fg[c] - bg[c]) * hits / 16.0));
    }
  return img;
}

// Inside the convex polygon `v` (counter-clockwise in y-down pixel coordinates: every edge has
// the inside on the same side).
bool in_convex(const std::vector<std::pair<double, double>>& v, double x, double y) {
  int pos = 0, neg = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& a = v[i];
    const auto& b = v[(i + 1) % v.size()];
    const double c = (b.first - a.first) * (y - a.second) - (b.second - a.second) * (x - a.first);
    (c >= 0 ? pos : neg)++;
  }
  return pos == 0 || neg == 0;
}

std::vector<std::pair<double, double>> regular(double cx, double cy, double r, int n, double rot) {
  std::vector<std::pair<double, double>> v;
  for (int i = 0; i < n; ++i) v.emplace_back(cx + r * std::cos(rot + 2 * std::numbers::pi * i / n), cy + r * std::sin(rot + 2 * std::numbers::pi * i / n));
  return v;
}

}  // namespace

// Circle, square, triangle, star and ring drawn here at a few sizes and rotations are told
// apart: the rules are the shapes' geometry, not the renderer's pixels.
TEST(ShapeAnalysis, ShapesDrawnFromTheirDefinitions) {
  const uint8_t bg[3] = {245, 245, 245}, fg[3] = {35, 80, 220};
  const auto& pal = shape_data().palette;
  for (double r : {10.0, 18.0, 30.0}) {
    const double c = 64.3;
    const auto tri = regular(c, c, r, 3, -std::numbers::pi / 2 + 0.1);
    // A five-pointed star: the inner pentagon and the five tips on it.
    const auto tips = regular(c, c, r, 5, -std::numbers::pi / 2);
    const auto inner = regular(c, c, 0.45 * r, 5, -std::numbers::pi / 2 + std::numbers::pi / 5);
    std::vector<std::vector<std::pair<double, double>>> star_tips;
    for (int i = 0; i < 5; ++i) star_tips.push_back({inner[(i + 4) % 5], tips[i], inner[i]});
    std::map<std::string, std::function<bool(double, double)>> shapes = {
        {"circle", [&](double x, double y) { return std::hypot(x - c, y - c) <= r; }},
        {"ring", [&](double x, double y) { const double d = std::hypot(x - c, y - c); return d <= r && d >= 0.5 * r; }},
        {"square", [&](double x, double y) { return std::fabs(x - c) <= 0.85 * r && std::fabs(y - c) <= 0.85 * r; }},
        {"triangle", [&](double x, double y) { return in_convex(tri, x, y); }},
        {"star", [&](double x, double y) {
           if (std::hypot(x - c, y - c) > r) return false;
           if (in_convex(inner, x, y)) return true;
           return std::any_of(star_tips.begin(), star_tips.end(), [&](const auto& t) { return in_convex(t, x, y); });
         }},
    };
    for (const auto& [name, inside] : shapes) {
      const auto a = kt::analyze_scene(draw_shape(128, bg, fg, inside), 128, 128, pal);
      EXPECT_EQ(a.shape, name) << "radius " << r << ": " << a.summary();
      EXPECT_EQ(a.count, 1) << name << " radius " << r << ": " << a.summary();
      EXPECT_EQ(a.colour, "blue") << name << " radius " << r << ": " << a.summary();
    }
  }
}

// The verdicts follow the picture: each scene changed to show something else is read as the change.
TEST(ShapeAnalysis, ChangedScenesAreCaught) {
  const auto& d = shape_data();
  ASSERT_TRUE(d.error.empty()) << d.error;
  for (const auto& p : d.prompts) {
    const kt::RgbImage img = scene_image(p);
    const auto a = kt::analyze_scene(img.rgb, img.width, img.height, d.palette);
    ASSERT_EQ(a.count, p.count) << p.prompt;

    // Another palette colour (the next one whose hue differs and is not the background's):
    // each pixel keeps its place between background and foreground.
    for (const auto& other : d.palette) {
      if (other.name == p.colour || other.name == p.background) continue;
      std::vector<uint8_t> rgb = img.rgb;
      double axis[3], len2 = 0;
      for (int c = 0; c < 3; ++c) {
        axis[c] = a.foreground[c] - a.background[c];
        len2 += axis[c] * axis[c];
      }
      for (size_t i = 0; i < rgb.size(); i += 3) {
        double t = 0;
        for (int c = 0; c < 3; ++c) t += (img.rgb[i + c] - a.background[c]) * axis[c];
        t = std::clamp(t / len2, 0.0, 1.0);
        for (int c = 0; c < 3; ++c)
          rgb[i + c] = static_cast<uint8_t>(std::lround(a.background[c] + t * (other.rgb[c] - a.background[c])));
      }
      const auto b = kt::analyze_scene(rgb, img.width, img.height, d.palette);
      EXPECT_EQ(b.colour, other.name) << p.prompt << " recoloured: " << b.summary();
      EXPECT_EQ(b.shape, p.shape) << p.prompt << " recoloured " << other.name << ": " << b.summary();
    }

    // One shape fewer: the rightmost painted over with the background.
    std::vector<uint8_t> fewer = img.rgb;
    const auto& last = a.components.back();
    for (int y = 0; y < img.height; ++y)
      for (int x = 0; x < img.width; ++x)
        if (x >= last.box_x - 3 && x < last.box_x + last.box_w + 3 && y >= last.box_y - 3 && y < last.box_y + last.box_h + 3)
          for (int c = 0; c < 3; ++c) fewer[3 * (y * img.width + x) + c] = a.background[c];
    EXPECT_EQ(kt::analyze_scene(fewer, img.width, img.height, d.palette).count, p.count - 1) << p.prompt;

    // A ring's hole filled: circles.
    if (p.shape == "ring") {
      std::vector<uint8_t> filled = img.rgb;
      for (const auto& m : a.components)
        for (int y = 0; y < img.height; ++y)
          for (int x = 0; x < img.width; ++x)
            if (std::hypot(x - m.cx, y - m.cy) <= 0.35 * (m.box_w + m.box_h) / 2)
              for (int c = 0; c < 3; ++c) filled[3 * (y * img.width + x) + c] = a.foreground[c];
      const auto b = kt::analyze_scene(filled, img.width, img.height, d.palette);
      EXPECT_EQ(b.shape, "circle") << p.prompt << " filled: " << b.summary();
    }
  }
}

TEST(ShapeAnalysis, PlainOrFaintPicturesShowNothing) {
  const auto& pal = shape_data().palette;
  std::vector<uint8_t> plain(128 * 128 * 3, 128);
  const auto a = kt::analyze_scene(plain, 128, 128, pal);
  EXPECT_EQ(a.count, 0) << a.summary();
  EXPECT_EQ(a.colour, "") << a.summary();
  EXPECT_EQ(a.shape, "") << a.summary();
  // Noise alone is no shape either.
  const auto b = kt::analyze_scene(kt::add_noise(plain, 6, 1), 128, 128, pal);
  EXPECT_EQ(b.count, 0) << b.summary();
}

TEST(ShapeAnalysis, HueOfPaletteColours) {
  EXPECT_NEAR(kt::hue_degrees(220, 30, 30), 0, 1e-9);
  EXPECT_NEAR(kt::hue_degrees(0, 255, 0), 120, 1e-9);
  EXPECT_NEAR(kt::hue_degrees(0, 0, 255), 240, 1e-9);
  EXPECT_NEAR(kt::hue_degrees(255, 0, 255), 300, 1e-9);
  EXPECT_EQ(kt::hue_degrees(9, 9, 9), -1);
}
