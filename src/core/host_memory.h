// Host buffers for tensors and kernel scratch.
#pragma once

#include <cstddef>

namespace klein {

// Buffers of at least this many bytes get transparent huge pages (see host_alloc_bytes).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of uninitialised host memory, 64-byte aligned; free with std::free. nullptr when the
// allocation fails. A buffer of kHugePageBytes or more is 2 MiB aligned, its size rounded up to
// whole 2 MiB, and advised for transparent huge pages (Linux: madvise(MADV_HUGEPAGE); the default
// THP mode, "madvise", gives them only to memory that asks). Why: the kernels stream activations
// with strides of several KiB (a tile's 16 rows, an attention head's rows), so with 4 KiB pages
// nearly every row is its own TLB entry; on a KVM guest (two-level page walks) huge pages made the
// AMX GEMMs 10-24 % and the attention 8 % faster. The model's weights are file mappings, which the
// kernel already maps with 2 MiB entries where the page cache holds 2 MiB folios.
// KLEIN_HUGEPAGES=0 in the environment turns this off (every buffer then 64-byte aligned only).
void* host_alloc_bytes(size_t bytes);

}  // namespace klein
