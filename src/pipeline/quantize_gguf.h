// `klein quantize --type gguf:<TYPE>`: the transformer written as ONE GGUF file, the way the two
// producers of community DiT GGUFs write it, so that ComfyUI-GGUF and stable-diffusion.cpp load it:
//
//   comfy (ComfyUI-GGUF: tools/convert.py, then its patched llama-quantize, tools/lcpp.patch):
//     BFL names; metadata general.architecture = "flux", general.quantization_version = 2,
//     general.file_type (llama.cpp's ftype of the type); 1-D tensors and tensors of ≤ 1024
//     elements F32 (from a bf16 / f32 source), other tensors staged as BF16 (bf16 source) or F16;
//     then every tensor whose name ends in "weight" with ≥ 2 dims is quantized, except those
//     whose name contains txt_in. / img_in. / time_in. / vector_in. / guidance_in. /
//     final_layer. (kept as staged); a row that is not whole blocks of a K-quant (or of a
//     32-block type) falls back to F16.
//   sdcpp (stable-diffusion.cpp `-M convert --diffusion-model`, model_loader.cpp
//     tensor_should_be_converted): no metadata at all; names "model.diffusion_model." + BFL
//     name; kept in the source type: *.bias, *.scale, names containing img_in. / txt_in. /
//     time_in. / vector_in. / guidance_in. / final_layer. / embedding, and rows that are not
//     whole blocks of the type; everything else converted.
//
// Quantized from the source's values (f32 rows of its stored bf16 / f16 / f32 tensors) with
// core/quantize_gguf.h (ggml's reference quantizers, bit-exact). The BFL tensors are assembled
// from the source's diffusers names by inverting io/name_map.h's bfl_flux2_dit_map: q / k / v
// rows concatenated into qkv, the final modulation's halves swapped back. Streams tensor by
// tensor (one output tensor in memory; the source pages of each tensor dropped after it), into
// an atomic write (io/gguf_writer.h).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace klein {

class TensorSource;

enum class GgufFlavor { kComfy, kSdcpp };

// "gguf:Q4_K" → Q4_K (the types core/quantize_gguf.h writes); the error names what is accepted.
Result<DType> parse_gguf_type(const std::string& type);
Result<GgufFlavor> parse_gguf_flavor(const std::string& flavor);
// llama.cpp's general.file_type for a file of `t` (LLAMA_FTYPE_MOSTLY_*; the K-quants as their
// _S mixes, which for FLUX names are all-`t` in ComfyUI-GGUF's llama-quantize).
uint32_t llama_file_type(DType t);

struct GgufDitSpec {
  std::shared_ptr<const TensorSource> source;  // the transformer under diffusers names
  std::filesystem::path output;                // the .gguf file (written atomically)
  DType type = DType::kQ8_0;
  GgufFlavor flavor = GgufFlavor::kComfy;
  int threads = 0;
  std::function<void(const std::string&, int, int)> progress;
  std::function<bool()> cancel;
  std::function<void(const std::string&)> log;
};

Status write_dit_gguf(const GgufDitSpec& spec);

}  // namespace klein
