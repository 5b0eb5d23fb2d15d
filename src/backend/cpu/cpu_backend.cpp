// CPU backend: view checks, then the kernels its KernelSet selected (GEMM, attention, conv and
// the element-wise table of kernels/eltwise.h), parallelised over rows on the backend's pool.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/elementwise.h"

namespace klein {
namespace {

// Row ops split rows over the pool in chunks of at least this many floats: a wake-up of the
// pool costs microseconds, so the [1, D] modulation vectors and other small ops run inline.
constexpr int64_t kMinChunkFloats = int64_t{1} << 14;

// fn(r) for every row r < rows of a [rows, cols] op, rows split over the pool.
template <class F>
void for_rows_on(ThreadPool& pool, int64_t rows, int64_t cols, F&& fn) {
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(r);
  }, std::max<int64_t>(1, kMinChunkFloats / std::max<int64_t>(1, cols)));
}

// The first float of row r of a checked float32 matrix view.
float* row(const TensorView& v, int64_t r) { return v.f32() + r * v.ld(); }

Status bad(const std::string& op, const std::string& what) {
  return internal_error("cpu backend: " + op + ": " + what);
}

// A float32 host matrix view, or why not.
Status check_mat(const std::string& op, const char* arg, const TensorView& v) {
  if (v.empty() && v.numel() != 0) return bad(op, std::string(arg) + " is null");
  if (v.dtype != DType::kF32) return bad(op, std::string(arg) + " is not float32");
  if (v.device != Device::kCpu) return bad(op, std::string(arg) + " is not in host memory");
  if (!v.matrix_ok()) return bad(op, std::string(arg) + " is not a row-strided matrix");
  return Status::Ok();
}

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

// Runs `fn` and turns an exception from a kernel's argument check into a Status.
template <class F>
Status guarded(const char* op, F&& fn) {
  try {
    fn();
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(Code::kOutOfMemory, std::string("out of memory in ") + op);
  } catch (const std::exception& e) {
    return bad(op, e.what());
  }
}

}  // namespace

int64_t conv_out_size(int64_t in, int64_t k, int stride, int pad_a, int pad_b, bool upsample2x) {
  return kernels::conv2d_out_size(in, k, stride, pad_a, pad_b, upsample2x);
}

CpuBackend::CpuBackend(const CpuBackendOptions& o)
    : pool_(o.threads), kernels_(kernels::KernelSet::select(CpuFeatures::host(), o.max_isa, o.precision)) {}

std::string CpuBackend::describe() const {
  return "cpu, " + std::to_string(pool_.size()) + " threads, precision " +
         std::string(kernels::precision_name(kernels_.precision())) + "\n" + kernels_.describe();
}

// ---- memory

Result<Tensor> CpuBackend::alloc(const Shape& shape, const std::string& what) {
  return Tensor::alloc(shape, what);
}

Result<Tensor> CpuBackend::upload(const float* host, const Shape& shape, const std::string& what) {
  KLEIN_ASSIGN_OR_RETURN(Tensor t, Tensor::alloc(shape, what));
  if (t.numel()) std::memcpy(t.data(), host, t.numel() * sizeof(float));
  return t;
}

Result<Tensor> CpuBackend::download(const TensorView& x) {
  KLEIN_RETURN_IF_ERROR(check_mat("download", "x", x));
  KLEIN_ASSIGN_OR_RETURN(Tensor t, Tensor::alloc(x.shape_vec(), "a downloaded tensor"));
  KLEIN_RETURN_IF_ERROR(copy(x, t.view()));
  return t;
}

Status CpuBackend::prepare_weight(Weight& w) {
  if (w.device != Device::kCpu) return bad("prepare_weight", "weight '" + w.name + "' is not in host memory");
  return Status::Ok();  // the CPU kernels read every stored format directly
}

// ---- dense algebra

namespace {

// A float32 matrix of a LoRA term as a Weight the kernels read (no copy).
Weight f32_matrix(const float* p, int64_t rows, int64_t cols) {
  Weight w;
  w.name = "lora term";
  w.dtype = DType::kF32;
  w.shape = {rows, cols};
  w.data = p;
  w.nbytes = static_cast<size_t>(rows * cols) * sizeof(float);
  return w;
}

// y[:, j] += scale · ((x · downᵀ) · upᵀ)[:, j] for every term of W.lora and the rows of W it
// covers, in PEFT's order (the low-rank product first, then the scale). Rows of x go in chunks
// so that the two intermediates stay small whatever the token count.
void add_lora_terms(const kernels::KernelSet& ks, ThreadPool& pool, const TensorView& x, const Weight& W,
                    const TensorView& y) {
  const int64_t M = x.rows(), K = x.cols(), N = W.rows(), w0 = W.lora_row0;
  for (const LowRankTerm& t : W.lora->terms) {
    const int64_t a = std::max(w0, t.row0), b = std::min(w0 + N, t.row0 + t.rows);
    if (a >= b) continue;
    if (t.cols != K) throw std::invalid_argument(W.name + ": a LoRA term of " + std::to_string(t.cols) + " columns");
    const int64_t n = b - a, r = t.rank;
    const Weight up = r > 0 ? f32_matrix(t.up.data() + (a - t.row0) * r, n, r) : Weight();
    const Weight down = r > 0 ? f32_matrix(t.down.data(), r, K) : f32_matrix(t.down.data() + (a - t.row0) * K, n, K);
    const int64_t mc = std::clamp<int64_t>((int64_t{1} << 21) / std::max<int64_t>(1, r + n), 1, std::max<int64_t>(M, 1));
    // Reused between calls (a fresh 8 MiB per linear would fault its pages in every time).
    thread_local std::vector<float> buf;
    if (buf.size() < static_cast<size_t>(mc * (r + n))) buf.resize(static_cast<size_t>(mc * (r + n)));
    float* mid = buf.data();
    float* out = buf.data() + mc * r;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
      const int64_t mm = std::min(mc, M - m0);
      const float* xr = x.f32() + m0 * x.ld();
      if (r > 0) {
        kernels::run_linear(ks, xr, mm, K, down, nullptr, mid, pool, x.ld(), r);
        kernels::run_linear(ks, mid, mm, r, up, nullptr, out, pool, r, n);
      } else {
        kernels::run_linear(ks, xr, mm, K, down, nullptr, out, pool, x.ld(), n);
      }
      for_rows_on(pool, mm, n, [&](int64_t i) {
        float* yr = y.f32() + (m0 + i) * y.ld() + (a - w0);
        const float* o = out + i * n;
        for (int64_t j = 0; j < n; ++j) yr[j] += o[j] * t.scale;
      });
    }
  }
}

}  // namespace

Status CpuBackend::linear(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& y) {
  KLEIN_RETURN_IF_ERROR(check_mat("linear", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("linear", "y", y));
  if (y.rows() != x.rows() || y.cols() != W.rows())
    return bad("linear", W.name + ": y is " + shape_str(y.shape_vec()) + ", expected [" + std::to_string(x.rows()) +
                             ", " + std::to_string(W.rows()) + "]");
  return guarded("linear", [&] {
    kernels::run_linear(kernels_, x.f32(), x.rows(), x.cols(), W, bias, y.f32(), pool_, x.ld(), y.ld());
    if (W.lora) add_lora_terms(kernels_, pool_, x, W, y);
  });
}

Status CpuBackend::linear_swiglu(const TensorView& x, const Weight& W, const Weight* bias,
                                 const TensorView& u_scratch, const TensorView& out) {
  // A run-time LoRA adds to the projection before the SwiGLU: the unfused path.
  if (!kernels_.get(kernels::Op::kLinear, W.dtype).linear_swiglu || x.cols() == 0 || W.lora)
    return Backend::linear_swiglu(x, W, bias, u_scratch, out);
  KLEIN_RETURN_IF_ERROR(check_mat("linear_swiglu", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("linear_swiglu", "out", out));
  KLEIN_RETURN_IF_ERROR(check_mat("linear_swiglu", "u", u_scratch));
  if (W.rows() % 2 != 0 || out.rows() != x.rows() || out.cols() != W.rows() / 2)
    return bad("linear_swiglu", W.name + ": out is " + shape_str(out.shape_vec()) + ", expected [" +
                                    std::to_string(x.rows()) + ", " + std::to_string(W.rows() / 2) + "]");
  // u is written only where the kernel declines the case (then the linear and silu_mul run).
  if (u_scratch.rows() != x.rows() || u_scratch.cols() != W.rows())
    return bad("linear_swiglu", W.name + ": u is " + shape_str(u_scratch.shape_vec()) + ", expected [" +
                                    std::to_string(x.rows()) + ", " + std::to_string(W.rows()) + "]");
  return guarded("linear_swiglu", [&] {
    kernels::run_linear_swiglu(kernels_, x.f32(), x.rows(), x.cols(), W, bias, out.f32(), u_scratch.f32(), pool_,
                               x.ld(), out.ld(), u_scratch.ld());
  });
}

Status CpuBackend::attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             int heads, int kv_heads, float scale, const AttnMask& mask) {
  for (auto [n, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    KLEIN_RETURN_IF_ERROR(check_mat("attention", n, *t));
  if (heads <= 0 || kv_heads <= 0 || q.cols() % heads != 0) return bad("attention", "bad head count");
  const int64_t D = q.cols() / heads;
  if (k.cols() != kv_heads * D || v.cols() != kv_heads * D || out.cols() != q.cols() || out.rows() != q.rows() ||
      k.rows() != v.rows())
    return bad("attention", "q/k/v/out shapes disagree");
  return guarded("attention", [&] {
    kernels::run_attention(kernels_, q.f32(), k.f32(), v.f32(), out.f32(), q.rows(), k.rows(), heads, kv_heads,
                           static_cast<int>(D), scale, mask, pool_, q.ld(), k.ld(), v.ld(), out.ld());
  });
}

Status CpuBackend::conv2d(const TensorView& in, const Weight& w, const Weight* bias, const TensorView& out,
                          const ConvOptions& o) {
  if (in.ndim != 4 || out.ndim != 4 || !in.is_contiguous() || !out.is_contiguous() || in.dtype != DType::kF32 ||
      out.dtype != DType::kF32 || in.device != Device::kCpu || out.device != Device::kCpu)
    return bad("conv2d", w.name + ": in/out must be contiguous float32 host [N, C, H, W]");
  if (w.shape.size() != 4) return bad("conv2d", w.name + " is not 4-D");
  kernels::Conv2dParams p;
  p.stride = o.stride;
  p.pad_top = o.pad_top, p.pad_bottom = o.pad_bottom, p.pad_left = o.pad_left, p.pad_right = o.pad_right;
  p.upsample2x = o.upsample2x;
  p.in_scale = o.in_scale.empty() ? nullptr : o.in_scale.f32();
  p.in_shift = o.in_shift.empty() ? nullptr : o.in_shift.f32();
  p.in_silu = o.in_silu;
  p.accumulate = o.accumulate;
  const int64_t OH = conv_out_size(in.dim(2), w.shape[2], p.stride, p.pad_top, p.pad_bottom, p.upsample2x);
  const int64_t OW = conv_out_size(in.dim(3), w.shape[3], p.stride, p.pad_left, p.pad_right, p.upsample2x);
  if (out.dim(0) != in.dim(0) || out.dim(1) != w.shape[0] || out.dim(2) != OH || out.dim(3) != OW)
    return bad("conv2d", w.name + ": output is " + shape_str(out.shape_vec()) + ", expected [" +
                             std::to_string(in.dim(0)) + ", " + std::to_string(w.shape[0]) + ", " +
                             std::to_string(OH) + ", " + std::to_string(OW) + "]");
  return guarded("conv2d", [&] {
    kernels::run_conv2d(kernels_, in.f32(), in.dim(0), in.dim(1), in.dim(2), in.dim(3), w, bias, out.f32(), p,
                        pool_);
  });
}

// ---- normalisation

Status CpuBackend::rms_norm(const TensorView& x, const TensorView& y, const TensorView& w, float eps) {
  KLEIN_RETURN_IF_ERROR(check_mat("rms_norm", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("rms_norm", "y", y));
  KLEIN_RETURN_IF_ERROR(check_same("rms_norm", x, y));
  if (!w.empty()) KLEIN_RETURN_IF_ERROR(check_vec("rms_norm", "w", w, x.cols()));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float* wt = w.empty() ? nullptr : w.f32();
  for_rows_on(pool_, x.rows(), x.cols(), [&](int64_t r) { k.rms_norm(row(x, r), row(y, r), wt, x.cols(), eps); });
  return Status::Ok();
}

Status CpuBackend::layer_norm(const TensorView& x, const TensorView& y, const TensorView& w, const TensorView& b,
                              float eps) {
  KLEIN_RETURN_IF_ERROR(check_mat("layer_norm", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("layer_norm", "y", y));
  KLEIN_RETURN_IF_ERROR(check_same("layer_norm", x, y));
  if (!w.empty()) KLEIN_RETURN_IF_ERROR(check_vec("layer_norm", "w", w, x.cols()));
  if (!b.empty()) KLEIN_RETURN_IF_ERROR(check_vec("layer_norm", "b", b, x.cols()));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float *wt = w.empty() ? nullptr : w.f32(), *bt = b.empty() ? nullptr : b.f32();
  for_rows_on(pool_, x.rows(), x.cols(),
              [&](int64_t r) { k.layer_norm(row(x, r), row(y, r), wt, bt, x.cols(), eps); });
  return Status::Ok();
}

Status CpuBackend::modulated_layer_norm(const TensorView& x, const TensorView& y, const TensorView& onep,
                                        const TensorView& shift, float eps) {
  KLEIN_RETURN_IF_ERROR(check_mat("modulated_layer_norm", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("modulated_layer_norm", "y", y));
  KLEIN_RETURN_IF_ERROR(check_same("modulated_layer_norm", x, y));
  KLEIN_RETURN_IF_ERROR(check_vec("modulated_layer_norm", "onep", onep, x.cols()));
  KLEIN_RETURN_IF_ERROR(check_vec("modulated_layer_norm", "shift", shift, x.cols()));
  // LN(x)·onep + shift is the affine LayerNorm with w = onep, b = shift.
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float *op = onep.f32(), *sh = shift.f32();
  for_rows_on(pool_, x.rows(), x.cols(),
              [&](int64_t r) { k.layer_norm(row(x, r), row(y, r), op, sh, x.cols(), eps); });
  return Status::Ok();
}

Status CpuBackend::group_norm_affine(const TensorView& x, const Weight& gamma, const Weight& beta, int64_t groups,
                                     double eps, const TensorView& scale, const TensorView& shift) {
  if (x.ndim != 4 || x.dim(0) != 1 || !x.is_contiguous() || x.dtype != DType::kF32 || x.device != Device::kCpu)
    return bad("group_norm_affine", "x must be a contiguous float32 host [1, C, H, W]");
  const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
  if (groups <= 0 || C % groups != 0) return bad("group_norm_affine", "channels not divisible by groups");
  if (gamma.numel() != C || beta.numel() != C) return bad("group_norm_affine", gamma.name + ": wrong size");
  KLEIN_RETURN_IF_ERROR(check_vec("group_norm_affine", "scale", scale, C));
  KLEIN_RETURN_IF_ERROR(check_vec("group_norm_affine", "shift", shift, C));
  const std::vector<float> g = weight_to_vector(gamma), b = weight_to_vector(beta);
  const int64_t cpg = C / groups, n = cpg * HW;
  if (n == 0) return bad("group_norm_affine", "a group has no values");
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float* xs = x.f32();
  float *sc = scale.f32(), *sh = shift.f32();
  pool_.parallel_for(groups, [&](int64_t gb, int64_t ge) {
    for (int64_t gi = gb; gi < ge; ++gi) {
      const ops::Moments m = k.moments(xs + gi * n, n);
      ops::group_norm_affine_from_moments(m.mean, m.m2 / static_cast<double>(n), cpg, eps, g.data() + gi * cpg,
                                          b.data() + gi * cpg, sc + gi * cpg, sh + gi * cpg);
    }
  });
  return Status::Ok();
}

Status CpuBackend::group_norm_stats(const TensorView& x, int64_t groups, GroupStats& acc) {
  if (x.ndim != 4 || x.dim(0) != 1 || !x.is_contiguous() || x.dtype != DType::kF32 || x.device != Device::kCpu)
    return bad("group_norm_stats", "x must be a contiguous float32 host [1, C, H, W]");
  const int64_t C = x.dim(1), HW = x.dim(2) * x.dim(3);
  if (groups <= 0 || C % groups != 0) return bad("group_norm_stats", "channels not divisible by groups");
  if (acc.count.empty()) acc.count.assign(groups, 0.0), acc.mean.assign(groups, 0.0), acc.m2.assign(groups, 0.0);
  if (static_cast<int64_t>(acc.count.size()) != groups || acc.mean.size() != acc.count.size() ||
      acc.m2.size() != acc.count.size())
    return bad("group_norm_stats", "accumulator sized for another group count");
  const int64_t n = C / groups * HW;
  if (n == 0) return Status::Ok();
  const kernels::EltwiseFns& k = kernels_.eltwise();
  std::vector<ops::Moments> part(groups);
  pool_.parallel_for(groups, [&](int64_t gb, int64_t ge) {
    for (int64_t gi = gb; gi < ge; ++gi) part[gi] = k.moments(x.f32() + gi * n, n);
  });
  for (int64_t gi = 0; gi < groups; ++gi) {  // Chan et al.: merge (count, mean, M2) pairs
    const double na = acc.count[gi], nb = static_cast<double>(n), nt = na + nb;
    const double d = part[gi].mean - acc.mean[gi];
    acc.mean[gi] += d * nb / nt;
    acc.m2[gi] += part[gi].m2 + d * d * na * nb / nt;
    acc.count[gi] = nt;
  }
  return Status::Ok();
}

Status CpuBackend::group_norm_affine_from_stats(const GroupStats& st, const Weight& gamma, const Weight& beta,
                                                double eps, const TensorView& scale, const TensorView& shift) {
  const int64_t G = static_cast<int64_t>(st.count.size()), C = gamma.numel();
  if (G == 0 || C % G != 0 || st.mean.size() != st.count.size() || st.m2.size() != st.count.size())
    return bad("group_norm_affine_from_stats", "statistics do not match the channels");
  if (beta.numel() != C) return bad("group_norm_affine_from_stats", beta.name + ": wrong size");
  for (double c : st.count)
    if (c <= 0) return bad("group_norm_affine_from_stats", "a group has no values");
  KLEIN_RETURN_IF_ERROR(check_vec("group_norm_affine_from_stats", "scale", scale, C));
  KLEIN_RETURN_IF_ERROR(check_vec("group_norm_affine_from_stats", "shift", shift, C));
  const std::vector<float> g = weight_to_vector(gamma), b = weight_to_vector(beta);
  const int64_t cpg = C / G;
  for (int64_t gi = 0; gi < G; ++gi)
    ops::group_norm_affine_from_moments(st.mean[gi], st.m2[gi] / st.count[gi], cpg, eps, g.data() + gi * cpg,
                                        b.data() + gi * cpg, scale.f32() + gi * cpg, shift.f32() + gi * cpg);
  return Status::Ok();
}

// ---- position encodings

Status CpuBackend::rope_half(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) {
  KLEIN_RETURN_IF_ERROR(check_mat("rope_half", "x", x));
  if (heads <= 0 || x.cols() % heads != 0 || (x.cols() / heads) % 2 != 0) return bad("rope_half", "bad head dim");
  const int64_t D = x.cols() / heads, half = D / 2;
  KLEIN_RETURN_IF_ERROR(check_vec("rope_half", "cos", cos, x.rows() * half));
  KLEIN_RETURN_IF_ERROR(check_vec("rope_half", "sin", sin, x.rows() * half));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float *c = cos.f32(), *s = sin.f32();
  for_rows_on(pool_, x.rows(), x.cols(),
              [&](int64_t r) { k.rope_half(row(x, r), heads, D, c + r * half, s + r * half); });
  return Status::Ok();
}

Status CpuBackend::rope_interleaved(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) {
  KLEIN_RETURN_IF_ERROR(check_mat("rope_interleaved", "x", x));
  if (heads <= 0 || x.cols() % heads != 0 || (x.cols() / heads) % 2 != 0)
    return bad("rope_interleaved", "bad head dim");
  const int64_t D = x.cols() / heads;
  KLEIN_RETURN_IF_ERROR(check_vec("rope_interleaved", "cos", cos, x.rows() * D));
  KLEIN_RETURN_IF_ERROR(check_vec("rope_interleaved", "sin", sin, x.rows() * D));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float *c = cos.f32(), *s = sin.f32();
  for_rows_on(pool_, x.rows(), x.cols(),
              [&](int64_t r) { k.rope_interleaved(row(x, r), heads, D, c + r * D, s + r * D); });
  return Status::Ok();
}

Status CpuBackend::qk_norm_rope(const TensorView& x, int heads, const TensorView& w, float eps, const TensorView& cos,
                                const TensorView& sin) {
  KLEIN_RETURN_IF_ERROR(check_mat("qk_norm_rope", "x", x));
  if (heads <= 0 || x.cols() % heads != 0 || (x.cols() / heads) % 2 != 0) return bad("qk_norm_rope", "bad head dim");
  const int64_t D = x.cols() / heads;
  KLEIN_RETURN_IF_ERROR(check_vec("qk_norm_rope", "w", w, D));
  KLEIN_RETURN_IF_ERROR(check_vec("qk_norm_rope", "cos", cos, x.rows() * D));
  KLEIN_RETURN_IF_ERROR(check_vec("qk_norm_rope", "sin", sin, x.rows() * D));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float *wt = w.f32(), *c = cos.f32(), *s = sin.f32();
  for_rows_on(pool_, x.rows(), x.cols(),
              [&](int64_t r) { k.qk_norm_rope(row(x, r), heads, D, wt, eps, c + r * D, s + r * D); });
  return Status::Ok();
}

// ---- element-wise

Status CpuBackend::swiglu(const TensorView& gate, const TensorView& up, const TensorView& out) {
  KLEIN_RETURN_IF_ERROR(check_mat("swiglu", "gate", gate));
  KLEIN_RETURN_IF_ERROR(check_mat("swiglu", "up", up));
  KLEIN_RETURN_IF_ERROR(check_mat("swiglu", "out", out));
  KLEIN_RETURN_IF_ERROR(check_same("swiglu", gate, up));
  KLEIN_RETURN_IF_ERROR(check_same("swiglu", gate, out));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  for_rows_on(pool_, gate.rows(), gate.cols(),
              [&](int64_t r) { k.silu_mul(row(gate, r), row(up, r), row(out, r), gate.cols()); });
  return Status::Ok();
}

Status CpuBackend::gated_add(const TensorView& h, const TensorView& o, const TensorView& gate) {
  KLEIN_RETURN_IF_ERROR(check_mat("gated_add", "h", h));
  KLEIN_RETURN_IF_ERROR(check_mat("gated_add", "o", o));
  KLEIN_RETURN_IF_ERROR(check_same("gated_add", h, o));
  KLEIN_RETURN_IF_ERROR(check_vec("gated_add", "gate", gate, h.cols()));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float* g = gate.f32();
  for_rows_on(pool_, h.rows(), h.cols(), [&](int64_t r) { k.gated_add(row(h, r), row(o, r), g, h.cols()); });
  return Status::Ok();
}

Status CpuBackend::add(const TensorView& y, const TensorView& x) {
  KLEIN_RETURN_IF_ERROR(check_mat("add", "y", y));
  KLEIN_RETURN_IF_ERROR(check_mat("add", "x", x));
  KLEIN_RETURN_IF_ERROR(check_same("add", y, x));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  for_rows_on(pool_, y.rows(), y.cols(), [&](int64_t r) { k.add(row(y, r), row(x, r), y.cols()); });
  return Status::Ok();
}

Status CpuBackend::add_scalar(const TensorView& x, float c, const TensorView& y) {
  KLEIN_RETURN_IF_ERROR(check_mat("add_scalar", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("add_scalar", "y", y));
  KLEIN_RETURN_IF_ERROR(check_same("add_scalar", x, y));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  for_rows_on(pool_, x.rows(), x.cols(), [&](int64_t r) { k.add_scalar(row(x, r), c, row(y, r), x.cols()); });
  return Status::Ok();
}

Status CpuBackend::silu(const TensorView& x) {
  KLEIN_RETURN_IF_ERROR(check_mat("silu", "x", x));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  for_rows_on(pool_, x.rows(), x.cols(), [&](int64_t r) { k.silu(row(x, r), x.cols()); });
  return Status::Ok();
}

Status CpuBackend::scale_shift(const TensorView& x, const TensorView& y, const TensorView& scale,
                               const TensorView& shift, bool per_row) {
  KLEIN_RETURN_IF_ERROR(check_mat("scale_shift", "x", x));
  KLEIN_RETURN_IF_ERROR(check_mat("scale_shift", "y", y));
  KLEIN_RETURN_IF_ERROR(check_same("scale_shift", x, y));
  const int64_t n = per_row ? x.rows() : x.cols();
  KLEIN_RETURN_IF_ERROR(check_vec("scale_shift", "scale", scale, n));
  KLEIN_RETURN_IF_ERROR(check_vec("scale_shift", "shift", shift, n));
  const kernels::EltwiseFns& k = kernels_.eltwise();
  const float *sc = scale.f32(), *sh = shift.f32();
  for_rows_on(pool_, x.rows(), x.cols(), [&](int64_t r) {
    if (per_row) k.scale_shift1(row(x, r), row(y, r), sc[r], sh[r], x.cols());
    else k.scale_shift(row(x, r), row(y, r), sc, sh, x.cols());
  });
  return Status::Ok();
}

// ---- data movement

Status CpuBackend::copy(const TensorView& src, const TensorView& dst) {
  KLEIN_RETURN_IF_ERROR(check_mat("copy", "src", src));
  KLEIN_RETURN_IF_ERROR(check_mat("copy", "dst", dst));
  KLEIN_RETURN_IF_ERROR(check_same("copy", src, dst));
  const size_t row = static_cast<size_t>(src.cols()) * sizeof(float);
  if (src.ld() == src.cols() && dst.ld() == dst.cols()) {
    if (src.data != dst.data) std::memmove(dst.data, src.data, row * src.rows());
    return Status::Ok();
  }
  for (int64_t r = 0; r < src.rows(); ++r) std::memmove(dst.f32() + r * dst.ld(), src.f32() + r * src.ld(), row);
  return Status::Ok();
}

// In place, parallel over rows (the default composition would copy twice).
Status CpuBackend::pack_bf16(const TensorView& src, const TensorView& dst) {
  KLEIN_RETURN_IF_ERROR(bf16_pack::check("pack_bf16", src, dst));
  const int64_t C = dst.cols();
  pool_.parallel_for(src.rows(), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) bf16_pack::pack_row(src.f32() + r * src.ld(), dst.f32() + r * dst.ld(), C);
  });
  return Status::Ok();
}

Status CpuBackend::unpack_bf16(const TensorView& src, const TensorView& dst) {
  KLEIN_RETURN_IF_ERROR(bf16_pack::check("unpack_bf16", dst, src));
  const int64_t C = src.cols();
  pool_.parallel_for(src.rows(), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) bf16_pack::unpack_row(src.f32() + r * src.ld(), dst.f32() + r * dst.ld(), C);
  });
  return Status::Ok();
}

Status CpuBackend::transpose(const TensorView& src, const TensorView& dst, bool accumulate) {
  KLEIN_RETURN_IF_ERROR(check_mat("transpose", "src", src));
  KLEIN_RETURN_IF_ERROR(check_mat("transpose", "dst", dst));
  const int64_t R = src.rows(), C = src.cols();
  if (dst.rows() != C || dst.cols() != R) return bad("transpose", "dst shape is not src's transpose");
  constexpr int64_t kT = 32;  // tile: both sides stay in cache lines
  const float* s = src.f32();
  float* d = dst.f32();
  const int64_t lds = src.ld(), ldd = dst.ld();
  // Parallel over destination row tiles, so no two threads write the same row.
  pool_.parallel_for((C + kT - 1) / kT, [&](int64_t b, int64_t e) {
    for (int64_t cb = b * kT; cb < std::min(C, e * kT); cb += kT)
      for (int64_t r0 = 0; r0 < R; r0 += kT)
        for (int64_t c = cb; c < std::min(C, cb + kT); ++c)
          for (int64_t r = r0; r < std::min(R, r0 + kT); ++r) {
            if (accumulate) d[c * ldd + r] += s[r * lds + c];
            else d[c * ldd + r] = s[r * lds + c];
          }
  });
  return Status::Ok();
}

Status CpuBackend::gather_rows(const Weight& table, const std::vector<int32_t>& ids, const TensorView& out) {
  KLEIN_RETURN_IF_ERROR(check_mat("gather_rows", "out", out));
  if (out.rows() != static_cast<int64_t>(ids.size()) || out.cols() != table.cols())
    return bad("gather_rows", table.name + ": output shape mismatch");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows()) return bad("gather_rows", table.name + ": id out of range");
    weight_row_to_f32(table, ids[i], out.f32() + static_cast<int64_t>(i) * out.ld());
  }
  return Status::Ok();
}

Result<bool> CpuBackend::all_finite(const TensorView& x) {
  KLEIN_RETURN_IF_ERROR(check_mat("all_finite", "x", x));
  for (int64_t r = 0; r < x.rows(); ++r)
    if (!klein::all_finite(x.f32() + r * x.ld(), x.cols())) return false;
  return true;
}

}  // namespace klein
