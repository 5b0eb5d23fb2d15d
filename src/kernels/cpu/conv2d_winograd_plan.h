// How the Winograd convs F(2×2, 3×3) split their work, shared by the bf16 ones
// (conv2d_bf16_winograd.h: AVX512_BF16, AMX) and the float32 one (conv2d_winograd_avx2.cpp):
// tiles of 2×2 output pixels in slots, blocks of whole tile rows, and output-channel ranges.
// Plain C++ (no intrinsics), so any kernel TU may include it.
//
// Include ONLY from the conv kernel files: everything has internal linkage.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/thread_pool.h"

namespace klein::kernels {
namespace {

// A block of tiles: tile rows [ty0, ty0 + bh) × tile columns [tx0, tx0 + bw), bw a multiple of
// 16; its slots are (ty − ty0)·bw + (tx − tx0).
struct WinoBlock {
  int64_t ty0, bh, tx0, bw;
};

// The block shape for NT slots at most: whole tile rows of up to NT tiles (bh > 1 only where a
// tile row is shorter). Blocks of fewer columns and more rows build fewer prologue values per
// tile ((2·bh + 2) rows of 2·bw + 16 for bh · bw tiles: 1.56 against 2.12 per input value for
// 128 channels at 256²), but measured no faster (2 threads, Zen 4): their input rows are read as
// short runs of many rows.
inline WinoBlock wino_shape(int64_t NT, int64_t TH, int64_t TWp) {
  const int64_t bw = std::min(NT, TWp);
  return {0, std::clamp<int64_t>(NT / bw, 1, TH), 0, bw};
}

// The work of a Winograd conv over TH tile rows of TWp slots (the tile columns rounded up to 16):
// blocks of whole tile rows (wino_shape) of at most max_slots slots (the caller's V budget;
// NT = the block's slots rounded up to whole `panel`-slot panels), each split into ranges of
// whole `unit`-row blocks of output channels so that the pool's threads get ~4 tasks each.
struct WinoPlan {
  WinoBlock shape;
  int64_t TH, TWp, NT, n_panel, n_bx, n_cc, cc_rows, n_tasks;
  // Task t: block k (tile rows [k.ty0, k.ty0 + k.bh) × columns [k.tx0, k.tx0 + k.bw)), output
  // channels [c0, c1) (empty: skip).
  struct Task {
    WinoBlock k;
    int64_t c0, c1;
  };
  Task task(int64_t t, int64_t Cout) const {
    const int64_t bi = t / n_cc, c0 = t % n_cc * cc_rows;
    WinoBlock k = shape;
    k.ty0 = bi / n_bx * shape.bh, k.tx0 = bi % n_bx * shape.bw;
    k.bh = std::min(shape.bh, TH - k.ty0), k.bw = std::min(shape.bw, TWp - k.tx0);
    return {k, c0, std::min(Cout, c0 + cc_rows)};
  }
};
inline WinoPlan wino_plan_for(int64_t Cout, int64_t TH, int64_t TWp, int64_t max_slots, int64_t panel, int64_t unit,
                              int threads) {
  WinoPlan d;
  d.TH = TH;
  d.TWp = TWp;
  d.shape = wino_shape(max_slots, d.TH, d.TWp);
  d.NT = (d.shape.bh * d.shape.bw + panel - 1) / panel * panel;
  d.n_panel = d.NT / panel;
  d.n_bx = (d.TWp + d.shape.bw - 1) / d.shape.bw;
  const int64_t n_blk = (d.TH + d.shape.bh - 1) / d.shape.bh * d.n_bx, n_unit = (Cout + unit - 1) / unit;
  d.n_cc = std::clamp<int64_t>((4 * static_cast<int64_t>(threads) + n_blk - 1) / n_blk, 1, n_unit);
  d.cc_rows = (n_unit + d.n_cc - 1) / d.n_cc * unit;
  d.n_tasks = n_blk * d.n_cc;
  return d;
}

// Every task of plan d for each of the N batch items (input items in_item floats apart, output
// items out_item), on the pool: per pool thread and item, init() once (the thread's scratch, tile
// configuration), whose result goes to that thread's body(g, o, task, state) calls for the tasks
// that have output channels — g the conv geometry g0 on the item's input, o its output.
template <class Geom, class Init, class Body>
void run_wino_tasks(const WinoPlan& d, const Geom& g0, const float* in, int64_t in_item, float* out, int64_t out_item,
                    int64_t N, int64_t Cout, ThreadPool& pool, const Init& init, const Body& body) {
  for (int64_t n = 0; n < N; ++n) {
    Geom g = g0;
    g.x = in + n * in_item;
    float* o = out + n * out_item;
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      auto state = init();
      for (int64_t t = next.fetch_add(1); t < d.n_tasks; t = next.fetch_add(1)) {
        const WinoPlan::Task tk = d.task(t, Cout);
        if (tk.c0 < tk.c1) body(g, o, tk, state);
      }
    });
  }
}

}  // namespace
}  // namespace klein::kernels
