#include "io/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace klein {

Status write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (dtype_size(t.dtype) == 0) return unsupported(path.string() + ": cannot write dtype " + std::string(dtype_name(t.dtype)));
    h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string hs = h.dump();
  pad_safetensors_header(hs);
  return write_file_atomic(path, [&](std::FILE* f) {
    uint8_t len[8];
    uint64_t L = hs.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(L >> (8 * i));
    if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(hs.data(), 1, hs.size(), f) != hs.size()) return false;
    for (const auto& t : tensors) {
      const size_t n = static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
      if (n && std::fwrite(t.data, 1, n, f) != n) return false;
    }
    return true;
  });
}

}  // namespace klein
