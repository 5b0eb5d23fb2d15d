#include "io/atomic_file.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <random>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace klein {

namespace {

// 16 random characters: the seed mixes a per-process random_device draw, the time, the thread
// and a process-wide counter, so two threads (or processes) writing one target never pick the
// same name, and another user cannot predict it to plant a file or a symlink there.
std::string random_suffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t process_seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  std::seed_seq seq{process_seed, counter.fetch_add(1), static_cast<uint64_t>(getpid()),
                    static_cast<uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id())),
                    static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937_64 gen(seq);
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s(16, 'x');
  for (char& c : s) c = kChars[gen() % (sizeof kChars - 1)];
  return s;
}

// fsync of the folder holding `path`, so the rename itself survives a crash.
void sync_parent(const std::filesystem::path& path) {
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the data itself is already synced
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

Status write_file_atomic(const std::filesystem::path& path,
                         const std::function<bool(std::FILE*)>& write) {
  const std::string target = path.string();
  // Created exclusively (O_EXCL) and never through a symlink (O_NOFOLLOW), like mkstemp, with
  // the permissions a plain create would give (0666 less the umask).
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = target + ".tmp." + random_suffix();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return io_error(target + ": cannot create (" + std::strerror(errno) + ")");
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error(target + ": cannot create (" + std::strerror(e) + ")");
  }
  bool ok = false;
  try {
    ok = write(f);
  } catch (...) {  // the writer's exception must not leave the temporary file behind
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(fileno(f)) == 0) && ok;  // the data is on disk before the name points at it
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    return io_error(target + ": write failed");
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return io_error(target + ": cannot rename into place (" + std::strerror(e) + ")");
  }
  sync_parent(path);
  return Status::Ok();
}

}  // namespace klein
