#include "io/gguf.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "core/format.h"
#include "core/weight.h"

namespace klein {
namespace {

// ggml_type ids (ggml.h) and their names; ids 4, 5 and 31-33 are retired.
constexpr std::array<const char*, 40> kGgmlTypeNames = {
    "F32",  "F16",     "Q4_0",   "Q4_1",    "type 4", "type 5", "Q5_0",   "Q5_1",   "Q8_0",  "Q8_1",
    "Q2_K", "Q3_K",    "Q4_K",   "Q5_K",    "Q6_K",   "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL", "IQ3_S", "IQ2_S",  "IQ4_XS",  "I8",     "I16",    "I32",    "I64",    "F64",   "IQ1_M",
    "BF16", "type 31", "type 32", "type 33", "TQ1_0", "TQ2_0",  "type 36", "type 37", "type 38", "MXFP4"};

struct GgmlTypeRow {
  uint32_t id;
  DType dtype;
};
constexpr GgmlTypeRow kGgmlTypes[] = {
    {0, DType::kF32},   {1, DType::kF16},   {30, DType::kBF16}, {8, DType::kQ8_0},  {2, DType::kQ4_0},
    {3, DType::kQ4_1},  {6, DType::kQ5_0},  {7, DType::kQ5_1},  {10, DType::kQ2_K}, {11, DType::kQ3_K},
    {12, DType::kQ4_K}, {13, DType::kQ5_K}, {14, DType::kQ6_K},
};

constexpr uint32_t kMaxDims = 4;                        // GGML_MAX_DIMS
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;  // far above any key, name or chat template

const char* value_type_name(uint32_t t) {
  static const char* const kNames[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return t < std::size(kNames) ? kNames[t] : "unknown";
}

// A bounds-checked little-endian reader over the file; every read names what it reads.
class GgufCursor {
 public:
  GgufCursor(const uint8_t* data, size_t size, const std::string& path) : p_(data), size_(size), path_(path) {}
  size_t pos() const { return pos_; }
  Status need(uint64_t n, const std::string& what) const {
    if (n > size_ - pos_)
      return format_error(path_ + ": " + what + " runs past the end of the file at byte " + std::to_string(pos_) +
                          " (truncated file?)");
    return Status::Ok();
  }
  template <class T>
  Status read(T* out, const std::string& what) {
    KLEIN_RETURN_IF_ERROR(need(sizeof(T), what));
    std::memcpy(out, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status read_string(std::string* out, const std::string& what) {
    uint64_t len = 0;
    KLEIN_RETURN_IF_ERROR(read(&len, what + " length"));
    if (len > kMaxStringBytes)
      return format_error(path_ + ": " + what + " length " + std::to_string(len) + " is implausibly large");
    KLEIN_RETURN_IF_ERROR(need(len, what));
    if (out) out->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }
  Status skip(uint64_t n, const std::string& what) {
    KLEIN_RETURN_IF_ERROR(need(n, what));
    pos_ += n;
    return Status::Ok();
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

// One scalar of type t into v (integers in i and u, floats in f).
Status read_scalar(GgufCursor& c, GgufType t, GgufValue* v, const std::string& what) {
  auto get = [&](auto tag) -> Status {
    decltype(tag) x{};
    KLEIN_RETURN_IF_ERROR(c.read(&x, what));
    if constexpr (std::is_floating_point_v<decltype(tag)>) {
      v->f = x;
    } else {
      v->i = static_cast<int64_t>(x);
      v->u = static_cast<uint64_t>(x);
      v->f = static_cast<double>(x);
    }
    return Status::Ok();
  };
  switch (t) {
    case GgufType::kU8: return get(uint8_t{});
    case GgufType::kI8: return get(int8_t{});
    case GgufType::kBool: {
      uint8_t b = 0;
      KLEIN_RETURN_IF_ERROR(c.read(&b, what));
      if (b > 1) return format_error(what + " is a bool of value " + std::to_string(b) + " (0 or 1)");
      v->i = b;
      v->u = b;
      return Status::Ok();
    }
    case GgufType::kU16: return get(uint16_t{});
    case GgufType::kI16: return get(int16_t{});
    case GgufType::kU32: return get(uint32_t{});
    case GgufType::kI32: return get(int32_t{});
    case GgufType::kF32: return get(float{});
    case GgufType::kU64: return get(uint64_t{});
    case GgufType::kI64: return get(int64_t{});
    case GgufType::kF64: return get(double{});
    default: return internal_error(what + ": not a scalar type");
  }
}

}  // namespace

std::string ggml_type_name(uint32_t t) {
  return t < kGgmlTypeNames.size() ? kGgmlTypeNames[t] : "type " + std::to_string(t);
}

std::optional<DType> dtype_from_ggml(uint32_t t) {
  for (const auto& row : kGgmlTypes)
    if (row.id == t) return row.dtype;
  return std::nullopt;
}

Result<std::shared_ptr<const GgufFile>> GgufFile::open(const std::filesystem::path& path) {
  KLEIN_ASSIGN_OR_RETURN(auto mf, MappedFile::open(path));
  KLEIN_ASSIGN_OR_RETURN(auto parsed, parse(mf->data(), mf->size(), path.string()));
  auto f = std::make_shared<GgufFile>(*parsed);
  f->file_ = std::move(mf);
  return std::shared_ptr<const GgufFile>(std::move(f));
}

Result<std::shared_ptr<const GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, const std::string& path) {
  auto f = std::make_shared<GgufFile>();
  f->path_ = path;
  const std::string& p = f->path_;
  GgufCursor c(data, size, p);
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) return format_error(p + ": not a GGUF file (bad magic)");
  KLEIN_RETURN_IF_ERROR(c.skip(4, "magic"));
  KLEIN_RETURN_IF_ERROR(c.read(&f->version_, "GGUF version"));
  if (f->version_ != 2 && f->version_ != 3)
    return unsupported(p + ": GGUF version " + std::to_string(f->version_) + " (klein reads versions 2 and 3)");
  uint64_t n_tensors = 0, n_kv = 0;
  KLEIN_RETURN_IF_ERROR(c.read(&n_tensors, "tensor count"));
  KLEIN_RETURN_IF_ERROR(c.read(&n_kv, "key-value count"));
  // Each key-value pair takes at least 12 bytes and each tensor info at least 24: a count the rest
  // of the file cannot hold is corrupt (and must not size an allocation).
  const uint64_t rest = size - c.pos();
  if (n_kv > rest / 12) return format_error(p + ": key-value count " + std::to_string(n_kv) + " exceeds what the file holds (truncated file?)");
  if (n_tensors > rest / 24)
    return format_error(p + ": tensor count " + std::to_string(n_tensors) +
                        " exceeds what the file holds (truncated file?)");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    KLEIN_RETURN_IF_ERROR(c.read_string(&key, "key " + std::to_string(k)));
    const std::string where = p + ": key '" + key + "'";
    if (key.empty()) return format_error(p + ": key " + std::to_string(k) + " is empty");
    if (f->kv_.count(key)) return format_error(where + " appears twice");
    uint32_t type = 0;
    KLEIN_RETURN_IF_ERROR(c.read(&type, where + " type"));
    if (type > static_cast<uint32_t>(GgufType::kF64))
      return format_error(where + " has unknown value type " + std::to_string(type));
    GgufValue v;
    v.type = static_cast<GgufType>(type);
    if (v.type == GgufType::kString) {
      KLEIN_RETURN_IF_ERROR(c.read_string(&v.str, where + " string"));
    } else if (v.type == GgufType::kArray) {
      uint32_t et = 0;
      KLEIN_RETURN_IF_ERROR(c.read(&et, where + " array type"));
      if (et == static_cast<uint32_t>(GgufType::kArray))
        return format_error(where + " is an array of arrays (not allowed in GGUF)");
      if (et > static_cast<uint32_t>(GgufType::kF64))
        return format_error(where + " is an array of unknown value type " + std::to_string(et));
      v.elem_type = static_cast<GgufType>(et);
      KLEIN_RETURN_IF_ERROR(c.read(&v.count, where + " array length"));
      if (v.elem_type == GgufType::kString) {
        if (v.count > (size - c.pos()) / 8)
          return format_error(where + ": array length " + std::to_string(v.count) + " exceeds what the file holds");
        for (uint64_t i = 0; i < v.count; ++i)
          KLEIN_RETURN_IF_ERROR(c.read_string(nullptr, where + " element " + std::to_string(i)));
      } else {
        const size_t es = scalar_size(v.elem_type);
        if (v.count > (size - c.pos()) / es)
          return format_error(where + ": array of " + std::to_string(v.count) + " " + value_type_name(et) +
                              " runs past the end of the file (truncated file?)");
        const bool integer = v.elem_type != GgufType::kF32 && v.elem_type != GgufType::kF64;
        if (integer && v.count <= 64) {  // small integer arrays (ComfyUI's orig_shape) are kept
          for (uint64_t i = 0; i < v.count; ++i) {
            GgufValue e;
            KLEIN_RETURN_IF_ERROR(read_scalar(c, v.elem_type, &e, where + " element " + std::to_string(i)));
            v.ints.push_back(e.i);
          }
        } else {
          KLEIN_RETURN_IF_ERROR(c.skip(v.count * es, where + " array"));
        }
      }
    } else {
      KLEIN_RETURN_IF_ERROR(read_scalar(c, v.type, &v, where));
    }
    f->kv_.emplace(key, std::move(v));
  }

  if (const GgufValue* a = f->value("general.alignment")) {
    if (a->type != GgufType::kU32)
      return format_error(p + ": key 'general.alignment' is a " + value_type_name(static_cast<uint32_t>(a->type)) +
                          ", not a u32");
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
      return format_error(p + ": key 'general.alignment' is " + std::to_string(a->u) + ", not a power of two");
    f->alignment_ = a->u;
  }

  f->tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    KLEIN_RETURN_IF_ERROR(c.read_string(&t.name, "name of tensor " + std::to_string(k)));
    const std::string where = p + ": tensor '" + t.name + "'";
    if (t.name.empty()) return format_error(p + ": tensor " + std::to_string(k) + " has an empty name");
    if (f->index_.count(t.name)) return format_error(where + " appears twice");
    uint32_t rank = 0;
    KLEIN_RETURN_IF_ERROR(c.read(&rank, where + " rank"));
    if (rank == 0 || rank > kMaxDims)
      return format_error(where + " has " + std::to_string(rank) + " dimensions (1 to 4)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      uint64_t ne = 0;
      KLEIN_RETURN_IF_ERROR(c.read(&ne, where + " dimension " + std::to_string(d)));
      if (ne > (uint64_t{1} << 40) || (ne && numel > (uint64_t{1} << 42) / ne))
        return format_error(where + ": dimension " + std::to_string(d) + " (" + std::to_string(ne) +
                            ") makes the tensor implausibly large");
      numel *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    KLEIN_RETURN_IF_ERROR(c.read(&t.ggml_type, where + " type"));
    KLEIN_RETURN_IF_ERROR(c.read(&t.offset, where + " offset"));
    const auto dt = dtype_from_ggml(t.ggml_type);
    if (!dt)
      return unsupported(where + " has ggml type " + ggml_type_name(t.ggml_type) +
                         ", which klein does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K-Q6_K)");
    t.dtype = *dt;
    const FormatTraits& fm = format_traits(t.dtype);
    if (t.ne[0] % fm.block_elems != 0)
      return format_error(where + ": " + std::to_string(t.ne[0]) + " columns, not a multiple of " +
                          std::string(fm.name) + "'s block of " + std::to_string(fm.block_elems));
    if (t.offset % f->alignment_ != 0)
      return format_error(where + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                          std::to_string(f->alignment_));
    t.nbytes = static_cast<size_t>(numel / fm.block_elems * fm.block_bytes);
    f->index_.emplace(t.name, f->tensors_.size());
    f->tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t data_start = (c.pos() + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  if (data_start > size && !f->tensors_.empty())
    return format_error(p + ": the data section starts past the end of the file (truncated file?)");
  const uint64_t data_len = data_start <= size ? size - data_start : 0;
  std::vector<const GgufTensor*> by_offset;
  for (GgufTensor& t : f->tensors_) {
    if (t.offset > data_len || t.nbytes > data_len - t.offset)
      return format_error(p + ": tensor '" + t.name + "': bytes [" + std::to_string(t.offset) + ", " +
                          std::to_string(t.offset + t.nbytes) + ") of the data section are out of range (it has " +
                          std::to_string(data_len) + " bytes; truncated file?)");
    t.data = data + data_start + t.offset;
    if (t.nbytes) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->nbytes)
      return format_error(p + ": tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
  return std::shared_ptr<const GgufFile>(std::move(f));
}

const GgufValue* GgufFile::value(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::string GgufFile::string_value(const std::string& key) const {
  const GgufValue* v = value(key);
  return v && v->type == GgufType::kString ? v->str : std::string();
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

bool GgufFile::advise(const void* p, size_t n, Residency r) const { return file_ && file_->advise(p, n, r); }

std::string gguf_producer(const GgufFile& f) {
  const std::string arch = f.string_value("general.architecture");
  // ComfyUI-GGUF's tools/convert.py architectures (image models).
  static const char* const kComfyArchs[] = {"flux", "sd1", "sdxl", "sd3", "aura", "hidream", "cosmos", "ltxv",
                                           "hyvid", "wan", "lumina2", "qwen_image"};
  for (const char* a : kComfyArchs)
    if (arch == a) return "ComfyUI-GGUF";
  if (!arch.empty() && f.value(arch + ".block_count")) return "llama.cpp";
  if (arch.empty())
    for (const auto& t : f.tensors())
      if (t.name.starts_with("model.diffusion_model.") || t.name.starts_with("first_stage_model.") ||
          t.name.starts_with("cond_stage_model.") || t.name.starts_with("text_encoders."))
        return "stable-diffusion.cpp";
  return "unknown";
}

Result<std::shared_ptr<GgufSource>> GgufSource::open(const std::filesystem::path& path) {
  KLEIN_ASSIGN_OR_RETURN(auto f, GgufFile::open(path));
  return std::make_shared<GgufSource>(std::move(f));
}

GgufSource::GgufSource(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}

Result<Weight> GgufSource::get(const std::string& name) const {
  const GgufTensor* t = file_->tensor(name);
  if (!t) return not_found(file_->path() + ": tensor '" + name + "' is missing");
  Weight w;
  w.name = name;
  w.dtype = t->dtype;
  w.shape = t->shape;
  w.data = t->data;
  w.nbytes = t->nbytes;
  return w;
}

std::vector<std::string> GgufSource::names() const {
  std::vector<std::string> r;
  r.reserve(file_->tensors().size());
  for (const auto& t : file_->tensors()) r.push_back(t.name);
  std::sort(r.begin(), r.end());
  return r;
}

size_t GgufSource::total_bytes() const {
  size_t n = 0;
  for (const auto& t : file_->tensors()) n += t.nbytes;
  return n;
}

}  // namespace klein
