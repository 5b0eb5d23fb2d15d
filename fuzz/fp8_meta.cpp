// The input as ComfyUI quantization metadata: a layer's `comfy_quant` JSON and the header's
// `_quantization_metadata` table (io/quant_meta.h), which come from the file unchecked.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "io/quant_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto q = klein::parse_comfy_quant(text, "f.safetensors: tensor 'x.comfy_quant'"); q.ok())
    fuzz::consume(q->format.data(), q->format.size());
  if (auto m = klein::parse_quantization_metadata(text, "f.safetensors"); m.ok())
    for (const auto& [layer, q] : *m) fuzz::consume(layer.data(), layer.size());
  return 0;
}
