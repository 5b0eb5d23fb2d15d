// Block-by-block streaming of a model's weights from their mapped files (the memory budget's
// streaming mode): before block i runs, the previous block's pages are dropped from this
// process (MADV_DONTNEED; the file mapping is read-only, so they are read again when touched)
// and block i + 1 is read ahead into the page cache (MADV_WILLNEED, not this process's RSS).
// Resident weights are thus about one block. Hooked into the forwards by RunContext::on_block.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "backend/run_context.h"
#include "io/tensor_source.h"

namespace klein::api {

class BlockStreamer {
 public:
  // M: Qwen3Encoder or Flux2Transformer (num_blocks, for_each_block_weight, source).
  template <class M>
  explicit BlockStreamer(const M& m) : source_(&m.source()), blocks_(static_cast<size_t>(m.num_blocks())) {
    for (int i = 0; i < m.num_blocks(); ++i)
      m.for_each_block_weight(i, [&](const Weight& w) {
        if (!w.empty() && w.nbytes) blocks_[i].emplace_back(w.data, w.nbytes);
      });
  }
  ~BlockStreamer() { finish(); }
  BlockStreamer(const BlockStreamer&) = delete;
  BlockStreamer& operator=(const BlockStreamer&) = delete;

  // `ctx` with on_block calling enter(); the streamer must outlive the returned context's use.
  RunContext hooked(const RunContext& ctx);
  void enter(int i);
  // Drops the block that ran last (the end of a phase or a step).
  void finish();

 private:
  void advise(int i, Residency r) const;
  const TensorSource* source_;
  std::vector<std::vector<std::pair<const void*, size_t>>> blocks_;
  int current_ = -1;
};

}  // namespace klein::api
