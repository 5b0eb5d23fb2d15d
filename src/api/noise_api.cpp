// klein::randn: torch's seeded CPU normal draw through the public API (front ends that batch
// several images from one generator, as diffusers does, slice one draw).
#include "api/guard.h"
#include "api/model_impl.h"
#include "pipeline/noise.h"

namespace klein {

Result<FloatArray> randn(const std::vector<int64_t>& shape, uint64_t seed, bool bf16) {
  return api::guarded("randn", [&]() -> Result<FloatArray> {
    if (shape.empty()) return invalid_argument("randn: empty shape");
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 1 || d > (int64_t{1} << 31) || n > (int64_t{1} << 31) / d)
        return invalid_argument("randn: shape " + shape_str(shape) + ": every dimension >= 1, at most 2^31 values");
      n *= d;
    }
    return to_array(torch_randn(shape, seed, bf16));
  });
}

}  // namespace klein
