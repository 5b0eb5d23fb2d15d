// Every input a fuzz harness ever crashed on (fuzz/crashes/<harness>/) runs here through the code
// that crashed, in the normal suite, with what it must do now. scripts/fuzz.sh also replays them
// under the sanitizers before fuzzing.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "core/weight.h"
#include "io/model_folder.h"
#include "io/npy.h"
#include "io/tensor_source.h"

namespace fs = std::filesystem;

namespace klein {
namespace {

fs::path crashes() { return fs::path(KLEIN_SOURCE_DIR) / "fuzz" / "crashes"; }

TEST(FuzzRegressions, ZeroLeadingDimensionHasColumnsAndNoDivision) {
  auto src = SafetensorsSource::open(crashes() / "safetensors" / "zero_leading_dim_cols_div0.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  int empty_matrices = 0;
  for (const auto& name : (*src)->names()) {
    auto w = (*src)->get(name);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    if (!validate_weight(*w).ok()) continue;
    const auto v = weight_to_vector(*w);
    EXPECT_EQ(static_cast<int64_t>(v.size()), w->numel());
    if (w->shape.size() >= 2 && w->rows() == 0) {
      ++empty_matrices;
      int64_t trailing = 1;
      for (size_t i = 1; i < w->shape.size(); ++i) trailing *= w->shape[i];
      EXPECT_EQ(w->cols(), trailing) << name;  // [0, 4]: four columns, no rows
    }
  }
  EXPECT_GE(empty_matrices, 1);
}

TEST(FuzzRegressions, NpyInfToI64IsDefined) {
  auto a = read_npy(crashes() / "npy" / "to_i64_f16_inf.npy");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const auto f = a->to_f32();
  const auto i = a->to_i64();
  ASSERT_EQ(f.size(), i.size());
  for (size_t k = 0; k < f.size(); ++k)
    if (std::isinf(f[k]))
      EXPECT_EQ(i[k], f[k] > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min());
}

TEST(FuzzRegressions, NpyShapeLargerThanTheFileIsAFormatErrorNotAnAllocation) {
  const fs::path p = crashes() / "npy" / "huge_shape_alloc.npy";
  auto a = read_npy(p);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::kFormatError) << a.status().to_string();
  EXPECT_NE(a.status().message().find(p.string()), std::string::npos) << a.status().message();
}

}  // namespace
}  // namespace klein

namespace klein {
namespace {

// Found while writing the model_index harness: a component name is used as a path, so
// "../x" would have read configs from outside the model folder.
TEST(FuzzRegressions, ModelIndexComponentNamesCannotLeaveTheFolder) {
  const fs::path dir = fs::temp_directory_path() / ("klein_mi_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const std::string bad : {"..", "../vae", "a/b", "."}) {
    std::ofstream(dir / "model_index.json") << "{\"_class_name\": \"Flux2KleinPipeline\", \"" << bad
                                            << "\": [\"diffusers\", \"AutoencoderKLFlux2\"]}";
    auto m = ModelFolder::open(dir);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), Code::kFormatError);
    EXPECT_NE(m.status().message().find("not a plain folder name"), std::string::npos) << m.status().message();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace klein
