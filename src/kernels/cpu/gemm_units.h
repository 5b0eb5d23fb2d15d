// ISA-neutral parts of the dot-product GEMMs (AVX-512 fp32, AVX-512 BF16, the int8 W8A8
// kernels): scratch buffers, weight rows padded to whole units, prefetch and the split of a GEMM
// over threads.
//
// All of those kernels work in 4-byte "units" along K: one float (fp32 FMA), a pair of bf16
// (vdpbf16ps multiplies pairs), four int8 (vpdpbusd sums quads) or a pair of int16 (the AVX2
// W8A8's vpmaddwd). A unit is what a 32-bit lane of a vector holds, so a packed panel is the same
// transpose for all of them: panel[q][j] = unit q of weight row j — one vector load gives a unit
// for NR/lanes columns, and the activation side broadcasts one unit of one row. Each family packs
// with its own vector transposes (pack_units_z, the AVX2 W8A8's MaddWd::pack).
//
// Plain C++ with no intrinsics: included by the SIMD translation units, each compiling it with
// its own flags, so everything here has internal linkage (anonymous namespace) — an inline
// function shared across TUs built with different -m flags could be merged into the one
// compiled for the widest ISA and then run on a CPU without it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include <unistd.h>

#include "core/host_memory.h"
#include "core/thread_pool.h"
#include "kernels/scratch.h"

namespace klein::kernels {
namespace {

// Grow-only 64-byte aligned byte buffer, one per thread and call site (thread_local).
struct UnitScratch {
  void* p = nullptr;
  size_t n = 0;
  template <class T>
  T* get(size_t count) {
    const size_t need = (count * sizeof(T) + 63) / 64 * 64;
    if (need > n) {
      std::free(p);
      p = host_alloc_bytes(need);
      note_scratch_bytes(static_cast<int64_t>(need) - static_cast<int64_t>(n));  // counted for memory budgets
      n = need;
    }
    return static_cast<T*>(p);
  }
  ~UnitScratch() {
    std::free(p);
    note_scratch_bytes(-static_cast<int64_t>(n));
  }
};

// A row stride (bytes) for rows a micro-kernel streams several of at once: at a multiple of 2 KB
// their lines map to one or two L1 sets, more rows than a set has ways, and they evict each
// other; one cache line more spreads them over the sets.
inline int64_t spread_stride(int64_t bytes) { return bytes % 2048 == 0 ? bytes + 64 : bytes; }

// n rows of K bytes (K apart) as rows of Kp ≥ K bytes (K rounded up to the kernel's whole units):
// the rows themselves when Kp == K, else a copy in `buf` zero-padded to Kp (the int8 kernels read
// whole units). Returns {rows, row stride}.
// With `spread`, rows whose stride would be a multiple of 2 KB are copied too, to spread_stride
// (see direct_block).
inline std::pair<const uint8_t*, int64_t> unit_padded_rows(const uint8_t* src, int64_t K, int64_t Kp, int64_t n,
                                                           UnitScratch& buf, bool spread = false) {
  const int64_t ld = spread ? spread_stride(Kp) : Kp;
  if (K == Kp && ld == Kp) return {src, K};
  uint8_t* c = buf.get<uint8_t>(n * ld);
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(c + j * ld, src + j * K, K);
    std::memset(c + j * ld + K, 0, Kp - K);
  }
  return {c, ld};
}

// Rows [c0, c1) as micro-kernel slivers of at most mr rows, sizes as even as possible (128 rows
// with mr = 14 → 10 slivers of 12–13, not 9 × 14 + one of 2 that wastes its panel loads).
struct Slivers {
  int64_t c0, n, base = 0, extra = 0;  // n slivers (0 for an empty range); the first `extra`
                                       // have base + 1 rows, the rest base
  Slivers(int64_t c0_, int64_t c1, int64_t mr) : c0(c0_), n(c1 > c0_ ? (c1 - c0_ + mr - 1) / mr : 0) {
    if (n) base = (c1 - c0) / n, extra = (c1 - c0) % n;
  }
  int64_t begin(int64_t i) const { return c0 + i * base + std::min(i, extra); }
  int rows(int64_t i) const { return static_cast<int>(base + (i < extra ? 1 : 0)); }
};

// Software prefetch of the next K slice of a weight slab, spread over the M loop of the current
// one: rows [0, rows) of `bytes` each, at base + j·ld, fetched into L2 a few lines per step.
// Packing reads a slab as many short row segments at a stride of K, which the hardware
// prefetchers follow poorly, and every weight is cold within a forward pass. Measured with W
// evicted before each call (2 threads, Zen 4, DiT and text-encoder shapes, median of 3 on a
// noisy shared machine): bf16 -2 %, W4A8 -3 %, W8A8 -7 % time.
// Lines are walked with a row pointer and a column counter: with a division per line (the row
// and column of line `next`) this loop held ~1/4 of the W8A8 driver's samples outside the
// micro-kernel (perf, Xeon, M = 256), a few % of the GEMM.
struct SlicePrefetch {
  const uint8_t* row = nullptr;  // the row of the next line
  int64_t ld = 0, lines_per_row = 0, total = 0, per_step = 0, next = 0, col = 0;
  SlicePrefetch(const void* base_, int64_t ld_, int64_t rows, int64_t bytes, int64_t steps)
      : row(static_cast<const uint8_t*>(base_)), ld(ld_), lines_per_row((bytes + 63) / 64),
        total(bytes > 0 ? rows * lines_per_row : 0), per_step((total + std::max<int64_t>(1, steps) - 1) / std::max<int64_t>(1, steps)) {}
  void step() {
    for (const int64_t e = std::min(total, next + per_step); next < e; ++next) {
      __builtin_prefetch(row + col * 64, 0, 2);
      if (++col == lines_per_row) col = 0, row += ld;
    }
  }
};

// f(std::integral_constant<int, n>{}) with n = nc (1 ≤ nc ≤ N): a tile's column count as the
// template argument of its instantiation (the tail of a slab has fewer columns than a tile).
template <int N, class F>
inline void with_cols(int nc, const F& f) {
  if constexpr (N <= 1) {
    f(std::integral_constant<int, 1>{});
  } else if (nc >= N) {
    f(std::integral_constant<int, N>{});
  } else {
    with_cols<N - 1>(nc, f);
  }
}

// This core's L2 in bytes as the OS reports it (cpuid through glibc); 1 MB where unknown.
inline int64_t l2_cache_bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (b > 0) return b;
#endif
  return int64_t{1} << 20;
}

// Runs block(m0, m1, n0, n1) over a partition of the [M, N] output among the pool's threads, as
// the AVX2 GEMM does: N slabs (≤ nc wide, multiples of nr) handed out dynamically, so each slab
// of W is packed by exactly one thread and a thread that gets less CPU takes fewer slabs; when
// N is too narrow for the threads, M is split instead (whole mr-row slivers).
template <class Block>
void split_gemm(int64_t M, int64_t N, int64_t mr, int64_t nr, int64_t nc, ThreadPool& pool, const Block& block) {
  const int nt = pool.size();
  const int64_t panels = (N + nr - 1) / nr;
  if (nt == 1 || (panels < nt && M < 2 * mr * nt)) {
    block(0, M, 0, N);
  } else if (panels >= 8 * nt || M < 4 * mr * nt) {
    int64_t width = std::min<int64_t>(nc, (N + 2 * nt * nr - 1) / (2 * nt * nr) * nr);
    int64_t slabs = (N + width - 1) / width;
    // Width capped at nc, a slab count that is not a multiple of the threads leaves one thread a
    // whole slab more at the end (2 threads, N = 2560, nc = 384: 7 slabs, 4 against 3); the
    // count rounded up to a multiple instead, in narrower slabs.
    if (slabs % nt) {
      const int64_t want = (slabs + nt - 1) / nt * nt;
      width = ((N + want - 1) / want + nr - 1) / nr * nr;
      slabs = (N + width - 1) / width;
    }
    std::atomic<int64_t> next{0};
    pool.run([&](int, int) {
      for (int64_t sl; (sl = next.fetch_add(1, std::memory_order_relaxed)) < slabs;)
        block(0, M, sl * width, std::min(N, (sl + 1) * width));
    });
  } else {
    const int64_t slivers = (M + mr - 1) / mr;
    pool.run([&](int t, int n) {
      const int64_t sb = slivers * t / n, se = slivers * (t + 1) / n;
      if (sb < se) block(sb * mr, std::min(M, se * mr), 0, N);
    });
  }
}

}  // namespace
}  // namespace klein::kernels
