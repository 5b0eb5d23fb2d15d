#include "core/format.h"
#include "io/npy.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/checked.h"
#include "io/atomic_file.h"

namespace klein {
namespace {

const char* descr_of(DType t) {
  switch (t) {
    case DType::kF32: return "<f4";
    case DType::kF64: return "<f8";
    case DType::kF16: return "<f2";
    case DType::kI64: return "<i8";
    case DType::kI32: return "<i4";
    case DType::kI16: return "<i2";
    case DType::kI8: return "|i1";
    case DType::kU8: return "|u1";
    case DType::kBool: return "|b1";
    default: return nullptr;
  }
}

bool dtype_of_descr(const std::string& d, DType* t) {
  static const std::pair<const char*, DType> kMap[] = {
      {"<f4", DType::kF32}, {"<f8", DType::kF64}, {"<f2", DType::kF16}, {"<i8", DType::kI64},
      {"<i4", DType::kI32}, {"<i2", DType::kI16}, {"|i1", DType::kI8},  {"|u1", DType::kU8},
      {"|b1", DType::kBool}, {"<u1", DType::kU8}, {"<i1", DType::kI8}};
  for (auto& [s, v] : kMap)
    if (d == s) {
      *t = v;
      return true;
    }
  return false;
}

// Extracts the value text after 'key': in a numpy header dict.
bool header_field(const std::string& h, const std::string& key, std::string* out) {
  auto p = h.find("'" + key + "'");
  if (p == std::string::npos) return false;
  p = h.find(':', p);
  if (p == std::string::npos) return false;
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  if (p >= h.size()) return false;
  char open = h[p];
  if (open == '\'') {
    auto e = h.find('\'', p + 1);
    if (e == std::string::npos) return false;
    *out = h.substr(p + 1, e - p - 1);
  } else if (open == '(') {
    auto e = h.find(')', p);
    if (e == std::string::npos) return false;
    *out = h.substr(p + 1, e - p - 1);
  } else {
    auto e = h.find_first_of(",}", p);
    *out = h.substr(p, e - p);
  }
  return true;
}

}  // namespace

std::vector<float> NpyArray::to_f32() const {
  const int64_t n = numel();
  std::vector<float> r(n);
  const uint8_t* p = bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: { float v; std::memcpy(&v, p + 4 * i, 4); r[i] = v; break; }
      case DType::kF64: { double v; std::memcpy(&v, p + 8 * i, 8); r[i] = static_cast<float>(v); break; }
      case DType::kF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); r[i] = f16_to_f32(v); break; }
      case DType::kI64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); r[i] = static_cast<float>(v); break; }
      case DType::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); r[i] = static_cast<float>(v); break; }
      case DType::kI16: { int16_t v; std::memcpy(&v, p + 2 * i, 2); r[i] = v; break; }
      case DType::kI8: r[i] = static_cast<int8_t>(p[i]); break;
      default: r[i] = p[i]; break;
    }
  }
  return r;
}

std::vector<int64_t> NpyArray::to_i64() const {
  const int64_t n = numel();
  std::vector<int64_t> r(n);
  const uint8_t* p = bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kI64: std::memcpy(&r[i], p + 8 * i, 8); break;
      case DType::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); r[i] = v; break; }
      case DType::kI16: { int16_t v; std::memcpy(&v, p + 2 * i, 2); r[i] = v; break; }
      case DType::kI8: r[i] = static_cast<int8_t>(p[i]); break;
      case DType::kU8: case DType::kBool: r[i] = p[i]; break;
      default: {
        // Float to int64 is undefined for NaN and out-of-range values: those saturate (NaN → 0).
        auto f = to_f32();
        for (int64_t j = 0; j < n; ++j) {
          if (!checked_trunc(f[j], &r[j]))
            r[j] = std::isnan(f[j]) ? 0 : (f[j] > 0 ? INT64_MAX : INT64_MIN);
        }
        return r;
      }
    }
  }
  return r;
}

Tensor NpyArray::to_tensor() const {
  Tensor t(shape);
  auto f = to_f32();
  if (!f.empty()) std::memcpy(t.data(), f.data(), f.size() * sizeof(float));
  return t;
}

Result<NpyArray> read_npy(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(name + ": cannot open .npy file");
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return format_error(name + ": not a .npy file (bad magic)");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint8_t b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) return format_error(name + ": truncated header");
    hlen = b[0] | (b[1] << 8);
  } else if (magic[6] == 2 || magic[6] == 3) {
    uint8_t b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) return format_error(name + ": truncated header");
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    return unsupported(name + ": .npy version " + std::to_string(magic[6]));
  }
  if (hlen > (1u << 20)) return format_error(name + ": header too large");
  std::string h(hlen, '\0');
  if (!f.read(h.data(), hlen)) return format_error(name + ": truncated header");
  std::string descr, order, shape_s;
  if (!header_field(h, "descr", &descr) || !header_field(h, "fortran_order", &order) ||
      !header_field(h, "shape", &shape_s))
    return format_error(name + ": malformed header");
  NpyArray a;
  if (!dtype_of_descr(descr, &a.dtype)) return unsupported(name + ": dtype '" + descr + "'");
  if (order.find("True") != std::string::npos) return unsupported(name + ": Fortran order");
  size_t pos = 0;
  while (pos < shape_s.size()) {
    while (pos < shape_s.size() && (shape_s[pos] == ' ' || shape_s[pos] == ',')) ++pos;
    if (pos >= shape_s.size()) break;
    // Digits by hand (std::stoll throws on 20+ digits), each dimension bounded by 2^40.
    int64_t d = 0;
    size_t e = pos;
    for (; e < shape_s.size() && std::isdigit(static_cast<unsigned char>(shape_s[e])); ++e) {
      d = d * 10 + (shape_s[e] - '0');
      if (d > (int64_t{1} << 40))
        return format_error(name + ": shape '(" + shape_s + ")' has a dimension over 2^40");
    }
    if (e == pos) return format_error(name + ": bad shape '" + shape_s + "'");
    if (a.shape.size() >= 32) return format_error(name + ": shape '(" + shape_s + ")' has over 32 dimensions");
    a.shape.push_back(d);
    pos = e;
  }
  // The size the header claims, checked for overflow and against the file before allocating.
  int64_t numel = 0, nbytes64 = 0;
  if (!checked_numel(a.shape, &numel) ||
      !checked_mul(numel, static_cast<int64_t>(dtype_size(a.dtype)), &nbytes64))
    return format_error(name + ": shape " + shape_str(a.shape) + " is too large");
  const std::streamoff data_start = f.tellg();
  f.seekg(0, std::ios::end);
  const std::streamoff file_end = f.tellg();
  f.seekg(data_start);
  if (data_start < 0 || file_end < data_start || file_end - data_start < nbytes64)
    return format_error(name + ": truncated data: shape " + shape_str(a.shape) + " needs " + std::to_string(nbytes64) +
                        " bytes, the file has " + std::to_string(file_end - data_start) + " after the header");
  const size_t nbytes = static_cast<size_t>(nbytes64);
  a.bytes.resize(nbytes);
  if (nbytes && !f.read(reinterpret_cast<char*>(a.bytes.data()), nbytes))
    return format_error(name + ": truncated data (expected " + std::to_string(nbytes) + " bytes)");
  return a;
}

Status write_npy(const std::filesystem::path& path, DType dtype, const Shape& shape,
                 const void* data) {
  const char* descr = descr_of(dtype);
  if (!descr) return unsupported(path.string() + ": cannot write dtype " + std::string(dtype_name(dtype)) + " to .npy");
  std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    h += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) h += ",";
    if (i + 1 < shape.size()) h += " ";
  }
  h += "), }";
  // Pad so that the data starts at a multiple of 64 bytes; header ends with '\n'.
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string head = "\x93NUMPY";
  head += '\x01';
  head += '\x00';
  head += static_cast<char>(h.size() & 0xff);
  head += static_cast<char>((h.size() >> 8) & 0xff);
  head += h;
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return write_file_atomic(path, [&](std::FILE* f) {
    return std::fwrite(head.data(), 1, head.size(), f) == head.size() &&
           (nbytes == 0 || std::fwrite(data, 1, nbytes, f) == nbytes);
  });
}

}  // namespace klein
