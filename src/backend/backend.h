// The op/backend seam: every piece of arithmetic in src/models goes through these named ops, so a
// new backend (CUDA, ...) is a new subclass and no model code changes. Ops take non-owning
// TensorViews in the matrix form of core/tensor.h (rows × cols, last dim contiguous, row stride
// ld) on the backend's device; weights are Weights in any format of core/format.h, prepared for
// this backend by prepare_weight().
//
// Contract: arguments are validated by the caller (the models check every user-controlled shape
// before calling); an op given inconsistent views is a programming error and reports it as
// Code::kInternal through the returned Status, never by throwing or aborting. Ops run
// synchronously from the caller's point of view (a GPU backend may queue work, but a later
// download() or sync() sees the results).
//
// Every op has a scalar reference in src/kernels/ref (the element-wise ones in
// ref/elementwise.h, the kScalar row of kernels/eltwise.h) that the tests compare each backend
// and ISA against.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/attn_mask.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/weight.h"

namespace klein {

// conv2d options. Besides stride and (asymmetric) zero padding, the op folds in the element-wise
// steps around every VAE conv: a per-input-channel prologue v = in_scale[c]·x + in_shift[c]
// (GroupNorm as a channel affine), optionally followed by SiLU, on in-bounds input only;
// nearest ×2 upsampling of the input before padding; accumulation into the output.
struct ConvOptions {
  int stride = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  bool upsample2x = false;
  TensorView in_scale;  // [Cin] or empty
  TensorView in_shift;  // [Cin] or empty (0)
  bool in_silu = false;
  bool accumulate = false;  // out += conv(x) + bias

  static ConvOptions same(int k) {
    ConvOptions o;
    o.pad_top = o.pad_bottom = o.pad_left = o.pad_right = k / 2;
    return o;
  }
};

// GroupNorm statistics accumulated over parts of one tensor (the tiles of a tiled VAE pass): per
// group the element count, mean and M2 = Σ(x − mean)², in double, merged with Chan et al.'s
// pairwise update, so the affine equals that of one pass over the whole tensor to rounding.
struct GroupStats {
  std::vector<double> count, mean, m2;  // [groups]
};

// Output size along one axis: (in·(up ? 2 : 1) + pad_a + pad_b − k) / stride + 1 (≤ 0: empty).
int64_t conv_out_size(int64_t in, int64_t k, int stride, int pad_a, int pad_b, bool upsample2x);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;  // "cpu", "cuda"
  virtual Device device() const = 0;
  // One line describing the chosen kernels (ISA per op and format), for `klein info` and logs.
  virtual std::string describe() const = 0;

  // ---- memory
  // A zero-filled float32 tensor on this backend's device; "out of memory: N GiB needed for
  // <what>" on failure.
  virtual Result<Tensor> alloc(const Shape& shape, const std::string& what) = 0;
  // Host data → a new device tensor (a plain copy on the CPU backend).
  virtual Result<Tensor> upload(const float* host, const Shape& shape, const std::string& what) = 0;
  // Device view → a new host tensor (contiguous).
  virtual Result<Tensor> download(const TensorView& x) = 0;
  // Waits until queued work is done (no-op on the CPU).
  virtual Status sync() { return Status::Ok(); }

  // ---- weights
  // Makes `w` ready for this backend's kernels (repack, quantize-at-load, upload), in place; the
  // result keeps its name and logical shape. The CPU backend computes from the stored formats
  // directly and leaves weights as they are.
  virtual Status prepare_weight(Weight& w) = 0;

  // ---- dense algebra
  // y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]); float32 accumulation.
  virtual Status linear(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& y) = 0;
  // out[M, F] = SiLU(g) · u where [g | u] = x · W[2F, K]ᵀ (+ bias[2F]): the DiT's feed-forward input
  // and SwiGLU. u_scratch [M, 2F] receives x · Wᵀ unless the backend fuses the two (then it is not
  // written). This default is linear then swiglu.
  virtual Status linear_swiglu(const TensorView& x, const Weight& W, const Weight* bias, const TensorView& u_scratch,
                               const TensorView& out) {
    KLEIN_RETURN_IF_ERROR(linear(x, W, bias, u_scratch));
    const int64_t F = W.rows() / 2;
    return swiglu(u_scratch.col_range(0, F), u_scratch.col_range(F, 2 * F), out);
  }
  // Multi-head SDPA without materialising the score matrix. Token-major layouts:
  // q [Sq, Hq·D], k/v [Sk, Hkv·D], out [Sq, Hq·D]. GQA: query head h reads kv head h / (Hq/Hkv).
  // A query with no visible key gives zeros.
  virtual Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                           int heads, int kv_heads, float scale, const AttnMask& mask) = 0;
  // in [1, Cin, H, W] contiguous, w [Cout, Cin, kh, kw], bias [Cout] or null, out
  // [1, Cout, OH, OW] (sizes from conv_out_size), out not overlapping in.
  virtual Status conv2d(const TensorView& in, const Weight& w, const Weight* bias, const TensorView& out,
                        const ConvOptions& o) = 0;

  // ---- normalisation (statistics accumulate in double: 1e-6-level parity with torch fp32)
  // y = x · rsqrt(mean(x²) + eps) · w per row; w [cols] or empty. x may alias y.
  virtual Status rms_norm(const TensorView& x, const TensorView& y, const TensorView& w, float eps) = 0;
  // LayerNorm per row (biased variance), optional affine w/b [cols] (empty = none).
  virtual Status layer_norm(const TensorView& x, const TensorView& y, const TensorView& w, const TensorView& b,
                            float eps) = 0;
  // y = LN(x) · onep + shift per row (no affine); onep = 1 + scale, precomputed as diffusers does.
  virtual Status modulated_layer_norm(const TensorView& x, const TensorView& y, const TensorView& onep,
                                      const TensorView& shift, float eps) = 0;
  // GroupNorm of x [1, C, H, W] as the per-channel affine it is: scale[c] = gamma[c]·rstd_g,
  // shift[c] = beta[c] − mean_g·scale[c] (torch's CPU kernel applies it this way). scale/shift [C].
  virtual Status group_norm_affine(const TensorView& x, const Weight& gamma, const Weight& beta, int64_t groups,
                                   double eps, const TensorView& scale, const TensorView& shift) = 0;

  // Adds the values of x [1, C, h, w] (contiguous; a tile) to `acc`, per group of C/groups
  // channels; an empty `acc` is sized to `groups`.
  virtual Status group_norm_stats(const TensorView& x, int64_t groups, GroupStats& acc) = 0;
  // group_norm_affine's scale/shift [C] from statistics accumulated by group_norm_stats.
  virtual Status group_norm_affine_from_stats(const GroupStats& stats, const Weight& gamma, const Weight& beta,
                                              double eps, const TensorView& scale, const TensorView& shift) = 0;

  // ---- position encodings
  // Qwen's half-split RoPE in place on x [L, heads·D]: (a, b) = (x[d], x[d + D/2]) →
  // (a·c − b·s, b·c + a·s); cos/sin [L, D/2].
  virtual Status rope_half(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) = 0;
  // FLUX's interleaved RoPE in place on x [S, heads·D]: pairs (2j, 2j+1); cos/sin [S, D] with
  // each angle repeated for the pair.
  virtual Status rope_interleaved(const TensorView& x, int heads, const TensorView& cos, const TensorView& sin) = 0;
  // Per row and head: RMSNorm over D (weight w [D]) then interleaved RoPE, in place — the
  // DiT's q/k preparation fused in one pass.
  virtual Status qk_norm_rope(const TensorView& x, int heads, const TensorView& w, float eps, const TensorView& cos,
                              const TensorView& sin) = 0;

  // ---- element-wise
  // out = SiLU(gate) · up (shapes equal; out may alias gate).
  virtual Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& out) = 0;
  // h += gate · o per row; gate [cols].
  virtual Status gated_add(const TensorView& h, const TensorView& o, const TensorView& gate) = 0;
  // y += x.
  virtual Status add(const TensorView& y, const TensorView& x) = 0;
  // y = x + c (y may alias x).
  virtual Status add_scalar(const TensorView& x, float c, const TensorView& y) = 0;
  // x = SiLU(x) in place.
  virtual Status silu(const TensorView& x) = 0;
  // y[r, c] = x[r, c] · scale[c] + shift[c] (per column; `per_row`: scale[r], shift[r]).
  virtual Status scale_shift(const TensorView& x, const TensorView& y, const TensorView& scale,
                             const TensorView& shift, bool per_row) = 0;

  // ---- data movement
  // dst = src (same matrix shape, any strides).
  virtual Status copy(const TensorView& src, const TensorView& dst) = 0;
  // dst[c, r] = src[r, c] (dst += with accumulate).
  virtual Status transpose(const TensorView& src, const TensorView& dst, bool accumulate = false) = 0;
  // out[i, :] = row ids[i] of the table (an embedding lookup); ids are host values.
  virtual Status gather_rows(const Weight& table, const std::vector<int32_t>& ids, const TensorView& out) = 0;
  // True if every element of x is finite.
  virtual Result<bool> all_finite(const TensorView& x) = 0;

  // ---- compact storage (a default composition through the host; backends may do it in place)
  // dst [R, C] holds src [R, 2C] rounded to bf16 (round to nearest even), two values per float
  // slot: what a cache kept for later calls (the KV variant's reference keys and values) needs of
  // memory, half of float32's.
  virtual Status pack_bf16(const TensorView& src, const TensorView& dst);
  // dst [R, 2C] = the bf16 values of a pack_bf16 result src [R, C], as float32.
  virtual Status unpack_bf16(const TensorView& src, const TensorView& dst);
};

// The row conversions behind pack_bf16 / unpack_bf16 (src row of 2C floats <-> C packed slots),
// shared by the backends that do them in host memory.
namespace bf16_pack {
void pack_row(const float* src, float* dst, int64_t C);
void unpack_row(const float* src, float* dst, int64_t C);
Status check(const char* op, const TensorView& wide, const TensorView& packed);
}  // namespace bf16_pack

}  // namespace klein
