#include "io/gguf_writer.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/quantize_gguf.h"
#include "io/atomic_file.h"

namespace klein {
namespace gguf_out {  // named: unity builds put this file beside the reader

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_str(std::string& s, const std::string& v) {
  put_u64(s, v.size());
  s += v;
}
uint64_t pad_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace gguf_out

int ggml_type_of(DType t) {
  // The inverse of dtype_from_ggml over ggml's type ids (io/gguf.h).
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<DType> d = dtype_from_ggml(id);
    if (d && *d == t) return static_cast<int>(id);
  }
  return -1;
}

uint64_t gguf_tensor_bytes(DType dtype, const std::vector<int64_t>& ne) {
  if (ne.empty()) return 0;
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= static_cast<uint64_t>(ne[i]);
  return rows * static_cast<uint64_t>(ggml_quant::row_bytes(dtype, ne[0]));
}

Status write_gguf(const std::filesystem::path& path, const std::vector<GgufKvOut>& kvs,
                  const std::vector<GgufTensorOut>& tensors,
                  const std::function<Status(size_t, std::vector<uint8_t>&)>& produce, uint32_t alignment) {
  using namespace gguf_out;  // NOLINT: this function only (unity builds)
  if (alignment == 0 || alignment % 8 != 0) return invalid_argument("GGUF alignment " + std::to_string(alignment) + ": not a multiple of 8");
  std::string h = "GGUF";
  put_u32(h, 3);
  put_u64(h, tensors.size());
  put_u64(h, kvs.size());
  for (const GgufKvOut& kv : kvs) {
    put_str(h, kv.key);
    put_u32(h, static_cast<uint32_t>(kv.type));
    if (kv.type == GgufType::kString) put_str(h, kv.str);
    else if (kv.type == GgufType::kU32) put_u32(h, kv.u32);
    else return internal_error("GGUF key '" + kv.key + "': the writer writes strings and u32 only");
  }
  uint64_t off = 0;
  for (const GgufTensorOut& t : tensors) {
    const int id = ggml_type_of(t.dtype);
    if (id < 0 || t.ne.empty() || t.ne.size() > 4)
      return internal_error("GGUF tensor '" + t.name + "': type or rank not writable");
    put_str(h, t.name);
    put_u32(h, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put_u64(h, static_cast<uint64_t>(d));
    put_u32(h, static_cast<uint32_t>(id));
    put_u64(h, off);
    off = pad_to(off + t.nbytes, alignment);
  }
  h.resize(pad_to(h.size(), alignment), '\0');
  Status failure;
  Status st = write_file_atomic(path, [&](std::FILE* f) {
    if (std::fwrite(h.data(), 1, h.size(), f) != h.size()) return false;
    std::vector<uint8_t> bytes;
    static const char kZeros[64] = {};
    for (size_t i = 0; i < tensors.size(); ++i) {
      bytes.assign(tensors[i].nbytes, 0);
      failure = produce(i, bytes);
      if (!failure.ok()) return false;
      if (bytes.size() != tensors[i].nbytes) {
        failure = internal_error("GGUF tensor '" + tensors[i].name + "': " + std::to_string(bytes.size()) +
                                 " bytes produced, " + std::to_string(tensors[i].nbytes) + " expected");
        return false;
      }
      if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) return false;
      for (uint64_t pad = pad_to(bytes.size(), alignment) - bytes.size(); pad > 0;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof kZeros));
        if (std::fwrite(kZeros, 1, n, f) != n) return false;
        pad -= n;
      }
    }
    return true;
  });
  if (!failure.ok()) return failure;
  return st;
}

}  // namespace klein
