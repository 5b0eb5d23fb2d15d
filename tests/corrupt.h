// Helpers for the bad-input corpus (test_bad_inputs.cpp): a scratch copy of the tiny model whose
// files are symlinks until a case takes its own copy to corrupt, and edits of safetensors
// headers, JSON configs and bf16 tensor values.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "testing.h"

namespace klein::testing {

namespace fs = std::filesystem;

inline std::string slurp_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline void spit_file(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

// <dir>/model: real folders, every file a symlink into tests/data/tiny.
inline fs::path scratch_model(const fs::path& dir) {
  const fs::path src = tiny_model_dir(), dst = dir / "model";
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    const fs::path rel = fs::relative(e.path(), src);
    if (e.is_directory()) fs::create_directories(dst / rel);
    else fs::create_symlink(fs::absolute(e.path()), dst / rel);
  }
  return dst;
}

// Replaces the symlink `p` by a copy of its target (so it can be edited).
inline fs::path own(const fs::path& p) {
  if (fs::is_symlink(p)) {
    const fs::path target = fs::read_symlink(p);
    fs::remove(p);
    fs::copy_file(target, p);
  }
  return p;
}

inline void edit_json(const fs::path& p, const std::function<void(nlohmann::json&)>& fn) {
  auto j = nlohmann::json::parse(slurp_file(own(p)));
  fn(j);
  spit_file(p, j.dump(2));
}

// A safetensors file as header text + data section.
struct StFile {
  std::string header, data;
};
inline StFile st_read(const fs::path& p) {
  const std::string s = slurp_file(p);
  uint64_t n = 0;
  std::memcpy(&n, s.data(), 8);
  return {s.substr(8, n), s.substr(8 + n)};
}
inline void st_write(const fs::path& p, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  spit_file(p, out + header + data);
}
// Edits the header as JSON (data unchanged).
inline void st_edit(const fs::path& p, const std::function<void(nlohmann::json&)>& fn) {
  StFile f = st_read(own(p));
  auto h = nlohmann::json::parse(f.header);
  fn(h);
  st_write(p, h.dump(), f.data);
}
// Overwrites element `index` of tensor `tensor` (elements of sizeof(T) bytes) with `v`.
template <class T>
inline void st_poke(const fs::path& p, const std::string& tensor, int64_t index, T v) {
  StFile f = st_read(own(p));
  auto h = nlohmann::json::parse(f.header);
  const uint64_t off = h[tensor]["data_offsets"][0].get<uint64_t>() + sizeof(T) * index;
  std::memcpy(f.data.data() + off, &v, sizeof(T));
  st_write(p, f.header, f.data);
}
// Sets element `index` of a BF16 tensor to the bf16 pattern `bits` (0x7FC0: NaN).
inline void st_poke_bf16(const fs::path& p, const std::string& tensor, int64_t index, uint16_t bits) {
  st_poke(p, tensor, index, bits);
}
// Sets element `index` of an F32 tensor (a q8 `weight_scale`) to `v`.
inline void st_poke_f32(const fs::path& p, const std::string& tensor, int64_t index, float v) {
  st_poke(p, tensor, index, v);
}

// Replaces the 2-D tensor `name` ("X.weight") by an MLX quantized triple of `bits` per element in
// groups of `group` along its columns: X.weight U32 [rows, cols·bits/32], X.scales and X.biases
// BF16 [rows, cols/group] (the words arbitrary: the layout is in the shapes).
inline void st_make_mlx(const fs::path& p, const std::string& name, int64_t bits, int64_t group) {
  StFile f = st_read(own(p));
  auto h = nlohmann::json::parse(f.header);
  const int64_t rows = h[name]["shape"][0], cols = h[name]["shape"][1];
  const std::string base = name.substr(0, name.size() - 6);  // "X."
  const int64_t words = rows * cols * bits / 32, groups = rows * cols / group;
  uint64_t at = f.data.size();
  auto append = [&](const std::string& n, const char* dtype, std::vector<int64_t> shape, size_t bytes, char fill) {
    h[n] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {at, at + bytes}}};
    f.data.append(bytes, fill);
    at += bytes;
  };
  append(name, "U32", {rows, cols * bits / 32}, static_cast<size_t>(words) * 4, '\x21');
  append(base + "scales", "BF16", {rows, cols / group}, static_cast<size_t>(groups) * 2, '\x3c');
  append(base + "biases", "BF16", {rows, cols / group}, static_cast<size_t>(groups) * 2, '\0');
  st_write(p, h.dump(), f.data);
}

// A .npy file from a raw header dict text and data bytes.
inline void write_raw_npy(const fs::path& p, std::string dict, const std::string& data) {
  while ((10 + dict.size() + 1) % 64) dict += ' ';
  dict += '\n';
  std::string s = "\x93NUMPY";
  s += '\x01';
  s += '\x00';
  s += static_cast<char>(dict.size() & 0xff);
  s += static_cast<char>(dict.size() >> 8);
  spit_file(p, s + dict + data);
}

inline std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

}  // namespace klein::testing
