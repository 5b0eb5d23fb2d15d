// Reference images: decoding (io/image_reader) must give the same RGB bytes as diffusers'
// load_image() with Pillow 13, and preprocessing (pipeline/image_preprocess) the same float32
// tensor, bit for bit, as Flux2KleinPipeline hands to the VAE. Fixtures and expectations come from
// scripts/reference/dump_images.py (tests/data/images, tests/data/ref/images/manifest.json):
// each expected array is identified by the CRC-32 of its raw bytes, with per-row CRCs of the
// uint8 image (and, for small cases, the array itself) to say where a mismatch is.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/image_reader.h"
#include "io/npy.h"
#include "pipeline/image_preprocess.h"
#include "testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

uint32_t crc32(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

const json& manifest() {
  static const json m = [] {
    std::ifstream f(testing::data_dir() / "ref" / "images" / "manifest.json");
    return json::parse(f);
  }();
  return m;
}

fs::path data_path(const std::string& rel) { return testing::data_dir() / rel; }

// Where a uint8 HWC image differs from the expectation: the first row whose CRC differs and, if
// the expected pixels are stored, the largest difference.
std::string describe_mismatch(const std::vector<uint8_t>& u8, int width, int height, const json& e) {
  std::string out;
  const std::string hex = e.value("row_crc32_hex", "");
  for (int y = 0; y < height && static_cast<size_t>(y) * 8 + 8 <= hex.size(); ++y) {
    const uint32_t want = static_cast<uint32_t>(std::stoul(hex.substr(y * 8, 8), nullptr, 16));
    if (crc32(u8.data() + static_cast<size_t>(y) * width * 3, static_cast<size_t>(width) * 3) != want) {
      out += "first differing row " + std::to_string(y);
      break;
    }
  }
  if (e.contains("u8_npy")) {
    auto ref = read_npy(data_path(e["u8_npy"].get<std::string>()));
    if (ref.ok() && ref->bytes.size() == u8.size()) {
      int maxd = 0;
      size_t count = 0, first = 0;
      for (size_t i = 0; i < u8.size(); ++i) {
        const int d = std::abs(int(u8[i]) - int(ref->bytes[i]));
        if (d && !count++) first = i;
        maxd = std::max(maxd, d);
      }
      out += "; " + std::to_string(count) + " bytes differ, max |diff| " + std::to_string(maxd) +
             ", first at pixel (" + std::to_string(first / 3 % width) + ", " +
             std::to_string(first / 3 / width) + ")";
    }
  }
  return out;
}

// The uint8 HWC image u with t == 2*(u/255)-1 (the inverse is exact for such tensors).
std::vector<uint8_t> tensor_to_u8(const Tensor& t) {
  const int64_t h = t.dim(2), w = t.dim(3);
  std::vector<uint8_t> u(static_cast<size_t>(h * w * 3));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < h * w; ++i)
      u[i * 3 + c] = static_cast<uint8_t>(std::lround((double(t.data()[c * h * w + i]) + 1.0) / 2.0 * 255.0));
  return u;
}

TEST(ImageReader, ManifestIsThere) {
  ASSERT_GE(manifest()["good"].size(), 40u);
  ASSERT_GE(manifest()["bad"].size(), 8u);
}

TEST(ImageReader, DecodesEveryFixtureLikePillow) {
  for (const json& e : manifest()["good"]) {
    SCOPED_TRACE(e["name"].get<std::string>());
    klein::ImageSource source;
    auto img = read_image(data_path(e["file"]), {}, &source);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    const json& d = e["decoded"];
    EXPECT_EQ(img->height, d["shape"][0].get<int>());
    EXPECT_EQ(img->width, d["shape"][1].get<int>());
    EXPECT_EQ(source.mode, e["pil_mode"].get<std::string>());
    if (img->height != d["shape"][0].get<int>() || img->width != d["shape"][1].get<int>()) continue;
    const uint32_t got = crc32(img->rgb.data(), img->rgb.size());
    EXPECT_EQ(got, d["crc32"].get<uint32_t>()) << describe_mismatch(img->rgb, img->width, img->height, d);
  }
}

TEST(ImagePreprocess, MatchesPipelineOnEveryFixture) {
  for (const json& e : manifest()["good"]) {
    const std::string name = e["name"].get<std::string>();
    SCOPED_TRACE(name);
    auto img = read_image(data_path(e["file"]));
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    ReferenceGeometry g;
    auto t = preprocess_reference(*img, name, &g);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const json& p = e["preprocessed"];
    const Shape want_shape = p["shape"].get<Shape>();
    ASSERT_EQ(t->shape(), want_shape);
    const auto out = resolve_output_size(std::nullopt, std::nullopt, {g});
    EXPECT_EQ(out.first, e["output_size"][0].get<int>());
    EXPECT_EQ(out.second, e["output_size"][1].get<int>());
    const uint32_t got = crc32(t->data(), static_cast<size_t>(t->numel()) * sizeof(float));
    if (got != p["crc32"].get<uint32_t>()) {
      ADD_FAILURE() << "tensor differs from the pipeline's: "
                    << describe_mismatch(tensor_to_u8(*t), int(t->dim(3)), int(t->dim(2)), p);
    }
    if (p.contains("npy")) {  // the float32 tensor itself: max |diff| must be exactly 0
      auto ref = read_npy(data_path(p["npy"].get<std::string>()));
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      ASSERT_EQ(ref->shape, want_shape);
      const std::vector<float> r = ref->to_f32();
      float maxd = 0;
      for (size_t i = 0; i < r.size(); ++i) maxd = std::max(maxd, std::fabs(r[i] - t->data()[i]));
      EXPECT_EQ(maxd, 0.0f);
    }
  }
}

TEST(ImageReader, BadFilesFailWithAClearError) {
  for (const json& e : manifest()["bad"]) {
    SCOPED_TRACE(e["name"].get<std::string>());
    const fs::path path = data_path(e["file"]);
    auto img = read_image(path);
    if (e["stage"] == "decode") {
      ASSERT_FALSE(img.ok()) << "decoded although Pillow fails: " << e["python_error"];
      const std::string msg = img.status().message();
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      std::printf("  %-28s %s\n", path.filename().c_str(), img.status().to_string().c_str());
    } else {
      ASSERT_TRUE(img.ok()) << img.status().to_string();
      auto t = preprocess_reference(*img, path.filename().string());
      ASSERT_FALSE(t.ok()) << "preprocessed although the pipeline fails: " << e["python_error"];
      const std::string msg = t.status().message();
      EXPECT_NE(msg.find(path.filename().string()), std::string::npos) << msg;
      // diffusers' own wording, after "<name>: "
      const std::string py = e["python_error"].get<std::string>();
      EXPECT_NE(py.find(msg.substr(msg.find(": ") + 2)), std::string::npos) << msg << " vs " << py;
      std::printf("  %-28s %s\n", path.filename().c_str(), t.status().to_string().c_str());
    }
  }
}

TEST(ImageReader, TruncatedAnywhereFailsCleanly) {
  for (const char* f : {"images/png_rgb8_333x517.png", "images/png_interlaced.png", "images/jpg_baseline_333x517.jpg",
                        "images/jpg_progressive.jpg", "images/webp_lossy.webp", "images/webp_lossless_alpha.webp"}) {
    std::ifstream in(data_path(f), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 100u);
    for (double frac : {0.0, 0.05, 0.3, 0.5, 0.9}) {
      const size_t n = std::max<size_t>(frac * bytes.size(), 4);
      auto img = decode_image(bytes.data(), n, "cut.img");
      ASSERT_FALSE(img.ok()) << f << " cut to " << n << " bytes decoded";
      const std::string msg = img.status().message();
      EXPECT_EQ(msg.rfind("cut.img: ", 0), 0u) << msg;
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("corrupt") != std::string::npos ||
                  msg.find("not a PNG") != std::string::npos)
          << f << " cut to " << n << ": " << msg;
    }
  }
  // A damaged IDAT (CRC mismatch) is an error, not garbage pixels.
  std::ifstream in(data_path("images/png_grey8.png"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes[bytes.size() / 2] ^= 0x5A;
  auto img = decode_image(bytes.data(), bytes.size(), "damaged.png");
  ASSERT_FALSE(img.ok());
  EXPECT_NE(img.status().message().find("damaged.png: corrupt PNG"), std::string::npos) << img.status().message();
}

TEST(ImageReader, HugeHeaderIsRejectedBeforeAllocation) {
  for (const char* f : {"images/bad_huge_header.png", "images/bad_huge_header.jpg"}) {
    testing::LargestAllocation largest;
    auto img = read_image(data_path(f));
    const size_t biggest = largest.bytes();
    ASSERT_FALSE(img.ok());
    const std::string msg = img.status().message();
    EXPECT_TRUE(msg.find("100000x100000") != std::string::npos || msg.find("65000x65000") != std::string::npos)
        << msg;
    EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
    // The files are a few KB; a pixel buffer for the header's size would be 30 GB.
    EXPECT_LT(biggest, size_t{1} << 20) << "a " << biggest << "-byte block was requested: was a pixel buffer allocated?";
  }
  // The limit is configurable.
  ImageReadOptions small;
  small.max_pixels = 1000;
  auto img = read_image(data_path("images/png_rgb8_333x517.png"), small);
  ASSERT_FALSE(img.ok());
  EXPECT_NE(img.status().message().find("333x517"), std::string::npos) << img.status().message();
  small.max_pixels = 333 * 517;
  EXPECT_TRUE(read_image(data_path("images/png_rgb8_333x517.png"), small).ok());
}

TEST(ImageReader, DetectsTheFormatByContentNotExtension) {
  const fs::path dir = testing::make_temp_dir("images");
  const std::pair<const char*, const char*> cases[] = {
      {"images/jpg_444.jpg", "really_a_jpeg.png"},
      {"images/webp_lossy.webp", "really_a_webp.jpg"},
      {"images/png_grey8.png", "really_a_png"},
  };
  for (const auto& [src, dst] : cases) {
    fs::copy_file(data_path(src), dir / dst, fs::copy_options::overwrite_existing);
    auto a = read_image(data_path(src));
    auto b = read_image(dir / dst);
    ASSERT_TRUE(a.ok() && b.ok()) << dst;
    EXPECT_EQ(a->rgb, b->rgb) << dst;
  }
  auto missing = read_image(dir / "does_not_exist.png");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("does_not_exist.png"), std::string::npos);
  const uint8_t gif[] = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0};
  auto g = decode_image(gif, sizeof(gif), "x.gif");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("GIF"), std::string::npos) << g.status().message();
}

TEST(ImagePreprocess, GeometryFollowsThePipeline) {
  auto g = plan_reference(1500, 1000, "a");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->resized);
  EXPECT_EQ(g->resized_width, 1254);  // int(1500 * sqrt(1048576 / 1.5e6))
  EXPECT_EQ(g->resized_height, 836);
  EXPECT_EQ(g->width, 1248);
  EXPECT_EQ(g->height, 832);
  EXPECT_EQ(g->crop_left, 3);
  EXPECT_EQ(g->crop_top, 2);
  g = plan_reference(2048, 512, "b");  // exactly 1024^2: not resized
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->resized);
  EXPECT_EQ(g->width, 2048);
  g = plan_reference(1025, 1024, "c");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->resized_width, 1024);
  EXPECT_EQ(g->resized_height, 1023);
  EXPECT_EQ(g->height, 1008);
  EXPECT_EQ(g->crop_top, 7);
  EXPECT_TRUE(plan_reference(64, 64, "d").ok());
  EXPECT_TRUE(plan_reference(512, 64, "e").ok());  // ratio exactly 8 is allowed
  auto bad = plan_reference(513, 64, "f.png");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "f.png: Aspect ratio too extreme: 513\xC3\x97" "64 (ratio: 8.0:1). Maximum allowed ratio is 8:1");
  bad = plan_reference(63, 100, "g.png");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "g.png: Image too small: 63\xC3\x97" "100. Both dimensions must be at least 64px");
}

TEST(ImagePreprocess, OutputSizeDefaultsToTheFirstReference) {
  ReferenceGeometry a, b;
  a.width = 1248, a.height = 832;
  b.width = 64, b.height = 96;
  EXPECT_EQ(resolve_output_size(std::nullopt, std::nullopt, {a, b}), std::make_pair(1248, 832));
  EXPECT_EQ(resolve_output_size(512, std::nullopt, {a, b}), std::make_pair(512, 832));
  EXPECT_EQ(resolve_output_size(std::nullopt, 256, {a}), std::make_pair(1248, 256));
  EXPECT_EQ(resolve_output_size(640, 480, {a}), std::make_pair(640, 480));
  EXPECT_EQ(resolve_output_size(std::nullopt, std::nullopt, {}), std::make_pair(1024, 1024));
}

}  // namespace
}  // namespace klein
