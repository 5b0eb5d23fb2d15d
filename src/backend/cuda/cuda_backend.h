// The CUDA backend's entry points, free of CUDA headers so the API layer and the tests include
// them in any -DKLEIN_CUDA=ON build. What the backend computes, and how, is in
// cuda_backend_impl.h and docs/cuda.md.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace klein {

// The GEMMs' arithmetic (linear and conv2d); everything else is float32 either way.
enum class CudaPrecision {
  kFp32,  // weights on the device as f32, cuBLASLt float32 GEMMs (CUBLAS_COMPUTE_32F, no TF32)
  kBf16,  // matrices as bf16, activations rounded to bf16 per GEMM, float32 accumulation
};

struct CudaBackendOptions {
  int device = 0;
  CudaPrecision precision = CudaPrecision::kBf16;
  int host_threads = 0;  // threads that convert weights on the host before upload (0: all cores)
  // Bound of conv2d's im2col buffer: larger convs run in chunks of output pixels (the tests set
  // it small to exercise the chunking on small images).
  size_t conv_col_bytes = size_t{256} << 20;
};

// The number of CUDA devices this process can use, or why none ("cudaGetDeviceCount: <the
// runtime's message>"; a driver or device count of zero is an error too).
Result<int> cuda_device_count();

// Bytes of the device's stream-ordered memory pool, from which the backend takes all its device
// memory (activations, weights, scratch): the peaks since the last reset and the current use.
// The CUDA context itself (a few hundred MiB) is not part of the pool.
struct CudaMemoryStats {
  uint64_t used_peak = 0, reserved_peak = 0, used_now = 0;
};
Result<CudaMemoryStats> cuda_memory_stats(int device = 0, bool reset_peaks = false);

// A CudaBackend on options.device; fails with the CUDA call that failed (no device, an
// unsupported architecture, cuBLASLt initialisation).
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options = {});

}  // namespace klein
