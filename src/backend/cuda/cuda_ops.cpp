// CudaBackend's ops other than the GEMMs: view checks (the CPU backend's, plus "on the device"),
// then the kernels of cuda_kernels.h. Inconsistent views are Code::kInternal statuses, as on
// the CPU; a failed launch names its kernel.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.h"
#include "kernels/ref/elementwise.h"

namespace klein {

namespace ck = cuda_kernels;

namespace {

using cuda_util::bad;
using cuda_util::check_mat;

Status check_same(const std::string& op, const TensorView& a, const TensorView& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    return bad(op, "operand shapes " + shape_str(a.shape_vec()) + " and " + shape_str(b.shape_vec()) + " differ");
  return Status::Ok();
}

Status check_vec(const std::string& op, const char* arg, const TensorView& v, int64_t n) {
  KLEIN_RETURN_IF_ERROR(check_mat(op, arg, v));
  if (v.numel() != n || !v.is_contiguous())
    return bad(op, std::string(arg) + " must be a contiguous vector of " + std::to_string(n));
  return Status::Ok();
}

// A contiguous float32 [1, C, H, W] device tensor.
Status check_nchw1(const std::string& op, const TensorView& x) {
  if (x.ndim != 4 || x.dim(0) != 1 || !x.is_contiguous() || x.dtype != DType::kF32 || x.device != Device::kCuda)
    return bad(op, "x must be a contiguous float32 device [1, C, H, W]");
  return Status::Ok();
}

// A 1-D float32 weight on the device (GroupNorm's gamma/beta after prepare_weight).
Status check_vec_weight(const std::string& op, const Weight& w, int64_t n) {
  if (w.device != Device::kCuda) return bad(op, "weight '" + w.name + "' is not prepared for the CUDA backend");
  if (w.dtype != DType::kF32 || w.numel() != n)
    return bad(op, "weight '" + w.name + "' must be " + std::to_string(n) + " float32 values");
  return Status::Ok();
}

float* fp(const TensorView& v) { return v.f32(); }
const float* opt(const TensorView& v) { return v.empty() ? nullptr : v.f32(); }

}  // namespace

// ---- normalisation

Status CudaBackend::rms_norm(const TensorView& x, const TensorView& y, const TensorView& w, float eps) {
  const std::string op = "rms_norm";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_RETURN_IF_ERROR(check_same(op, x, y));
  if (!w.empty()) KLEIN_RETURN_IF_ERROR(check_vec(op, "w", w, x.cols()));
  KLEIN_KERNEL_TRY(op, "row_norm", ck::row_norm(ck::RowNorm::kRms, fp(x), x.ld(), fp(y), y.ld(), x.rows(), x.cols(),
                                                opt(w), nullptr, eps, stream_));
  return Status::Ok();
}

Status CudaBackend::layer_norm(const TensorView& x, const TensorView& y, const TensorView& w, const TensorView& b,
                               float eps) {
  const std::string op = "layer_norm";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_RETURN_IF_ERROR(check_same(op, x, y));
  if (!w.empty()) KLEIN_RETURN_IF_ERROR(check_vec(op, "w", w, x.cols()));
  if (!b.empty()) KLEIN_RETURN_IF_ERROR(check_vec(op, "b", b, x.cols()));
  KLEIN_KERNEL_TRY(op, "row_norm", ck::row_norm(ck::RowNorm::kLayer, fp(x), x.ld(), fp(y), y.ld(), x.rows(),
                                                x.cols(), opt(w), opt(b), eps, stream_));
  return Status::Ok();
}

Status CudaBackend::modulated_layer_norm(const TensorView& x, const TensorView& y, const TensorView& onep,
                                         const TensorView& shift, float eps) {
  const std::string op = "modulated_layer_norm";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_RETURN_IF_ERROR(check_same(op, x, y));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "onep", onep, x.cols()));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "shift", shift, x.cols()));
  KLEIN_KERNEL_TRY(op, "row_norm", ck::row_norm(ck::RowNorm::kModulated, fp(x), x.ld(), fp(y), y.ld(), x.rows(),
                                                x.cols(), fp(onep), fp(shift), eps, stream_));
  return Status::Ok();
}

Result<int> CudaBackend::group_partials(const TensorView& x, int64_t groups, const char* op, double** partial) {
  const int64_t n = x.numel() / groups;
  // Chunks of ~32K values per block: at the VAE's full resolution a group is millions of values
  // and 32 groups alone would leave most of the GPU idle.
  int64_t chunks = (n + 32767) / 32768;
  chunks = std::max<int64_t>(1, std::min<int64_t>(chunks, 256));
  KLEIN_ASSIGN_OR_RETURN(void* p, scratch(kSmall, static_cast<size_t>(groups * chunks * 3) * sizeof(double), op));
  *partial = static_cast<double*>(p);
  KLEIN_KERNEL_TRY(op, "group_moments",
                   ck::group_moments(fp(x), groups, n, static_cast<int>(chunks), *partial, stream_));
  return static_cast<int>(chunks);
}

Status CudaBackend::group_norm_affine(const TensorView& x, const Weight& gamma, const Weight& beta, int64_t groups,
                                      double eps, const TensorView& scale, const TensorView& shift) {
  const std::string op = "group_norm_affine";
  KLEIN_RETURN_IF_ERROR(check_nchw1(op, x));
  const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
  if (groups <= 0 || C % groups != 0) return bad(op, "channels not divisible by groups");
  if (HW == 0) return bad(op, "x has no values");
  KLEIN_RETURN_IF_ERROR(check_vec_weight(op, gamma, C));
  KLEIN_RETURN_IF_ERROR(check_vec_weight(op, beta, C));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "scale", scale, C));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "shift", shift, C));
  double* partial = nullptr;
  KLEIN_ASSIGN_OR_RETURN(const int chunks, group_partials(x, groups, op.c_str(), &partial));
  KLEIN_KERNEL_TRY(op, "group_affine",
                   ck::group_affine(partial, groups, chunks, C / groups, eps, static_cast<const float*>(gamma.data),
                                    static_cast<const float*>(beta.data), fp(scale), fp(shift), stream_));
  return Status::Ok();
}

Status CudaBackend::group_norm_stats(const TensorView& x, int64_t groups, GroupStats& acc) {
  const std::string op = "group_norm_stats";
  KLEIN_RETURN_IF_ERROR(check_nchw1(op, x));
  const int64_t C = x.dim(1);
  if (groups <= 0 || C % groups != 0) return bad(op, "channels not divisible by groups");
  if (acc.count.empty()) acc.count.assign(groups, 0.0), acc.mean.assign(groups, 0.0), acc.m2.assign(groups, 0.0);
  if (static_cast<int64_t>(acc.count.size()) != groups || acc.mean.size() != acc.count.size() ||
      acc.m2.size() != acc.count.size())
    return bad(op, "accumulator sized for another group count");
  if (x.numel() == 0) return Status::Ok();
  double* partial = nullptr;
  KLEIN_ASSIGN_OR_RETURN(const int chunks, group_partials(x, groups, op.c_str(), &partial));
  std::vector<double> h(static_cast<size_t>(groups * chunks * 3));
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(h.data(), partial, h.size() * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  KLEIN_CUDA_TRY(op, cudaStreamSynchronize(stream_));
  // Chan et al.'s merge of (count, mean, M2): the chunks into the tile, the tile into `acc`.
  auto merge = [](double& na, double& mean, double& m2, double nb, double mb, double m2b) {
    if (nb <= 0) return;
    const double nt = na + nb, d = mb - mean;
    mean += d * nb / nt;
    m2 += m2b + d * d * na * nb / nt;
    na = nt;
  };
  for (int64_t g = 0; g < groups; ++g) {
    double n = 0, mean = 0, m2 = 0;
    for (int j = 0; j < chunks; ++j) {
      const double* q = &h[static_cast<size_t>((g * chunks + j) * 3)];
      merge(n, mean, m2, q[0], q[1], q[2]);
    }
    merge(acc.count[g], acc.mean[g], acc.m2[g], n, mean, m2);
  }
  return Status::Ok();
}

Status CudaBackend::group_norm_affine_from_stats(const GroupStats& st, const Weight& gamma, const Weight& beta,
                                                 double eps, const TensorView& scale, const TensorView& shift) {
  const std::string op = "group_norm_affine_from_stats";
  const int64_t G = static_cast<int64_t>(st.count.size()), C = gamma.numel();
  if (G == 0 || C % G != 0 || st.mean.size() != st.count.size() || st.m2.size() != st.count.size())
    return bad(op, "statistics do not match the channels");
  KLEIN_RETURN_IF_ERROR(check_vec_weight(op, gamma, C));
  KLEIN_RETURN_IF_ERROR(check_vec_weight(op, beta, C));
  for (double c : st.count)
    if (c <= 0) return bad(op, "a group has no values");
  KLEIN_RETURN_IF_ERROR(check_vec(op, "scale", scale, C));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "shift", shift, C));
  // C values: computed on the host exactly as the CPU backend does, then uploaded.
  std::vector<float> g(C), b(C), sc(C), sh(C);
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(g.data(), gamma.data, C * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(b.data(), beta.data, C * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  KLEIN_CUDA_TRY(op, cudaStreamSynchronize(stream_));
  const int64_t cpg = C / G;
  for (int64_t gi = 0; gi < G; ++gi)
    ops::group_norm_affine_from_moments(st.mean[gi], st.m2[gi] / st.count[gi], cpg, eps, g.data() + gi * cpg,
                                        b.data() + gi * cpg, sc.data() + gi * cpg, sh.data() + gi * cpg);
  // Pageable sources: each copy returns once staged, so the vectors may go when this returns.
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(scale.data, sc.data(), C * sizeof(float), cudaMemcpyHostToDevice, stream_));
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(shift.data, sh.data(), C * sizeof(float), cudaMemcpyHostToDevice, stream_));
  return Status::Ok();
}

// ---- position encodings

Status CudaBackend::rope_half(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) {
  const std::string op = "rope_half";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  if (heads <= 0 || x.cols() % heads != 0 || (x.cols() / heads) % 2 != 0) return bad(op, "bad head dim");
  const int64_t D = x.cols() / heads;
  KLEIN_RETURN_IF_ERROR(check_vec(op, "cos", cos, x.rows() * (D / 2)));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "sin", sin, x.rows() * (D / 2)));
  KLEIN_KERNEL_TRY(op, "rope_half", ck::rope_half(fp(x), x.rows(), heads, D, x.ld(), fp(cos), fp(sin), stream_));
  return Status::Ok();
}

Status CudaBackend::rope_interleaved(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) {
  const std::string op = "rope_interleaved";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  if (heads <= 0 || x.cols() % heads != 0 || (x.cols() / heads) % 2 != 0) return bad(op, "bad head dim");
  const int64_t D = x.cols() / heads;
  KLEIN_RETURN_IF_ERROR(check_vec(op, "cos", cos, x.rows() * D));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "sin", sin, x.rows() * D));
  KLEIN_KERNEL_TRY(op, "rope_interleaved",
                   ck::rope_interleaved(fp(x), x.rows(), heads, D, x.ld(), fp(cos), fp(sin), stream_));
  return Status::Ok();
}

Status CudaBackend::qk_norm_rope(const TensorView& x, int heads, const TensorView& w, float eps, const TensorView& cos,
                                 const TensorView& sin) {
  const std::string op = "qk_norm_rope";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  if (heads <= 0 || x.cols() % heads != 0 || (x.cols() / heads) % 2 != 0) return bad(op, "bad head dim");
  const int64_t D = x.cols() / heads;
  KLEIN_RETURN_IF_ERROR(check_vec(op, "w", w, D));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "cos", cos, x.rows() * D));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "sin", sin, x.rows() * D));
  KLEIN_KERNEL_TRY(op, "qk_norm_rope",
                   ck::qk_norm_rope(fp(x), x.rows(), heads, D, x.ld(), fp(w), eps, fp(cos), fp(sin), stream_));
  return Status::Ok();
}

// ---- element-wise

Status CudaBackend::swiglu(const TensorView& gate, const TensorView& up, const TensorView& out) {
  const std::string op = "swiglu";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "gate", gate));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "up", up));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "out", out));
  KLEIN_RETURN_IF_ERROR(check_same(op, gate, up));
  KLEIN_RETURN_IF_ERROR(check_same(op, gate, out));
  KLEIN_KERNEL_TRY(op, "swiglu", ck::swiglu(fp(gate), gate.ld(), fp(up), up.ld(), fp(out), out.ld(), gate.rows(),
                                            gate.cols(), stream_));
  return Status::Ok();
}

Status CudaBackend::gated_add(const TensorView& h, const TensorView& o, const TensorView& gate) {
  const std::string op = "gated_add";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "h", h));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "o", o));
  KLEIN_RETURN_IF_ERROR(check_same(op, h, o));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "gate", gate, h.cols()));
  KLEIN_KERNEL_TRY(op, "gated_add",
                   ck::gated_add(fp(h), h.ld(), fp(o), o.ld(), fp(gate), h.rows(), h.cols(), stream_));
  return Status::Ok();
}

Status CudaBackend::add(const TensorView& y, const TensorView& x) {
  const std::string op = "add";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_same(op, y, x));
  KLEIN_KERNEL_TRY(op, "add", ck::add(fp(y), y.ld(), fp(x), x.ld(), y.rows(), y.cols(), stream_));
  return Status::Ok();
}

Status CudaBackend::add_scalar(const TensorView& x, float c, const TensorView& y) {
  const std::string op = "add_scalar";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_RETURN_IF_ERROR(check_same(op, x, y));
  KLEIN_KERNEL_TRY(op, "add_scalar", ck::add_scalar(fp(x), x.ld(), c, fp(y), y.ld(), x.rows(), x.cols(), stream_));
  return Status::Ok();
}

Status CudaBackend::silu(const TensorView& x) {
  KLEIN_RETURN_IF_ERROR(check_mat("silu", "x", x));
  KLEIN_KERNEL_TRY("silu", "silu", ck::silu(fp(x), x.ld(), x.rows(), x.cols(), stream_));
  return Status::Ok();
}

Status CudaBackend::scale_shift(const TensorView& x, const TensorView& y, const TensorView& scale,
                                const TensorView& shift, bool per_row) {
  const std::string op = "scale_shift";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "y", y));
  KLEIN_RETURN_IF_ERROR(check_same(op, x, y));
  const int64_t n = per_row ? x.rows() : x.cols();
  KLEIN_RETURN_IF_ERROR(check_vec(op, "scale", scale, n));
  KLEIN_RETURN_IF_ERROR(check_vec(op, "shift", shift, n));
  KLEIN_KERNEL_TRY(op, "scale_shift", ck::scale_shift(fp(x), x.ld(), fp(y), y.ld(), fp(scale), fp(shift), per_row,
                                                      x.rows(), x.cols(), stream_));
  return Status::Ok();
}

// ---- data movement

Status CudaBackend::copy(const TensorView& src, const TensorView& dst) {
  const std::string op = "copy";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "src", src));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "dst", dst));
  KLEIN_RETURN_IF_ERROR(check_same(op, src, dst));
  if (src.numel() == 0 || (src.data == dst.data && src.ld() == dst.ld())) return Status::Ok();
  const size_t row = static_cast<size_t>(src.cols()) * sizeof(float);
  KLEIN_CUDA_TRY(op, cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst.ld()) * sizeof(float), src.data,
                                       static_cast<size_t>(src.ld()) * sizeof(float), row,
                                       static_cast<size_t>(src.rows()), cudaMemcpyDeviceToDevice, stream_));
  return Status::Ok();
}

Status CudaBackend::transpose(const TensorView& src, const TensorView& dst, bool accumulate) {
  const std::string op = "transpose";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "src", src));
  KLEIN_RETURN_IF_ERROR(check_mat(op, "dst", dst));
  if (dst.rows() != src.cols() || dst.cols() != src.rows()) return bad(op, "dst shape is not src's transpose");
  KLEIN_KERNEL_TRY(op, "transpose", ck::transpose(fp(src), src.ld(), fp(dst), dst.ld(), src.rows(), src.cols(),
                                                  accumulate, stream_));
  return Status::Ok();
}

Status CudaBackend::gather_rows(const Weight& table, const std::vector<int32_t>& ids, const TensorView& out) {
  const std::string op = "gather_rows";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "out", out));
  if (out.rows() != static_cast<int64_t>(ids.size()) || out.cols() != table.cols())
    return bad(op, table.name + ": output shape mismatch");
  if (table.device != Device::kCuda) return bad(op, "weight '" + table.name + "' is not prepared for the CUDA backend");
  if (table.dtype != DType::kF32 && table.dtype != DType::kBF16)
    return bad(op, "weight '" + table.name + "' is " + std::string(dtype_name(table.dtype)) + " on the device");
  for (int32_t id : ids)
    if (id < 0 || id >= table.rows()) return bad(op, table.name + ": id out of range");
  if (ids.empty()) return Status::Ok();
  KLEIN_ASSIGN_OR_RETURN(void* d, scratch(kSmall, ids.size() * sizeof(int32_t), "gather_rows"));
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(d, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  KLEIN_KERNEL_TRY(op, "gather_rows",
                   ck::gather_rows(table.data, table.dtype == DType::kBF16, table.cols(), static_cast<int32_t*>(d),
                                   static_cast<int64_t>(ids.size()), fp(out), out.ld(), stream_));
  return Status::Ok();
}

Result<bool> CudaBackend::all_finite(const TensorView& x) {
  const std::string op = "all_finite";
  KLEIN_RETURN_IF_ERROR(check_mat(op, "x", x));
  if (x.numel() == 0) return true;
  KLEIN_ASSIGN_OR_RETURN(void* d, scratch(kSmall, sizeof(int), "all_finite"));
  const int one = 1;
  int flag = 0;
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(d, &one, sizeof one, cudaMemcpyHostToDevice, stream_));
  KLEIN_KERNEL_TRY(op, "all_finite", ck::all_finite(fp(x), x.ld(), x.rows(), x.cols(), static_cast<int*>(d), stream_));
  KLEIN_CUDA_TRY(op, cudaMemcpyAsync(&flag, d, sizeof flag, cudaMemcpyDeviceToHost, stream_));
  KLEIN_CUDA_TRY(op, cudaStreamSynchronize(stream_));
  return flag != 0;
}

}  // namespace klein
