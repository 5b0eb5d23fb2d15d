// The input as one .gguf file, opened as a tensor source: header, key-value pairs (types, string
// lengths, arrays), tensor infos (ranks, dims, ggml types, offsets, alignment, overlaps); then every
// tensor through the source, validated, and small ones dequantized to float32 (every block format's
// scalar reference reads each stored byte, misaligned blocks included).
#include <cstdint>

#include "core/weight.h"
#include "fuzz_util.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("gguf");
  const auto path = scratch.write("model.gguf", data, size);
  auto src = klein::GgufSource::open(path);
  if (!src.ok()) return 0;
  (void)klein::gguf_producer((*src)->file());
  for (const auto& name : (*src)->names()) {
    auto w = (*src)->get(name);
    if (!w.ok()) continue;
    if (!klein::validate_weight(*w).ok()) continue;
    if (w->numel() <= (1 << 16)) {
      auto v = klein::weight_to_vector(*w);
      fuzz::consume(v.data(), v.size() * sizeof(float));
    }
  }
  (void)(*src)->total_bytes();
  return 0;
}
