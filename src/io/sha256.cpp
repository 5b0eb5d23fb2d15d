#include "io/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

namespace klein {

namespace {

struct EvpCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using EvpCtx = std::unique_ptr<EVP_MD_CTX, EvpCtxFree>;

std::string to_hex(const unsigned char* d, unsigned n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

// Fails only when libcrypto itself does (an allocation, a provider missing): internal.
Result<EvpCtx> new_sha256_ctx() {
  EvpCtx ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return internal_error("SHA-256: libcrypto could not start a digest");
  return ctx;
}

Result<std::string> finish(EVP_MD_CTX* ctx) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (EVP_DigestFinal_ex(ctx, d, &n) != 1) return internal_error("SHA-256: libcrypto could not finish a digest");
  return to_hex(d, n);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string sha256_hex(std::string_view data) {
  auto ctx = new_sha256_ctx();
  if (!ctx.ok()) return {};
  EVP_DigestUpdate(ctx->get(), data.data(), data.size());
  auto h = finish(ctx->get());
  return h.ok() ? *h : std::string();
}

Result<FileDigest> sha256_file(const std::filesystem::path& path, const std::function<bool()>& cancel) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return io_error(path.string() + ": cannot open (" + std::strerror(errno) + ")");
  // Read once, front to back: the page cache may drop what was read.
  ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  KLEIN_ASSIGN_OR_RETURN(EvpCtx ctx, new_sha256_ctx());
  constexpr size_t kBlock = size_t{4} << 20;
  std::unique_ptr<unsigned char[]> buf(new unsigned char[kBlock]);
  FileDigest out;
  for (;;) {
    if (cancel && cancel()) return cancelled("hashing " + path.string() + " cancelled");
    const ssize_t n = ::read(f.fd, buf.get(), kBlock);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path.string() + ": read failed after " + std::to_string(out.size) + " bytes (" +
                      std::strerror(errno) + ")");
    }
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.get(), static_cast<size_t>(n)) != 1)
      return internal_error("SHA-256: libcrypto could not hash " + path.string());
    out.size += static_cast<uint64_t>(n);
  }
  KLEIN_ASSIGN_OR_RETURN(out.sha256, finish(ctx.get()));
  return out;
}

Result<std::vector<FileDigest>> sha256_files(const std::vector<std::filesystem::path>& paths, int threads,
                                             const std::function<bool()>& cancel) {
  const size_t n = paths.size();
  std::vector<std::optional<Result<FileDigest>>> results(n);
  size_t workers = threads > 0 ? static_cast<size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min(workers, n);
  // The largest first, so that one big shard is not left for the end.
  std::vector<size_t> order(n);
  std::vector<uintmax_t> sizes(n, 0);
  for (size_t i = 0; i < n; ++i) {
    order[i] = i;
    std::error_code ec;
    sizes[i] = std::filesystem::file_size(paths[i], ec);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  // A failure stops the other workers early: their results no longer matter.
  auto stop = [&] { return failed.load() || (cancel && cancel()); };
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < n;) {
      const size_t i = order[k];
      results[i] = sha256_file(paths[i], stop);
      if (!results[i]->ok()) failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  std::vector<FileDigest> out;
  out.reserve(n);
  // The first real error by position; a file stopped only because another failed says less.
  std::optional<Status> first_cancel;
  for (size_t i = 0; i < n; ++i) {
    if (!results[i]) continue;
    if (!results[i]->ok()) {
      if (results[i]->status().code() != Code::kCancelled) return results[i]->status();
      if (!first_cancel) first_cancel = results[i]->status();
      continue;
    }
    out.push_back(std::move(*results[i]).value());
  }
  if (first_cancel) return *first_cancel;
  return out;
}

}  // namespace klein
