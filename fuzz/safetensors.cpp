// The input as one .safetensors file, opened as a tensor source the way a model folder's
// component is: header length, JSON header, dtypes, shapes, offsets, overlaps; then every
// tensor through the source (quantized triples resolved), validated, and small ones converted
// to float32, which reads each stored byte (misaligned data included: the header length need
// not be a multiple of 8).
#include <cstdint>

#include "core/weight.h"
#include "fuzz_util.h"
#include "io/tensor_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("safetensors");
  const auto path = scratch.write("model.safetensors", data, size);
  auto src = klein::SafetensorsSource::open(path);
  if (!src.ok()) return 0;
  for (const auto& name : (*src)->names()) {
    auto w = (*src)->get(name);
    if (!w.ok()) continue;
    (void)(*src)->file_of(name);
    if (!klein::validate_weight(*w).ok()) continue;
    if (w->numel() <= (1 << 16)) {
      auto v = klein::weight_to_vector(*w);
      fuzz::consume(v.data(), v.size() * sizeof(float));
    }
  }
  (void)(*src)->total_bytes();
  return 0;
}
