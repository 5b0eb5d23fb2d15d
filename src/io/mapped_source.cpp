#include "io/mapped_source.h"

#include <cstring>

namespace klein {

namespace {

// Bytes a weight occupies in its source, scales and offsets included.
size_t stored_bytes(const Weight& w) {
  size_t n = w.nbytes;
  if (w.scales && w.format().scales == ScalePlace::kSeparate) {
    const size_t side = static_cast<size_t>(w.rows() * w.scales_per_row()) * dtype_size(w.scale_dtype);
    n += side * (w.offsets ? 2 : 1);
  }
  return n;
}

// [second half; first half] of `w`'s rows as an owned copy (scales and offsets follow their rows).
Result<Weight> swapped_halves(const Weight& w) {
  if (w.layout != Layout::kRowMajor || w.rows() % 2 != 0)
    return format_error("tensor '" + w.name + "' " + shape_str(w.shape) + ": its row halves cannot be swapped");
  const int64_t half = w.rows() / 2;
  KLEIN_ASSIGN_OR_RETURN(Weight top, w.row_range(0, half));
  KLEIN_ASSIGN_OR_RETURN(Weight bottom, w.row_range(half, w.rows()));
  const bool separate = w.format().scales == ScalePlace::kSeparate;
  const size_t side = separate ? static_cast<size_t>(half * w.scales_per_row()) * dtype_size(w.scale_dtype) : 0;
  const size_t total = 2 * top.nbytes + 2 * side * (w.offsets ? 2 : 1);
  std::shared_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[total > 0 ? total : 1]);
  if (!buf) return Status(Code::kOutOfMemory, "tensor '" + w.name + "': " + std::to_string(total) +
                                                  " bytes for its swapped halves");
  uint8_t* p = buf.get();
  // Each of data, scales and offsets becomes [bottom half | top half].
  auto put = [&p](const void* first, const void* second, size_t n) {
    uint8_t* start = p;
    if (n > 0) {
      std::memcpy(p, first, n);
      std::memcpy(p + n, second, n);
    }
    p += 2 * n;
    return static_cast<const void*>(start);
  };
  Weight out = w;
  out.data = put(bottom.data, top.data, top.nbytes);
  out.nbytes = 2 * top.nbytes;
  if (separate) {
    out.scales = put(bottom.scales, top.scales, side);
    if (w.offsets) out.offsets = put(bottom.offsets, top.offsets, side);
  }
  out.owner = std::shared_ptr<const void>(buf, buf.get());
  return out;
}

// A conv weight stored [O, H, W, I] (MLX) as torch's [O, I, H, W], an owned copy; plain element
// types only (MLX quantizes no conv).
Result<Weight> ohwi_to_oihw_copy(const Weight& w, const Shape& oihw) {
  const size_t esz = dtype_size(w.dtype);
  if (w.layout != Layout::kRowMajor || esz == 0 || w.shape.size() != 4)
    return unsupported("tensor '" + w.name + "' " + std::string(dtype_name(w.dtype)) + " " + shape_str(w.shape) +
                       ": only a plain 4-D conv weight can be permuted from [O, H, W, I]");
  const int64_t O = oihw[0], I = oihw[1], H = oihw[2], W = oihw[3];
  const size_t total = static_cast<size_t>(O * I * H * W) * esz;
  std::shared_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[total > 0 ? total : 1]);
  if (!buf) return Status(Code::kOutOfMemory, "tensor '" + w.name + "': " + std::to_string(total) +
                                                  " bytes for its [O, I, H, W] copy");
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < W; ++x)
          std::memcpy(buf.get() + static_cast<size_t>(((o * I + i) * H + h) * W + x) * esz,
                      src + static_cast<size_t>(((o * H + h) * W + x) * I + i) * esz, esz);
  Weight out = w;
  out.shape = oihw;
  out.data = buf.get();
  out.nbytes = total;
  out.owner = std::shared_ptr<const void>(buf, buf.get());
  return out;
}

}  // namespace

// --- ScopedSource ----------------------------------------------------------------------------

ScopedSource::ScopedSource(std::shared_ptr<const TensorSource> src, std::string prefix, std::vector<std::string> names,
                           size_t bytes)
    : src_(std::move(src)),
      prefix_(std::move(prefix)),
      origin_(src_->origin() + " (tensors under '" + prefix_ + "')"),
      names_(std::move(names)),
      bytes_(bytes) {}

Result<std::shared_ptr<ScopedSource>> ScopedSource::create(std::shared_ptr<const TensorSource> src,
                                                           std::string prefix) {
  std::vector<std::string> names;
  size_t bytes = 0;
  for (const std::string& n : src->names()) {
    if (!n.starts_with(prefix) || n.size() == prefix.size()) continue;
    names.push_back(n.substr(prefix.size()));
    // A tensor the source cannot resolve is reported when it is asked for; it counts nothing here.
    if (auto w = src->get(n); w.ok()) bytes += stored_bytes(*w);
  }
  if (names.empty()) return not_found(src->origin() + ": no tensor name starts with '" + prefix + "'");
  return std::make_shared<ScopedSource>(std::move(src), std::move(prefix), std::move(names), bytes);
}

bool ScopedSource::has(const std::string& name) const { return !name.empty() && src_->has(prefix_ + name); }

Result<Weight> ScopedSource::get(const std::string& name) const {
  if (!has(name)) return not_found(origin_ + ": tensor '" + name + "' is missing");
  KLEIN_ASSIGN_OR_RETURN(Weight w, src_->get(prefix_ + name));
  w.name = name;
  return w;
}

// --- MappedSource ----------------------------------------------------------------------------

MappedSource::MappedSource(std::shared_ptr<const TensorSource> src, NameMap map,
                           std::vector<std::pair<std::string, MappedName>> mapped)
    : src_(std::move(src)), map_(std::move(map)), origin_(src_->origin() + " via name map " + map_.name) {
  for (auto& [source, m] : mapped) {
    std::string target = m.target;
    targets_.emplace(std::move(target), Target{std::move(source), std::move(m)});
  }
}

Result<std::shared_ptr<MappedSource>> MappedSource::create(std::shared_ptr<const TensorSource> src, NameMap map) {
  KLEIN_ASSIGN_OR_RETURN(auto mapped, map_names(map, src->names(), src->origin()));
  return std::make_shared<MappedSource>(std::move(src), std::move(map), std::move(mapped));
}

std::vector<std::string> MappedSource::names() const {
  std::vector<std::string> r;
  r.reserve(targets_.size());
  for (const auto& [name, t] : targets_) r.push_back(name);
  return r;
}

std::string MappedSource::file_of(const std::string& name) const {
  auto it = targets_.find(name);
  if (it == targets_.end()) return origin_;
  return src_->file_of(it->second.source) + " (as '" + it->second.source + "')";
}

Result<Weight> MappedSource::get(const std::string& name) const {
  auto it = targets_.find(name);
  if (it == targets_.end()) return not_found(origin_ + ": tensor '" + name + "' is missing");
  const Target& t = it->second;
  KLEIN_ASSIGN_OR_RETURN(Weight w, src_->get(t.source));
  const std::string where = src_->file_of(t.source);
  auto shape = mapped_shape(map_, t.mapped, t.source, w.shape);
  if (!shape.ok()) return Status(shape.status().code(), where + ": " + shape.status().message());
  switch (map_.rules[t.mapped.rule].op) {
    case NameOp::kRename:
      break;
    case NameOp::kSplitRows: {
      const int64_t rows = (*shape)[0];
      KLEIN_ASSIGN_OR_RETURN(w, w.row_range(t.mapped.part * rows, (t.mapped.part + 1) * rows));
      break;
    }
    case NameOp::kSwapHalves: {
      auto s = swapped_halves(w);
      if (!s.ok()) return Status(s.status().code(), where + ": " + s.status().message());
      // The copy is what the model reads from now on: the stored bytes it was made from need not
      // stay resident beside it (a BFL final modulation is 38 MB at 4B).
      src_->advise(w.data, w.nbytes, Residency::kDontNeed);
      w = std::move(*s);
      break;
    }
    case NameOp::kOhwiToOihw: {
      auto p = ohwi_to_oihw_copy(w, *shape);
      if (!p.ok()) return Status(p.status().code(), where + ": " + p.status().message());
      src_->advise(w.data, w.nbytes, Residency::kDontNeed);  // as above: only the copy is read
      w = std::move(*p);
      break;
    }
    case NameOp::kReshape:
      // Only size-1 dimensions change (mapped_shape checked it): the bytes and the row layout
      // are the same.
      w.shape = *shape;
      break;
  }
  w.name = name;
  return w;
}

Result<std::vector<TensorInfo>> tensor_infos(const TensorSource& src) {
  std::vector<TensorInfo> out;
  for (const std::string& n : src.names()) {
    KLEIN_ASSIGN_OR_RETURN(Weight w, src.get(n));
    out.push_back({n, w.shape});
  }
  return out;
}

}  // namespace klein
