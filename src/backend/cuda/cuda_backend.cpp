// CudaBackend: creation, device memory, transfers and weight upload. The ops are in
// cuda_ops.cpp (element-wise, norms, RoPE, attention, data movement) and cuda_gemm.cpp (linear,
// conv2d).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/pack.h"
#include "core/checked.h"

namespace klein {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;   // cuBLASLt's: enough for its split-K kernels
constexpr int64_t kUploadChunkBytes = int64_t{64} << 20;  // host staging per weight chunk

// One stream per device for the whole process, created on first use and never destroyed:
// device tensors and weights free themselves (cudaFreeAsync) on it whenever their owners go,
// which can be after the backend that made them is gone (a model outliving its engine, static
// destructors at exit), so the stream must outlive every backend.
Result<cudaStream_t> process_stream(int device) {
  static std::mutex mu;
  static std::vector<cudaStream_t>* streams = new std::vector<cudaStream_t>();  // leaked on purpose
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(streams->size()) <= device) streams->resize(device + 1, nullptr);
  if (!(*streams)[device]) {
    cudaStream_t s = nullptr;
    KLEIN_CUDA_TRY("create", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    (*streams)[device] = s;
  }
  return (*streams)[device];
}

// Tensor::Release for device tensors: `ctx` is the stream. Errors are ignored: at process exit
// the runtime may already be unloading.
void release_device(void* p, void* stream) {
  if (p) (void)cudaFreeAsync(p, static_cast<cudaStream_t>(stream));
}

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
  return b;
}

}  // namespace

// ---- entry points (cuda_backend.h)

Result<int> cuda_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return unsupported(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e));
  }
  if (n <= 0) return unsupported("cudaGetDeviceCount: no devices");
  return n;
}

Result<CudaMemoryStats> cuda_memory_stats(int device, bool reset_peaks) {
  const std::string op = "memory statistics";
  cudaMemPool_t mp = nullptr;
  KLEIN_CUDA_TRY(op, cudaDeviceGetDefaultMemPool(&mp, device));
  CudaMemoryStats st;
  KLEIN_CUDA_TRY(op, cudaMemPoolGetAttribute(mp, cudaMemPoolAttrUsedMemHigh, &st.used_peak));
  KLEIN_CUDA_TRY(op, cudaMemPoolGetAttribute(mp, cudaMemPoolAttrReservedMemHigh, &st.reserved_peak));
  KLEIN_CUDA_TRY(op, cudaMemPoolGetAttribute(mp, cudaMemPoolAttrUsedMemCurrent, &st.used_now));
  if (reset_peaks) {
    uint64_t zero = 0;  // the only value these attributes accept: restart from the current use
    KLEIN_CUDA_TRY(op, cudaMemPoolSetAttribute(mp, cudaMemPoolAttrUsedMemHigh, &zero));
    KLEIN_CUDA_TRY(op, cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReservedMemHigh, &zero));
  }
  return st;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  return CudaBackend::create(options);
}

// ---- lifetime

CudaBackend::CudaBackend(const CudaBackendOptions& o) : opt_(o), pool_(o.host_threads) {}

Result<std::unique_ptr<Backend>> CudaBackend::create(const CudaBackendOptions& o) {
  KLEIN_ASSIGN_OR_RETURN(const int n, cuda_device_count());
  if (o.device < 0 || o.device >= n)
    return invalid_argument("cuda backend: device " + std::to_string(o.device) + " does not exist (" +
                            std::to_string(n) + " visible)");
  std::unique_ptr<CudaBackend> be(new CudaBackend(o));
  KLEIN_RETURN_IF_ERROR(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

Status CudaBackend::init() {
  const int dev = opt_.device;
  KLEIN_CUDA_TRY("create", cudaSetDevice(dev));
  cudaDeviceProp prop{};
  KLEIN_CUDA_TRY("create", cudaGetDeviceProperties(&prop, dev));
  device_name_ = prop.name;
  cc_major_ = prop.major;
  cc_minor_ = prop.minor;
  sm_count_ = prop.multiProcessorCount;
  smem_optin_ = prop.sharedMemPerBlockOptin;
  total_mem_ = prop.totalGlobalMem;
  // The kernels are compiled for CMAKE_CUDA_ARCHITECTURES; a device outside them fails here,
  // with its architecture named, rather than at the first launch.
  if (const cudaError_t e = cuda_kernels::kernels_available(); e != cudaSuccess) {
    (void)cudaGetLastError();
    return unsupported("cuda backend: " + device_name_ + " (sm_" + std::to_string(cc_major_) +
                       std::to_string(cc_minor_) + ") cannot run this build's kernels (" + cudaGetErrorString(e) +
                       "; configure with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(cc_major_) +
                       std::to_string(cc_minor_) + ")");
  }
  KLEIN_ASSIGN_OR_RETURN(stream_, process_stream(dev));
  // Freed blocks stay in the pool for the next allocation instead of going back to the driver
  // at every synchronisation; device_alloc trims the pool when an allocation fails.
  cudaMemPool_t mp = nullptr;
  KLEIN_CUDA_TRY("create", cudaDeviceGetDefaultMemPool(&mp, dev));
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  KLEIN_CUDA_TRY("create", cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));
  KLEIN_CUBLAS_TRY("create", cublasLtCreate(&lt_));
  KLEIN_ASSIGN_OR_RETURN(workspace_, device_alloc(kWorkspaceBytes, "the cuBLASLt workspace"));
  workspace_bytes_ = kWorkspaceBytes;
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  for (auto& [key, p] : plans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  for (Scratch& s : scratch_) release_device(s.p, stream_);
  release_device(workspace_, stream_);
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) (void)cudaStreamSynchronize(stream_);
}

std::string CudaBackend::describe() const {
  const bool bf16 = opt_.precision == CudaPrecision::kBf16;
  return "cuda: " + device_name_ + " (sm_" + std::to_string(cc_major_) + std::to_string(cc_minor_) + ", " +
         std::to_string(sm_count_) + " SMs, " + gib(static_cast<double>(total_mem_)) + " GiB), precision " +
         (bf16 ? "bf16" : "fp32") + "\n" +
         "  linear, conv2d: cuBLASLt " + (bf16 ? "bf16 GEMMs, float32 accumulation" : "float32 GEMMs (no TF32)") +
         "; weights " + (bf16 ? "bf16" : "f32") + " on the device (quantized ones dequantised at upload)\n" +
         "  attention: online-softmax kernel, float32, head dim <= " +
         std::to_string(cuda_kernels::kMaxAttentionHeadDim) + "\n" +
         "  norms, RoPE, element-wise, im2col: fused float32 kernels";
}

// ---- memory

Result<void*> CudaBackend::device_alloc(size_t bytes, const std::string& what) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  if (bytes > total_mem_)  // more than the device has: no need to ask the driver
    return Status(Code::kOutOfMemory, "out of memory: " + gib(static_cast<double>(bytes)) + " GiB needed for " + what);
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
  if (e == cudaErrorMemoryAllocation) {
    // Blocks cached by the pool may be what is missing: hand them back and try once more.
    (void)cudaGetLastError();
    cudaMemPool_t mp = nullptr;
    if (cudaStreamSynchronize(stream_) == cudaSuccess && cudaDeviceGetDefaultMemPool(&mp, opt_.device) == cudaSuccess)
      (void)cudaMemPoolTrimTo(mp, 0);
    e = cudaMallocAsync(&p, bytes, stream_);
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return Status(Code::kOutOfMemory, "out of memory: " + gib(static_cast<double>(bytes)) + " GiB needed for " + what);
  }
  KLEIN_CUDA_TRY("alloc " + what, e);
  return p;
}

Result<void*> CudaBackend::scratch(Slot slot, size_t bytes, const char* op) {
  Scratch& s = scratch_[slot];
  if (s.bytes >= bytes) return s.p;
  release_device(s.p, stream_);  // stream-ordered: work already queued on the old buffer finishes first
  s = Scratch{};
  const size_t grown = bytes + bytes / 4;  // some headroom against a run of slightly larger requests
  KLEIN_ASSIGN_OR_RETURN(s.p, device_alloc(grown, std::string("scratch of ") + op));
  s.bytes = grown;
  return s.p;
}

namespace {
// Elements of a shape, or an error for a negative or overflowing one (as Tensor::alloc).
Result<int64_t> element_count(const Shape& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 60) / d))
      return invalid_argument("tensor for " + what + " has an invalid shape " + shape_str(shape));
    n *= d;
  }
  return n;
}
}  // namespace

Result<Tensor> CudaBackend::alloc(const Shape& shape, const std::string& what) {
  KLEIN_ASSIGN_OR_RETURN(const int64_t n, element_count(shape, what));
  KLEIN_ASSIGN_OR_RETURN(void* p, device_alloc(static_cast<size_t>(n) * sizeof(float), what));
  Tensor t = Tensor::adopt(static_cast<float*>(p), shape, Device::kCuda, release_device, stream_);
  if (n) KLEIN_CUDA_TRY("alloc " + what, cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), stream_));
  return t;
}

Result<Tensor> CudaBackend::upload(const float* host, const Shape& shape, const std::string& what) {
  KLEIN_ASSIGN_OR_RETURN(const int64_t n, element_count(shape, what));
  KLEIN_ASSIGN_OR_RETURN(void* p, device_alloc(static_cast<size_t>(n) * sizeof(float), what));
  Tensor t = Tensor::adopt(static_cast<float*>(p), shape, Device::kCuda, release_device, stream_);
  // From pageable memory the copy returns once the data is staged, so `host` may go at once.
  if (n)
    KLEIN_CUDA_TRY("upload " + what,
                   cudaMemcpyAsync(p, host, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice, stream_));
  return t;
}

Result<Tensor> CudaBackend::download(const TensorView& x) {
  if (!x.matrix_ok() || x.dtype != DType::kF32)
    return internal_error("cuda backend: download: the view is not a float32 row-strided matrix");
  if (x.empty() && x.numel() != 0) return internal_error("cuda backend: download: the view is null");
  KLEIN_ASSIGN_OR_RETURN(Tensor t, Tensor::alloc(x.shape_vec(), "a downloaded tensor"));
  if (t.numel() == 0) return t;
  const size_t row = static_cast<size_t>(x.cols()) * sizeof(float);
  // cudaMemcpyDefault: the view may also be host memory (a dump of a host tensor's view).
  KLEIN_CUDA_TRY("download", cudaMemcpy2DAsync(t.data(), row, x.data, static_cast<size_t>(x.ld()) * sizeof(float),
                                               row, static_cast<size_t>(x.rows()), cudaMemcpyDefault, stream_));
  KLEIN_CUDA_TRY("download", cudaStreamSynchronize(stream_));
  return t;
}

Status CudaBackend::sync() {
  KLEIN_CUDA_TRY("sync", cudaStreamSynchronize(stream_));
  return Status::Ok();
}

// ---- weights

Status CudaBackend::prepare_weight(Weight& w) {
  if (w.device == Device::kCuda) return Status::Ok();  // prepared already
  if (w.empty() || w.numel() == 0) return Status::Ok();
  {
    const Status s = cuda_pack::check_packable(w);
    if (!s.ok()) return Status(s.code(), "cuda backend: prepare_weight: " + s.message());
  }
  const cuda_pack::Target t = cuda_pack::target_for(w, opt_.precision == CudaPrecision::kBf16);
  const int64_t bytes = cuda_pack::packed_bytes(w, t);
  KLEIN_ASSIGN_OR_RETURN(void* d, device_alloc(static_cast<size_t>(bytes), "weight '" + w.name + "'"));
  cudaStream_t stream = stream_;
  std::shared_ptr<const void> owner(d, [stream](const void* p) { release_device(const_cast<void*>(p), stream); });
  const std::string op = "prepare_weight " + w.name;
  if (w.dtype == cuda_pack::target_dtype(t)) {
    // Stored as computed (bf16 → bf16, f32 → f32): straight from the mapped file, bit-exact.
    KLEIN_CUDA_TRY(op, cudaMemcpyAsync(d, w.data, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
  } else {
    // Converted on the host in chunks of rows (parallel over rows), each staged and copied; a
    // pageable-memory copy returns once staged, so the buffer is reused for the next chunk.
    const int64_t rows = w.shape.empty() ? 1 : w.rows();
    const int64_t per = cuda_pack::rows_per_chunk(w, t, kUploadChunkBytes);
    const int64_t row_bytes = bytes / std::max<int64_t>(1, rows);
    std::vector<uint8_t> staging(static_cast<size_t>(std::min(rows, per) * row_bytes));
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
      const int64_t r1 = std::min(rows, r0 + per);
      KLEIN_RETURN_IF_ERROR(cuda_pack::pack_rows(w, r0, r1, t, staging.data(), &pool_));
      KLEIN_CUDA_TRY(op, cudaMemcpyAsync(static_cast<uint8_t*>(d) + r0 * row_bytes, staging.data(),
                                         static_cast<size_t>((r1 - r0) * row_bytes), cudaMemcpyHostToDevice, stream_));
    }
  }
  w.data = d;
  w.nbytes = static_cast<size_t>(bytes);
  w.dtype = cuda_pack::target_dtype(t);
  w.scales = nullptr;
  w.offsets = nullptr;
  w.scale_dtype = DType::kF32;
  w.device = Device::kCuda;
  w.owner = std::move(owner);
  return Status::Ok();
}

}  // namespace klein
