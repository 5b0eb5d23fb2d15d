// ComfyUI's per-layer quantization metadata: the JSON in a layer's `X.comfy_quant` U8 tensor
// ({"format": "float8_e4m3fn", ...}) and the header entry `_quantization_metadata`
// ({"format_version": "1.0", "layers": {"<layer>": {"format": ...}, ...}}), as ComfyUI's
// QUANTIZATION.md and comfy/quant_ops.py define them. The source checks each stored weight
// against the format its layer claims (tensor_source.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/status.h"

namespace klein {

struct LayerQuant {
  std::string format;           // ComfyUI's QUANT_ALGOS name: "float8_e4m3fn", "int8_tensorwise", ...
  bool convrot = false;         // int8_tensorwise: activations rotated by a block Hadamard
  int64_t convrot_group = 0;    // its group size ("convrot_groupsize"; 0 when not given)
};

// Formats klein computes: "float8_e4m3fn" (F8_E4M3 weight + per-tensor scale) and
// "int8_tensorwise" (I8 weight + per-tensor or per-row scale, without convrot).
bool comfy_format_computed(std::string_view format);

// One layer's JSON object. Errors (malformed JSON, no "format", a format ComfyUI does not define or
// klein does not compute) are one line starting with `where` and naming the format.
Result<LayerQuant> parse_comfy_quant(std::string_view json, const std::string& where);
// The `_quantization_metadata` header value: layer name (without ".weight") → its quantization.
Result<std::map<std::string, LayerQuant>> parse_quantization_metadata(std::string_view json, const std::string& where);

}  // namespace klein
