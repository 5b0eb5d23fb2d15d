// In-memory image encoding/decoding (klein::encode_image / decode_image) and references given as
// bytes (GenerateRequest::reference_data): what `klein serve` uses instead of files.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "klein/klein.h"
#include "testing.h"

namespace {

klein::Image gradient(int w, int h) {
  klein::Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>((i * 7) % 251);
  return img;
}

std::vector<uint8_t> file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(ImageCodec, PngRoundTripsExactlyWithMetadata) {
  const klein::Image img = gradient(48, 32);
  auto png = klein::encode_image(img, klein::ImageFileFormat::kPng, {{"prompt", "a cat"}, {"seed", "7"}});
  ASSERT_TRUE(png.ok()) << png.status().to_string();
  auto back = klein::decode_image(*png, "mem.png");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->width, 48);
  EXPECT_EQ(back->height, 32);
  EXPECT_EQ(back->rgb, img.rgb);
  const std::string bytes(png->begin(), png->end());
  EXPECT_NE(bytes.find("iTXt"), std::string::npos);
  EXPECT_NE(bytes.find("a cat"), std::string::npos);
}

TEST(ImageCodec, JpegAndWebpDecodeToTheSameSize) {
  const klein::Image img = gradient(64, 48);
  for (auto fmt : {klein::ImageFileFormat::kJpeg, klein::ImageFileFormat::kWebp}) {
    auto data = klein::encode_image(img, fmt, {}, 80);
    ASSERT_TRUE(data.ok()) << data.status().to_string();
    auto back = klein::decode_image(*data);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->width, 64);
    EXPECT_EQ(back->height, 48);
  }
}

TEST(ImageCodec, BadInputsAreOneLineErrors) {
  klein::Image empty;
  EXPECT_EQ(klein::encode_image(empty, klein::ImageFileFormat::kPng).status().code(), klein::Code::kInvalidArgument);
  EXPECT_EQ(klein::encode_image(gradient(8, 8), klein::ImageFileFormat::kJpeg, {}, 0).status().code(),
            klein::Code::kInvalidArgument);
  auto bad = klein::decode_image(std::vector<uint8_t>{'n', 'o', 'p', 'e'}, "upload.png");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("upload.png"), std::string::npos) << bad.status().message();
}

TEST(ImageCodec, ReferenceDataEqualsTheSameFile) {
  const auto ref = klein::testing::data_dir() / "ref" / "edit1_auto" / "ref0.png";
  auto m = klein::Model::open(klein::testing::tiny_model_dir().string(), {.threads = 2});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  klein::GenerateRequest from_file{.prompt = "edit", .steps = 2, .seed = 3};
  from_file.reference_images = {ref.string()};
  klein::GenerateRequest from_memory{.prompt = "edit", .steps = 2, .seed = 3};
  from_memory.reference_data = {{"dir/upload.png", file_bytes(ref)}};
  auto a = (*m)->generate(from_file);
  auto b = (*m)->generate(from_memory);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->image.rgb, b->image.rgb);
  bool named = false;
  for (const auto& [k, v] : b->metadata) named |= k == "reference1" && v == "upload.png";
  EXPECT_TRUE(named) << "the metadata names the reference by its last path component";
}

}  // namespace
