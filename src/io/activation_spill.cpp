#include "io/activation_spill.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace klein {

namespace {

std::string spill_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

// pwrite/pread of exactly n bytes (they may transfer less, e.g. on a signal).
bool write_all(int fd, const char* p, size_t n, off_t off) {
  while (n > 0) {
    const ssize_t k = ::pwrite(fd, p, n, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= static_cast<size_t>(k), off += k;
  }
  return true;
}
bool read_all(int fd, char* p, size_t n, off_t off) {
  while (n > 0) {
    const ssize_t k = ::pread(fd, p, n, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= static_cast<size_t>(k), off += k;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<ActivationSpill>> ActivationSpill::create(int64_t C, int64_t H, int64_t W,
                                                                 const std::string& dir, const std::string& what) {
  if (C <= 0 || H <= 0 || W <= 0) return internal_error(what + ": empty spill shape");
  const std::string d = spill_dir(dir);
  int fd = ::open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    // Filesystems without O_TMPFILE: a unique name, unlinked at once.
    std::string name = d + "/klein-spill-XXXXXX";
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  if (fd < 0) return io_error(d + ": cannot create a temporary file for " + what + ": " + std::strerror(errno));
  const off_t size = static_cast<off_t>(C * H * W * static_cast<int64_t>(sizeof(float)));
  // Reserve the space now: a full disk fails here, with a clear message, not midway.
  if (const int e = ::posix_fallocate(fd, 0, size); e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    ::close(fd);
    return io_error(d + ": cannot reserve " + std::to_string(size >> 20) + " MiB for " + what + ": " + std::strerror(e));
  }
  return std::unique_ptr<ActivationSpill>(new ActivationSpill(fd, C, H, W, what));
}

ActivationSpill::~ActivationSpill() { ::close(fd_); }

Status ActivationSpill::write(const Tensor& tile, int64_t y0, int64_t x0) {
  const int64_t h = tile.dim(2), w = tile.dim(3);
  if (tile.device() != Device::kCpu || tile.dim(1) != C_ || y0 < 0 || x0 < 0 || y0 + h > H_ || x0 + w > W_)
    return internal_error(what_ + ": a spilled tile is outside the activation");
  // One row of the tile per call: rows are contiguous in the file only within a channel's row.
  for (int64_t c = 0; c < C_; ++c)
    for (int64_t y = 0; y < h; ++y) {
      const char* src = reinterpret_cast<const char*>(tile.data() + (c * h + y) * w);
      const off_t off = static_cast<off_t>(((c * H_ + y0 + y) * W_ + x0) * static_cast<int64_t>(sizeof(float)));
      if (!write_all(fd_, src, static_cast<size_t>(w) * sizeof(float), off))
        return io_error("writing " + what_ + " to its temporary file: " + std::strerror(errno));
    }
  return Status::Ok();
}

Result<Tensor> ActivationSpill::read(int64_t y0, int64_t y1, int64_t x0, int64_t x1) const {
  if (y0 < 0 || x0 < 0 || y1 > H_ || x1 > W_ || y1 <= y0 || x1 <= x0)
    return internal_error(what_ + ": a region outside the spilled activation");
  const int64_t h = y1 - y0, w = x1 - x0;
  KLEIN_ASSIGN_OR_RETURN(Tensor out, Tensor::alloc({1, C_, h, w}, what_ + " (read back)"));
  for (int64_t c = 0; c < C_; ++c)
    for (int64_t y = 0; y < h; ++y) {
      char* dst = reinterpret_cast<char*>(out.data() + (c * h + y) * w);
      const off_t off = static_cast<off_t>(((c * H_ + y0 + y) * W_ + x0) * static_cast<int64_t>(sizeof(float)));
      if (!read_all(fd_, dst, static_cast<size_t>(w) * sizeof(float), off))
        return io_error("reading " + what_ + " back from its temporary file: " + std::strerror(errno));
    }
  return out;
}

}  // namespace klein
