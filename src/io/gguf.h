// GGUF files (ggml's container: llama.cpp, stable-diffusion.cpp, ComfyUI-GGUF), read in place.
//
// Layout (little-endian): "GGUF", version (2 or 3), tensor count and key-value count (u64), the
// key-value pairs (key string, u32 value type, value), the tensor infos (name string, u32 rank,
// rank × u64 dims in ggml order — ne[0] the innermost, the columns — u32 ggml type, u64 offset
// into the data section), padding to `general.alignment` (u32, default 32) and the data section.
// Strings are a u64 length and bytes (no terminator; names may exceed ggml's 64).
//
// The file is mmapped and its tensors are handed out in their stored block formats (the ggml
// types of core/format.h); nothing is dequantised at load. Every malformed field is refused with
// one line naming the file, the key or tensor, and what is wrong. A tensor of a ggml type the
// engine does not compute (IQ*, TQ*, Q8_K, ...) is refused naming it and its type.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "io/tensor_source.h"

namespace klein {

// GGUF value types (gguf_type in ggml's gguf.h).
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8,
  kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// One metadata value. Scalars keep their number (integers in i / u, floats in f), strings their
// text; arrays keep their element type and count, and their elements when those are numbers
// (strings of an array — a tokenizer's vocabulary — are validated and skipped).
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType elem_type = GgufType::kU8;  // arrays
  uint64_t count = 0;                  // arrays
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string str;
  std::vector<int64_t> ints;           // arrays of integers (and bools)
};

struct GgufTensor {
  std::string name;
  uint32_t ggml_type = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] innermost
  Shape shape;              // row-major (ne reversed): [out, in] for a linear weight
  uint64_t offset = 0;      // in the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

class GgufFile {
 public:
  static Result<std::shared_ptr<const GgufFile>> open(const std::filesystem::path& path);
  // The same checks on bytes already in memory (fuzzing, tests); `path` names them in messages.
  // The bytes must outlive the result.
  static Result<std::shared_ptr<const GgufFile>> parse(const uint8_t* data, size_t size, const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* value(const std::string& key) const;
  // The string value of `key`, or empty when absent or not a string.
  std::string string_value(const std::string& key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(const std::string& name) const;
  // Drops or prefetches mapped pages (TensorSource::advise); false when p is not in the file.
  bool advise(const void* p, size_t n, Residency r) const;

 private:
  std::shared_ptr<MappedFile> file_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// The ggml type's name ("Q4_K", "IQ2_XXS", "type 99" when unknown) and, for the types the engine
// computes, its format; nullopt for the others.
std::string ggml_type_name(uint32_t ggml_type);
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);

// Who wrote a GGUF, from its metadata and names: "ComfyUI-GGUF" (general.architecture of an
// image model: flux, sd1, ...), "llama.cpp" (a language-model architecture with its
// `<arch>.block_count` key), "stable-diffusion.cpp" (no general.architecture,
// `model.diffusion_model.` / `first_stage_model.` / `cond_stage_model.` names), else "unknown".
std::string gguf_producer(const GgufFile& f);

// A GGUF as a tensor source under its stored names (ScopedSource and name maps adapt them).
class GgufSource final : public TensorSource {
 public:
  static Result<std::shared_ptr<GgufSource>> open(const std::filesystem::path& path);
  explicit GgufSource(std::shared_ptr<const GgufFile> file);

  bool has(const std::string& name) const override { return file_->tensor(name) != nullptr; }
  Result<Weight> get(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::string file_of(const std::string& name) const override { return file_->path(); }
  const std::string& origin() const override { return file_->path(); }
  size_t total_bytes() const override;
  void advise(const void* p, size_t n, Residency r) const override { file_->advise(p, n, r); }

  const GgufFile& file() const { return *file_; }

 private:
  std::shared_ptr<const GgufFile> file_;
};

}  // namespace klein
