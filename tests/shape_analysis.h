// Test-only image analysis for the demo model's world (scripts/train_demo/shapes.py): one kind of
// shape in one colour, drawn one to three times on a plain background. Given a picture, it finds
// the background, the foreground, its connected components and their shape measures, and says
// which colour, shape and count the picture shows. The rules are written from the shapes'
// geometry (a square fills its box, a triangle half of it, a star is far from convex, a ring has
// a hole) and tuned on the dataset renderer's own drawings, never on a model's output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace klein::testing {

// A named colour of the palette (prompts.json's colour_rgb).
struct PaletteColour {
  std::string name;
  uint8_t rgb[3];
};

// The measures of one connected foreground component. Areas in pixels (soft: the sum of the
// foreground fraction alpha over the component's pixels and their one-pixel rim).
struct ComponentMeasures {
  double area = 0;         // soft area
  double perimeter = 0;    // length of the alpha = 0.5 contour (outer and hole boundaries)
  double circularity = 0;  // 4 pi area / perimeter^2: circle 1, square 0.79, triangle 0.60, star ~0.35
  double extent = 0;       // area / bounding-box area: square 1, circle 0.79, triangle 0.5
  double solidity = 0;     // area / convex-hull area: 1 for convex shapes, star ~0.6
  double hole_fraction = 0;  // enclosed background pixels / (component + enclosed) pixels: ring ~0.3
  double cx = 0, cy = 0;     // centroid
  int box_x = 0, box_y = 0, box_w = 0, box_h = 0;  // bounding box of the component's pixels
  std::string shape;         // this component's verdict
  std::string why;           // the rule that decided it, with the numbers it compared
};

// What a picture shows.
struct SceneAnalysis {
  uint8_t background[3] = {0, 0, 0};  // per-channel median of the border pixels
  uint8_t foreground[3] = {0, 0, 0};  // per-channel median of the confident foreground pixels
  double contrast = 0;                // |foreground - background| in RGB units
  int specks = 0;                     // components dropped as too small
  int merged = 0;                     // components cut into touching shapes
  std::vector<ComponentMeasures> components;  // the kept ones, left to right
  double hue = -1;        // circular mean hue (degrees) of the saturated foreground; -1: none
  double hue_error = 0;   // degrees from the chosen palette hue
  int colour_pixels = 0;  // how many pixels the hue was measured on
  std::string colour;     // nearest palette hue ("" without a foreground)
  std::string shape;      // majority over components ("" without one)
  int count = 0;          // components kept
  // One line: colour, shape, count and the measures behind them.
  std::string summary() const;
};

// Analyses an RGB picture (height * width * 3 bytes, row-major).
SceneAnalysis analyze_scene(const uint8_t* rgb, int width, int height, const std::vector<PaletteColour>& palette);
inline SceneAnalysis analyze_scene(const std::vector<uint8_t>& rgb, int width, int height,
                                   const std::vector<PaletteColour>& palette) {
  return analyze_scene(rgb.data(), width, height, palette);
}

// HSV hue in degrees [0, 360) of an RGB colour; -1 for a grey (max == min).
double hue_degrees(double r, double g, double b);

// Perturbations a generative model's pictures show, for testing the analysis on them: a box blur
// of the given radius (a (2r+1)^2 mean, edges clamped), and seeded Gaussian noise of the given
// standard deviation per channel (clamped to 0..255).
std::vector<uint8_t> box_blur(const std::vector<uint8_t>& rgb, int width, int height, int radius);
std::vector<uint8_t> add_noise(const std::vector<uint8_t>& rgb, double sigma, unsigned seed);
// Uneven lighting: amplitude * (sin(0.05 x + c + phase) + cos(0.04 y + 2 c)) added to channel c of
// every pixel (background and shapes alike), clamped.
std::vector<uint8_t> add_shading(const std::vector<uint8_t>& rgb, int width, int height, double amplitude, int phase);

// tests/data/demo_check/prompts.json (written by scripts/train_demo/write_test_data.py from the
// dataset's definitions): the test prompts with what each asks for, and the palette.
struct DemoPrompt {
  std::string prompt, colour, shape, background;
  int count = 0;
  std::string rendered;   // the renderer's drawing of the scene, a file beside prompts.json
  bool held_out = false;  // a combination of colour, shape and count never in training
};
struct DemoCheckData {
  int size = 0;  // the demo model's native picture size
  std::vector<PaletteColour> palette;
  std::vector<DemoPrompt> prompts;
  std::string error;  // non-empty: the file is missing or malformed
};
DemoCheckData load_demo_check();
// An image file (PNG) as height * width * 3 RGB bytes; empty with width 0 on failure.
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};
RgbImage read_rgb_image(const std::string& path);

}  // namespace klein::testing
