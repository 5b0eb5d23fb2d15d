// safetensors files through mmap, and sets of them (sharded checkpoints, diffusers folders).
// Tensors are never copied: a Weight points into the mapping, which lives as long as the store.
//
// The store accepts every dtype of the format table; whether a tensor can be computed with is
// decided when a model binds it (validate_weight), not here. Data pointers are
// mapping + 8 + header length + offset, as the file says: a writer that does not pad the header
// to 8 bytes leaves them misaligned, so readers of 2- and 4-byte elements must use unaligned
// loads (memcpy, _mm*_loadu_*), never a dereferenced uint16_t* / float*.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/weight.h"

namespace klein {

// What a caller will do with mapped bytes soon: a hint to the OS, never a correctness matter.
enum class Residency {
  kWillNeed,  // read ahead into the page cache (not this process's RSS until touched)
  kDontNeed,  // drop this process's pages (RSS); the next touch refaults them from the file
};

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::filesystem::path& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Advises the kernel about the pages covering [p, p + n) when they lie in this mapping
  // (returns false and does nothing otherwise). The mapping is read-only and private, so
  // dropping pages loses nothing: they are read again from the file when touched.
  bool advise(const void* p, size_t n, Residency r) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

struct TensorEntry {
  DType dtype = DType::kF32;
  Shape shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int file_index = 0;  // which file of the store holds it
};

// One or more safetensors files seen as one name -> tensor map.
class WeightStore {
 public:
  // `path` may be: a .safetensors file; a *.safetensors.index.json (sharded); or a folder holding
  // either (an index json wins; otherwise every *.safetensors in it, which must not share keys).
  static Result<WeightStore> open(const std::filesystem::path& path);
  // Parses and validates one file's header; adds its tensors.
  Status add_file(const std::filesystem::path& file);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The named tensor as stored (any dtype, companions not resolved: see SafetensorsSource),
  // nbytes set; with `expected` non-empty the shape must match exactly.
  Result<Weight> get(const std::string& name, const Shape& expected = {}) const;
  const TensorEntry* entry(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::string& file_of(const std::string& name) const;
  const std::vector<std::string>& files() const { return file_names_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t total_bytes() const;
  // MappedFile::advise on the file whose mapping holds [p, p + n); nothing for other memory.
  void advise(const void* p, size_t n, Residency r) const;
  // Where the store came from (for messages).
  const std::string& origin() const { return origin_; }

 private:
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::vector<std::string> file_names_;
  std::unordered_map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  std::string origin_;
};

}  // namespace klein
