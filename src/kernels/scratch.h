// The kernels' thread-local scratch (GEMM packing, weight-row conversion, attention tiles, conv
// strips): grow-only buffers, one per pool thread and call site, that live as long as the thread.
// They are working memory a memory budget must count, so their size is tracked here (the live
// total) and bounded (what one thread may grow to for the shapes a run uses).
#pragma once

#include <cstdint>

namespace klein::kernels {

// Bytes held by all threads' scratch buffers now.
uint64_t scratch_bytes();
// Called by the buffers when they grow (+) or are freed (−).
void note_scratch_bytes(int64_t delta);

// Shapes that size the scratch of a run.
struct ScratchShape {
  int64_t max_k = 0;            // the widest reduction of a Linear (its input columns)
  int64_t max_x = 0;            // the largest input of one Linear, M · K elements
  bool converts_weights = false;  // a stored format the GEMMs expand per slab (not f32/bf16/f16)
  int64_t attn_head_dim = 0;    // 0: no attention
  int64_t conv_cin = 0;         // the widest 3×3 conv input (channels), 0: no convolutions
  int64_t conv_width = 0;       // the widest conv input row (pixels, halo included)
};
// An upper bound on one thread's scratch for `s` (every kernel's buffers at once, all ISAs).
uint64_t scratch_bytes_per_thread(const ScratchShape& s);
// An upper bound on the copies of x a Linear makes on its calling thread for `s.max_x`: bf16
// pairs, int8 values with row scales and group sums (grow-only per call site, so one of each
// kernel family may be held at once), and the bf16 GEMM's per-call copy.
uint64_t activation_copy_bytes(const ScratchShape& s);
// What a run with `threads` pool threads (the caller among them) may hold in kernel scratch:
// every thread's per-thread bound plus the calling thread's copies of x.
uint64_t scratch_bound_bytes(const ScratchShape& s, int threads);

}  // namespace klein::kernels
