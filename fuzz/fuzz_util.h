// Shared by the libFuzzer harnesses: most parsers read files by path (they mmap them or name
// them in messages), so a harness writes the input into a scratch folder first. The folder is
// per process (fuzzer jobs may run side by side) and on /dev/shm when there is one, so the
// write costs no disk I/O per execution.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace fuzz {

class Scratch {
 public:
  explicit Scratch(const std::string& tag) {
    std::error_code ec;
    const std::filesystem::path base =
        std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
    dir_ = base / ("klein-fuzz-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  // Not removed on a crash (libFuzzer _exit()s); the pid in the name keeps reruns apart.
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::filesystem::path& dir() const { return dir_; }

  // Writes `size` bytes to dir()/name (replacing it) and returns the path.
  std::filesystem::path write(const std::string& name, const void* data, size_t size) const {
    const std::filesystem::path p = dir_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (!f) std::abort();  // the harness itself is broken, not the code under test
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
    return p;
  }

 private:
  std::filesystem::path dir_;
};

// Folds bytes into a value the optimiser cannot drop, so reads of returned buffers really
// happen (and ASan sees them).
inline void consume(const void* p, size_t n) {
  static volatile uint8_t sink;
  const auto* b = static_cast<const uint8_t*>(p);
  uint8_t x = 0;
  for (size_t i = 0; i < n; ++i) x ^= b[i];
  sink = x;
}

}  // namespace fuzz
