// Writing GGUF files (the container io/gguf.h reads): version 3, the key-value pairs given, the
// tensor infos (dims in ggml order), zero padding to the alignment after the infos and after each
// tensor's data — the layout ggml's gguf_write_to_file and gguf-py's GGUFWriter produce. The
// data are streamed: one tensor's bytes are asked for at a time, so a model never has to be in
// memory whole. The file is written atomically (io/atomic_file.h): nothing is left on error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/gguf.h"

namespace klein {

// A metadata value: a string (type kString) or an unsigned 32-bit integer (kU32) — what the two
// DiT producers write (general.architecture, general.quantization_version, general.file_type).
struct GgufKvOut {
  std::string key;
  GgufType type = GgufType::kU32;
  std::string str;
  uint32_t u32 = 0;
};

struct GgufTensorOut {
  std::string name;
  DType dtype = DType::kF32;  // F32, F16, BF16 or a ggml block format
  std::vector<int64_t> ne;    // ggml order: ne[0] the innermost (a Linear's input dimension)
  uint64_t nbytes = 0;        // rows × row bytes
};

// The ggml type id of a dtype GGUF files hold (F32 0, F16 1, Q4_0 2, ..., BF16 30); -1 for others.
int ggml_type_of(DType t);
// Bytes of a tensor of `dtype` with ggml dims `ne` (ne[0] a multiple of the block size).
uint64_t gguf_tensor_bytes(DType dtype, const std::vector<int64_t>& ne);

// Writes `path` atomically. produce(i, bytes) fills tensor i's data (resized to its nbytes by the
// writer); tensors are asked for in order. An error from produce aborts the write.
Status write_gguf(const std::filesystem::path& path, const std::vector<GgufKvOut>& kvs,
                  const std::vector<GgufTensorOut>& tensors,
                  const std::function<Status(size_t, std::vector<uint8_t>&)>& produce, uint32_t alignment = 32);

}  // namespace klein
