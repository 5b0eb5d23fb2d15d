// Recycled activation buffers for one forward pass.
//
// A Backend's alloc() hands out fresh zeroed memory; on the CPU a large tensor is a fresh mapping
// whose pages fault in (and are cleared by the kernel) on first write. A pass that allocates a
// same-sized tensor per block pays that again and again: in the VAE encoder at 256² page faults
// were 14 % of the time, in the decoder 13 %. A BufferPool keeps the buffers of the tensors it
// handed out when they are freed and gives them to the next take() that fits, so each page is
// faulted in once per pass.
//
// take() returns an owning Tensor whose contents are UNINITIALISED (a reused buffer holds what
// its last user wrote): only for outputs that an op overwrites whole (a non-accumulating conv).
// Freeing the tensor returns its buffer to the pool. Tensors may outlive the BufferPool object:
// the shared state lives until the last of them is freed, and their buffers are then released.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace klein {

class BufferPool {
 public:
  // max_fit = 0: take() reuses the smallest idle buffer that holds the tensor, however large
  // (fewest page faults; a pass whose tensors shrink keeps its large buffers resident). max_fit
  // > 1: only a buffer of at most max_fit × the tensor's size is reused, and a miss releases
  // every idle buffer, so the pool holds little beyond what its tensors in use need (for the
  // memory-bounded tiled VAE: 1024² decoded in 512-pixel tiles had 1.27 GiB peak RSS with
  // max_fit = 0 and 1.13 GiB with 1.25, against 1.09 GiB without a pool).
  explicit BufferPool(Backend& be, double max_fit = 0.0);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A tensor of `shape` on the backend's device, in the smallest idle buffer that holds it (and
  // fits max_fit), or in a new one (be.alloc; its failure, naming `what`, is returned).
  // Allocating a new buffer first releases the idle buffers smaller than it (with max_fit: all
  // idle buffers), so a pass whose tensors grow (a decoder) keeps no stale small buffers.
  Result<Tensor> take(const Shape& shape, const std::string& what);
  // pool->take(shape, what), or be.alloc(shape, what) without a pool: for code whose callers may
  // or may not give it one.
  static Result<Tensor> take_from(BufferPool* pool, Backend& be, const Shape& shape, const std::string& what);

  // Buffers held by the pool now, idle and in use, and their total floats (for tests).
  int buffers() const;
  int64_t floats() const;

  struct State;  // shared with the tensors handed out

 private:
  Backend& be_;
  double max_fit_;
  std::shared_ptr<State> state_;
};

}  // namespace klein
