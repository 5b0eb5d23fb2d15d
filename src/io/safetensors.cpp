#include "core/format.h"
#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file_counter.h"
#include "io/json_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace klein {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const fs::path& path) {
  const std::string p = path.string();
  note_file_opened(p);
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(p + ": no such file");
    return io_error(p + ": cannot open (" + std::strerror(errno) + ")");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error(p + ": not a regular file");
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = p;
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    void* addr = mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      ::close(fd);
      return io_error(p + ": mmap failed (" + std::strerror(errno) + ")");
    }
    m->data_ = static_cast<const uint8_t*>(addr);
#ifdef MADV_HUGEPAGE
    // Before the first touch: the page faults then read the file into 2 MiB page-cache folios,
    // which the kernel maps with 2 MiB entries (the tile GEMMs read 16 weight rows several KiB
    // apart per load; see core/host_memory.h). Advice only; ignored where THP is off.
    madvise(addr, m->size_, MADV_HUGEPAGE);
#endif
  }
  ::close(fd);
  return m;
}

bool MappedFile::advise(const void* p, size_t n, Residency r) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (!data_ || n == 0 || b < data_ || b + n > data_ + size_) return false;
  // Whole pages: rounding outwards may touch a neighbour tensor's page, which costs at most a
  // refault (read-only private file mapping) and never changes data.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(b) / page * page;
  const uintptr_t hi = std::min(reinterpret_cast<uintptr_t>(data_ + size_), reinterpret_cast<uintptr_t>(b + n));
  madvise(reinterpret_cast<void*>(lo), hi - lo, r == Residency::kWillNeed ? MADV_WILLNEED : MADV_DONTNEED);
  return true;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

Status WeightStore::add_file(const fs::path& file) {
  KLEIN_ASSIGN_OR_RETURN(auto mf, MappedFile::open(file));
  const std::string p = file.string();
  if (mf->size() < 8) return format_error(p + ": truncated safetensors file (" + std::to_string(mf->size()) + " bytes)");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | mf->data()[i];
  if (hlen > mf->size() - 8) return format_error(p + ": header length " + std::to_string(hlen) + " exceeds file size " + std::to_string(mf->size()) + " (truncated file?)");
  if (hlen > (size_t{100} << 20)) return format_error(p + ": header length " + std::to_string(hlen) + " is implausibly large");
  json h;
  // JSON lets a key repeat (the last one wins); a header naming a tensor twice is corrupt.
  std::set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    h = json::parse(mf->data() + 8, mf->data() + 8 + hlen, on_event);
  } catch (const std::exception& e) {
    return format_error(p + ": safetensors header is not valid JSON (" + e.what() + ")");
  }
  if (!duplicate.empty()) return format_error(p + ": tensor '" + duplicate + "' is named twice in the header");
  if (!h.is_object()) return format_error(p + ": safetensors header is not a JSON object");
  const uint8_t* base = mf->data() + 8 + hlen;
  const size_t data_len = mf->size() - 8 - hlen;
  const int fidx = static_cast<int>(files_.size());
  struct Span { size_t b, e; std::string name; };
  std::vector<Span> spans;
  std::vector<std::pair<std::string, TensorEntry>> added;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (it->is_null()) continue;  // mx.save_safetensors writes null when given no metadata
      if (!it->is_object()) return format_error(p + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m)
        if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
      continue;
    }
    const json& t = *it;
    auto where = p + ": tensor '" + name + "'";
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      return format_error(where + ": entry needs dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) return format_error(where + ": dtype is not a string");
    TensorEntry e;
    const std::string dt = t["dtype"].get<std::string>();
    if (!dtype_from_safetensors(dt, &e.dtype)) return unsupported(where + ": unknown dtype '" + dt + "'");
    if (!t["shape"].is_array()) return format_error(where + ": shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        return format_error(where + ": shape has a non-integer or negative dimension");
      uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40) || (v && numel > (uint64_t{1} << 42) / v))
        return format_error(where + ": shape is implausibly large");
      numel *= v;
      e.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return format_error(where + ": data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_len)
      return format_error(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                          ") out of bounds (data section is " + std::to_string(data_len) + " bytes; truncated file?)");
    const uint64_t want = numel * dtype_size(e.dtype);
    if (en - b != want)
      return format_error(where + ": " + std::to_string(en - b) + " bytes, but dtype " + dt + " x shape " +
                          shape_str(e.shape) + " needs " + std::to_string(want));
    e.data = base + b;
    e.nbytes = en - b;
    e.file_index = fidx;
    if (tensors_.count(name)) return format_error(where + ": duplicate tensor name across files");
    // An empty tensor holds no bytes and overlaps nothing (ComfyUI's `scaled_fp8` marker is one;
    // torch's writer gives it the next tensor's start offset).
    if (en > b) spans.push_back({b, en, name});
    added.emplace_back(name, std::move(e));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.b < b.b; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].b < spans[i - 1].e)
      return format_error(p + ": tensors '" + spans[i - 1].name + "' and '" + spans[i].name + "' overlap");
  for (auto& [n, e] : added) tensors_.emplace(n, std::move(e));
  files_.push_back(std::move(mf));
  file_names_.push_back(p);
  return Status::Ok();
}

Result<WeightStore> WeightStore::open(const fs::path& path) {
  WeightStore s;
  s.origin_ = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path.string() + ": no such file or folder");
  auto add_index = [&](const fs::path& index) -> Status {
    KLEIN_ASSIGN_OR_RETURN(json j, read_json_file(index));
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return format_error(index.string() + ": no \"weight_map\" object");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) return format_error(index.string() + ": weight_map['" + it.key() + "'] is not a file name");
      auto shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        return format_error(index.string() + ": shard name '" + shard + "' must be a plain file name");
      shards.insert(shard);
    }
    for (const auto& sh : shards) KLEIN_RETURN_IF_ERROR(s.add_file(index.parent_path() / sh));
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      auto e = s.tensors_.find(it.key());
      if (e == s.tensors_.end())
        return format_error(index.string() + ": lists tensor '" + it.key() + "' in " + it->get<std::string>() + ", which lacks it");
      if (fs::path(s.file_names_[e->second.file_index]).filename() != it->get<std::string>())
        return format_error(index.string() + ": tensor '" + it.key() + "' is in another shard than the index says");
    }
    return Status::Ok();
  };
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> indexes, files;
    for (const auto& de : fs::directory_iterator(path, ec)) {
      const std::string n = de.path().filename().string();
      if (n.size() > 23 && n.ends_with(".safetensors.index.json")) indexes.push_back(de.path());
      else if (n.ends_with(".safetensors")) files.push_back(de.path());
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(files.begin(), files.end());
    if (indexes.size() > 1) return format_error(path.string() + ": several *.safetensors.index.json files; expected one");
    if (indexes.size() == 1) {
      KLEIN_RETURN_IF_ERROR(add_index(indexes[0]));
    } else {
      if (files.empty()) return not_found(path.string() + ": no *.safetensors files in folder");
      for (const auto& f : files) KLEIN_RETURN_IF_ERROR(s.add_file(f));
    }
  } else if (path.string().ends_with(".json")) {
    KLEIN_RETURN_IF_ERROR(add_index(path));
  } else {
    KLEIN_RETURN_IF_ERROR(s.add_file(path));
  }
  return s;
}

const TensorEntry* WeightStore::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<Weight> WeightStore::get(const std::string& name, const Shape& expected) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found(origin_ + ": tensor '" + name + "' is missing");
  const TensorEntry& e = it->second;
  if (!expected.empty() && e.shape != expected)
    return format_error(file_names_[e.file_index] + ": tensor '" + name + "' has shape " + shape_str(e.shape) +
                        " but the config implies " + shape_str(expected));
  Weight w;
  w.name = name;
  w.dtype = e.dtype;
  w.shape = e.shape;
  w.data = e.data;
  w.nbytes = e.nbytes;
  return w;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> r;
  r.reserve(tensors_.size());
  for (const auto& [n, e] : tensors_) r.push_back(n);
  std::sort(r.begin(), r.end());
  return r;
}

const std::string& WeightStore::file_of(const std::string& name) const {
  static const std::string kNone;
  auto it = tensors_.find(name);
  return it == tensors_.end() ? kNone : file_names_[it->second.file_index];
}

void WeightStore::advise(const void* p, size_t n, Residency r) const {
  for (const auto& f : files_)
    if (f->advise(p, n, r)) return;
}

size_t WeightStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [k, e] : tensors_) n += e.nbytes;
  return n;
}

}  // namespace klein
