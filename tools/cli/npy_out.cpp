// .npy output for `klein encode`: the CLI only sees the public API, so it writes its own.
#include <cstdio>
#include <cstring>

#include "common.h"

namespace klein::cli {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  std::string dims = "(";
  for (size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  dims += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + dims + ", }";
  // NPY 1.0: magic + version + u16 header length; the header padded with spaces to a multiple
  // of 64 bytes (including the preamble) and ending in '\n'.
  const size_t preamble = 10;
  const size_t total = (preamble + header.size() + 1 + 63) / 64 * 64;
  header.append(total - preamble - header.size() - 1, ' ');
  header += '\n';
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return io_error(path + ": cannot open for writing");
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(len, 1, 2, f) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return io_error(path + ": write failed");
  }
  return Status::Ok();
}

}  // namespace klein::cli
