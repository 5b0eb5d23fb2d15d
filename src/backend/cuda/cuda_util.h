// CUDA runtime and cuBLASLt results as klein Statuses: every failing call is named, with the op
// it served and the runtime's own words, e.g.
//   "cuda backend: linear: cublasLtMatmul failed: CUBLAS_STATUS_NOT_SUPPORTED (...)".
// An allocation failure is Code::kOutOfMemory; everything else Code::kInternal (the models
// validate their inputs, so a failing call here is a bug, a driver problem or a lost device).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace klein::cuda_util {

// "cudaMemcpyAsync(dst, ...)" → "cudaMemcpyAsync": the macros below pass the call's text.
inline std::string call_name(const char* call) {
  const std::string c(call);
  return c.substr(0, c.find('('));
}

inline Status cuda_status(cudaError_t e, const std::string& op, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // clears a non-sticky error so the next call starts clean
  return Status(e == cudaErrorMemoryAllocation ? Code::kOutOfMemory : Code::kInternal,
                "cuda backend: " + op + ": " + call_name(call) + " failed: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")");
}

inline Status cublas_status(cublasStatus_t st, const std::string& op, const char* call) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status(st == CUBLAS_STATUS_ALLOC_FAILED ? Code::kOutOfMemory : Code::kInternal,
                "cuda backend: " + op + ": " + call_name(call) + " failed: " + cublasLtGetStatusName(st) + " (" +
                    cublasLtGetStatusString(st) + ")");
}

// The op-argument checks every CudaBackend file shares: "cuda backend: <op>: <what>".
inline Status bad(const std::string& op, const std::string& what) {
  return internal_error("cuda backend: " + op + ": " + what);
}
// A float32 device matrix view, or why not.
inline Status check_mat(const std::string& op, const char* arg, const TensorView& v) {
  if (v.empty() && v.numel() != 0) return bad(op, std::string(arg) + " is null");
  if (v.dtype != DType::kF32) return bad(op, std::string(arg) + " is not float32");
  if (v.device != Device::kCuda) return bad(op, std::string(arg) + " is not in device memory (upload it first)");
  if (!v.matrix_ok()) return bad(op, std::string(arg) + " is not a row-strided matrix");
  return Status::Ok();
}

}  // namespace klein::cuda_util

// Returns from the enclosing function (a Status or Result) when a CUDA call fails.
#define KLEIN_CUDA_TRY(op, call) KLEIN_RETURN_IF_ERROR(::klein::cuda_util::cuda_status((call), (op), #call))
#define KLEIN_CUBLAS_TRY(op, call) KLEIN_RETURN_IF_ERROR(::klein::cuda_util::cublas_status((call), (op), #call))
// A kernel launcher's result, named by the kernel.
#define KLEIN_KERNEL_TRY(op, kernel, launch) \
  KLEIN_RETURN_IF_ERROR(::klein::cuda_util::cuda_status((launch), (op), "kernel " kernel))
