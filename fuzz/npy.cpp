// The input as a .npy file: magic, version, header dict (descr, fortran_order, shape), data
// size; then the conversions the fixtures and --noise go through.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "io/npy.h"

namespace {

// Known (issue 12): read_npy runs std::stoll on each shape entry (throws past 19 digits) and
// allocates numel * itemsize before checking the file has that many bytes (bad_alloc, or a
// signed overflow in shape_numel). Inputs whose numbers could do either are skipped.
// Saved: fuzz/crashes/npy/huge_shape_alloc.npy.
bool hits_known_header_bugs(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  double product = 1;
  for (size_t i = 0; i < s.size();) {
    if (s[i] < '0' || s[i] > '9') { ++i; continue; }
    size_t j = i;
    double v = 0;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') v = v * 10 + (s[j++] - '0');
    if (j - i > 18) return true;
    // Every non-zero number, not only the shape's: cheap, and errs on the side of skipping.
    if (v > 0) product *= v;
    i = j;
  }
  return product * 8 > static_cast<double>(size) + 64;
}

bool is_float(klein::DType t) {
  return t == klein::DType::kF32 || t == klein::DType::kF64 || t == klein::DType::kF16;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("npy");
  if (fuzz::skip_known() && hits_known_header_bugs(data, size)) return 0;
  const auto path = scratch.write("array.npy", data, size);
  auto a = klein::read_npy(path);
  if (!a.ok()) return 0;
  const auto f = a->to_f32();
  fuzz::consume(f.data(), f.size() * sizeof(float));
  // Known (issue 12): to_i64 casts float values to int64 unchecked (UB for NaN, inf, >= 2^63).
  bool casts_ok = true;
  if (is_float(a->dtype))
    for (float v : f) casts_ok = casts_ok && std::isfinite(v) && std::fabs(v) < 9.2e18f;
  if (casts_ok || !fuzz::skip_known()) {
    const auto i = a->to_i64();
    fuzz::consume(i.data(), i.size() * sizeof(int64_t));
  }
  if (!a->shape.empty()) {
    const auto t = a->to_tensor();
    fuzz::consume(t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  }
  return 0;
}
