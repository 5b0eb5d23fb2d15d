#include "io/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <unistd.h>

namespace klein {

Status write_file_atomic(const std::filesystem::path& path,
                         const std::function<bool(std::FILE*)>& write) {
  const std::string target = path.string();
  std::string tmp = target + ".tmp." + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return io_error(target + ": cannot create (" + std::strerror(errno) + ")");
  bool ok = write(f);
  ok = (std::fflush(f) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return io_error(target + ": write failed");
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    return io_error(target + ": cannot rename into place (" + std::strerror(e) + ")");
  }
  return Status::Ok();
}

}  // namespace klein
