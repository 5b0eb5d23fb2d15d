// A whole activation [1, C, H, W] (float32) kept in an unlinked temporary file instead of memory,
// written and read back by rectangular regions. The tiled VAE keeps each GroupNorm point's
// activation here when it does not fit the memory it may keep, so every statistics pass starts
// from the previous point instead of recomputing the chain from the last point kept in memory:
// the tiled pass then costs about what the whole-image pass costs, at the tiles' memory.
//
// The file lives in the page cache (reclaimable, not the process's resident set) and on disk
// only as far as the kernel writes it back; it is created with O_TMPFILE (or unlinked at once),
// so nothing is left behind even when the process is killed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace klein {

class ActivationSpill {
 public:
  // An empty spill of [1, C, H, W] in `dir` (empty: $TMPDIR or /tmp). `what` names it in errors.
  static Result<std::unique_ptr<ActivationSpill>> create(int64_t C, int64_t H, int64_t W, const std::string& dir,
                                                         const std::string& what);
  ~ActivationSpill();
  ActivationSpill(const ActivationSpill&) = delete;
  ActivationSpill& operator=(const ActivationSpill&) = delete;

  // Writes host tile [1, C, h, w] at rows [y0, y0+h), columns [x0, x0+w).
  Status write(const Tensor& tile, int64_t y0, int64_t x0);
  // Reads rows [y0, y1), columns [x0, x1) as a host tensor [1, C, y1-y0, x1-x0].
  Result<Tensor> read(int64_t y0, int64_t y1, int64_t x0, int64_t x1) const;

  int64_t channels() const { return C_; }
  uint64_t bytes() const { return static_cast<uint64_t>(C_ * H_ * W_) * sizeof(float); }

 private:
  ActivationSpill(int fd, int64_t C, int64_t H, int64_t W, std::string what)
      : fd_(fd), C_(C), H_(H), W_(W), what_(std::move(what)) {}
  int fd_;
  int64_t C_, H_, W_;
  std::string what_;
};

}  // namespace klein
