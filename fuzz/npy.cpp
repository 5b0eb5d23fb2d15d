// The input as a .npy file: magic, version, header dict (descr, fortran_order, shape), data
// size; then the conversions the fixtures and --noise go through.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "io/npy.h"


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("npy");
  const auto path = scratch.write("array.npy", data, size);
  auto a = klein::read_npy(path);
  if (!a.ok()) return 0;
  const auto f = a->to_f32();
  fuzz::consume(f.data(), f.size() * sizeof(float));
  const auto i = a->to_i64();  // NaN / inf / out-of-range floats map to fixed values, no UB
  fuzz::consume(i.data(), i.size() * sizeof(int64_t));
  if (!a->shape.empty()) {
    const auto t = a->to_tensor();
    fuzz::consume(t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  }
  return 0;
}
