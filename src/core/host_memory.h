// Host buffers for the kernels' scratch.
#pragma once

#include <cstddef>

namespace klein {

// Buffers of at least this many bytes get transparent huge pages (see host_alloc_bytes).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of uninitialised host memory, 64-byte aligned; free with std::free. nullptr when the
// allocation fails. A buffer of kHugePageBytes or more is 2 MiB aligned, its size rounded up to
// whole 2 MiB, and advised for transparent huge pages (Linux: madvise(MADV_HUGEPAGE); the default
// THP mode, "madvise", gives them only to memory that asks).
//
// For the kernels' long-lived scratch (packed activations, attention panels): the tile GEMMs
// read 16 rows several KiB apart per load, and with 4 KiB pages nearly every row is its own TLB
// entry — on a KVM guest (two-level page walks) huge-page operands made the AMX GEMMs 10-24 %
// faster. Not for tensors: they come and go within a step, and each fault of a fresh huge page
// may compact memory first (the 512² VAE decode went 3.6 → 4.6 s with a full page cache). The
// model's weights are file mappings, advised when mapped (io/safetensors.cpp).
// KLEIN_HUGEPAGES=0 in the environment turns this off (every buffer then 64-byte aligned only).
void* host_alloc_bytes(size_t bytes);

}  // namespace klein
