// The kernel table and KernelSet selection. Rows are generated from the format table: every
// format the kernels can compute with (is_weight) gets a scalar linear and conv2d (they expand
// rows through weight_row_to_f32), and on x86 builds an AVX2 one (the GEMM streams f32/f16/bf16
// panels and expands the other formats row-wise the same way) and an AVX-512F float32 GEMM.
// The element-wise table (Op::kElementwise, F32) has a scalar, an AVX2 and an AVX-512 row.
// Fast rows (Precision::kFast only): W8A8 for Q8_ROW (scalar reference, AVX2, AVX-VNNI,
// AVX512_VNNI), W4A8 for Q4_G64 (scalar reference, AVX2, AVX-VNNI, AVX512_VNNI), llama.cpp's
// per-block int8 dot products for the ggml block formats (scalar reference, AVX2, AVX512_VNNI:
// kernels/ggml_dot.h) and the AVX512_BF16 GEMM for every other weight format; the float32 Winograd conv2d (AVX2, AVX-512F) and the
// AVX512_BF16 one for every format, and the AVX512_BF16 attention.
#include "kernels/registry.h"

#include <stdexcept>
#include <vector>

#include "core/format.h"
#include "kernels/cpu/scalar_kernels.h"
#include "kernels/ggml_dot.h"

#if defined(KLEIN_X86)
#include "kernels/cpu/avx2_kernels.h"
#include "kernels/cpu/conv2d_kernels.h"
#include "kernels/cpu/gemm_kernels.h"
#endif

namespace klein::kernels {
namespace {

// The ggml block formats with a fast integer linear (kernels/ggml_dot.h).
bool is_ggml_int(DType t) {
  ggml_dot::Form f;
  return ggml_dot::form_of(t, &f);
}

std::vector<KernelEntry> build_table() {
  std::vector<KernelEntry> t;
  auto add_isa = [&](Isa isa, std::string_view lin, LinearFn lf, std::string_view att, AttentionFn af,
                     std::string_view conv, Conv2dFn cf) {
    t.push_back({.op = Op::kAttention, .format = DType::kF32, .isa = isa, .name = att, .attention = af});
    for (const FormatTraits& f : format_table()) {
      if (!f.is_weight) continue;
      t.push_back({.op = Op::kLinear, .format = f.id, .isa = isa, .name = lin, .linear = lf});
      t.push_back({.op = Op::kConv2d, .format = f.id, .isa = isa, .name = conv, .conv2d = cf});
    }
  };
  add_isa(Isa::kScalar, "linear_ref", scalar::linear, "attention_ref", scalar::attention, "conv2d_blocked",
          blocked::conv2d);
#if defined(KLEIN_X86)
  add_isa(Isa::kAvx2, "gemm_avx2", avx2::linear, "flash_attention_avx2", avx2::attention, "conv2d_avx2",
          avx2::conv2d);
#endif
  auto add_eltwise = [&](Isa isa, std::string_view name, const EltwiseFns& fns) {
    t.push_back({.op = Op::kElementwise, .format = DType::kF32, .isa = isa, .name = name, .eltwise = &fns});
  };
  add_eltwise(Isa::kScalar, "eltwise_ref", scalar::eltwise());
#if defined(KLEIN_X86)
  add_eltwise(Isa::kAvx2, "eltwise_avx2", avx2::eltwise());
  add_eltwise(Isa::kAvx512, "eltwise_avx512", avx512::eltwise());
#endif
  auto add_linear = [&](Isa isa, DType f, std::string_view name, LinearFn fn, bool fast) {
    t.push_back({.op = Op::kLinear, .format = f, .isa = isa, .name = name, .fast = fast, .linear = fn});
  };
  add_linear(Isa::kScalar, DType::kQ8Row, "linear_w8a8_ref", scalar::linear_w8a8, true);
  add_linear(Isa::kScalar, DType::kQ4G64, "linear_w4a8_ref", scalar::linear_w4a8, true);
  // ggml block formats (GGUF): integer dot products on llama.cpp's per-block int8 activations.
  for (const FormatTraits& f : format_table())
    if (is_ggml_int(f.id)) add_linear(Isa::kScalar, f.id, "linear_ggml_ref", scalar::linear_ggml, true);
#if defined(KLEIN_X86)
  for (const FormatTraits& f : format_table()) {
    if (!f.is_weight) continue;
    add_linear(Isa::kAvx512, f.id, "gemm_avx512", avx512::linear, false);
    // Q8_ROW, Q4_G64 and the ggml blocks have integer kernels (below): vpdpbusd does twice
    // vdpbf16ps's work.
    if (f.id != DType::kQ8Row && f.id != DType::kQ4G64 && !is_ggml_int(f.id)) {
      add_linear(Isa::kAvx512Bf16, f.id, "gemm_bf16_avx512bf16", avx512bf16::linear, true);
      if (f.id == DType::kBF16) t.back().linear_swiglu = avx512bf16::linear_swiglu;  // the direct driver's
    }
  }
  t.push_back({.op = Op::kAttention, .format = DType::kF32, .isa = Isa::kAvx512Bf16,
               .name = "flash_attention_bf16_avx512bf16", .fast = true, .attention = avx512bf16::attention});
  // The VAE's convs: float32 (exact), the float32 Winograd form under kFast (on AVX2, and on
  // AVX-512F with its exact conv for the other shapes), and bf16 pairs under kFast, for every
  // weight format.
  for (const FormatTraits& f : format_table()) {
    if (!f.is_weight) continue;
    t.push_back({.op = Op::kConv2d, .format = f.id, .isa = Isa::kAvx2, .name = "conv2d_winograd_avx2",
                 .fast = true, .conv2d = avx2::conv2d_fast});
    t.push_back({.op = Op::kConv2d, .format = f.id, .isa = Isa::kAvx512, .name = "conv2d_avx512",
                 .conv2d = avx512::conv2d});
    t.push_back({.op = Op::kConv2d, .format = f.id, .isa = Isa::kAvx512, .name = "conv2d_winograd_avx512",
                 .fast = true, .conv2d = avx512::conv2d_fast});
    t.push_back({.op = Op::kConv2d, .format = f.id, .isa = Isa::kAvx512Bf16, .name = "conv2d_bf16_avx512bf16",
                 .fast = true, .conv2d = avx512bf16::conv2d});
  }
  add_linear(Isa::kAvx2, DType::kQ8Row, "gemm_int8_avx2", avx2::linear_q8, true);
  add_linear(Isa::kAvx2, DType::kQ4G64, "gemm_w4a8_avx2", avx2::linear_q4, true);
  add_linear(Isa::kAvxVnni, DType::kQ8Row, "gemm_int8_avxvnni", avxvnni::linear_q8, true);
  t.back().linear_swiglu = avxvnni::linear_q8_swiglu;
  add_linear(Isa::kAvxVnni, DType::kQ4G64, "gemm_w4a8_avxvnni", avxvnni::linear_q4, true);
  t.back().linear_swiglu = avxvnni::linear_q4_swiglu;
  add_linear(Isa::kAvx512Vnni, DType::kQ8Row, "gemm_int8_avx512vnni", avx512vnni::linear_q8, true);
  t.back().linear_swiglu = avx512vnni::linear_q8_swiglu;
  add_linear(Isa::kAvx512Vnni, DType::kQ4G64, "gemm_w4a8_avx512vnni", avx512vnni::linear_q4, true);
  t.back().linear_swiglu = avx512vnni::linear_q4_swiglu;
  // AMX: int8 tiles for Q8_ROW and Q4_G64, bf16 tiles for the float formats, for attention and
  // for the VAE's convs.
  add_linear(Isa::kAmx, DType::kQ8Row, "gemm_int8_amx", amx::linear_q8, true);
  t.back().linear_swiglu = amx::linear_q8_swiglu;
  add_linear(Isa::kAmx, DType::kQ4G64, "gemm_w4a8_amx", amx::linear_q4, true);
  t.back().linear_swiglu = amx::linear_q4_swiglu;
  for (const FormatTraits& f : format_table())
    if (is_ggml_int(f.id)) {
      add_linear(Isa::kAvx2, f.id, "gemm_ggml_avx2", avx2::linear_ggml, true);
      add_linear(Isa::kAvx512Vnni, f.id, "gemm_ggml_avx512vnni", avx512vnni::linear_ggml, true);
    }
  for (const FormatTraits& f : format_table())
    if (f.is_weight && f.id != DType::kQ8Row && f.id != DType::kQ4G64 && !is_ggml_int(f.id)) {
      add_linear(Isa::kAmx, f.id, "gemm_bf16_amx", amx::linear_bf16, true);
      t.back().linear_swiglu = amx::linear_bf16_swiglu;
    }
  t.push_back({.op = Op::kAttention, .format = DType::kF32, .isa = Isa::kAmx, .name = "flash_attention_bf16_amx",
               .fast = true, .attention = amx::attention});
  for (const FormatTraits& f : format_table())
    if (f.is_weight)
      t.push_back({.op = Op::kConv2d, .format = f.id, .isa = Isa::kAmx, .name = "conv2d_bf16_amx", .fast = true,
                   .conv2d = amx::conv2d});
#endif
  return t;
}

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kLinear: return "linear";
    case Op::kAttention: return "attention";
    case Op::kConv2d: return "conv2d";
    case Op::kElementwise: return "elementwise";
    case Op::kCount: break;
  }
  return "unknown";
}

std::span<const KernelEntry> kernel_table() {
  static const std::vector<KernelEntry> table = build_table();
  return table;
}

std::string_view precision_name(Precision p) { return p == Precision::kFast ? "fast" : "fp32"; }

bool precision_from_name(std::string_view s, Precision* out) {
  if (s == "fp32") *out = Precision::kFp32;
  else if (s == "fast") *out = Precision::kFast;
  else return false;
  return true;
}

bool skips_bf16_dot(const CpuFeatures& cpu, Isa max_isa) { return max_isa == Isa::kCount && cpu.bf16_dot_slow; }
bool skips_zmm_gemm(const CpuFeatures& cpu, Isa max_isa) { return max_isa == Isa::kCount && cpu.zmm_fma_split; }

KernelSet KernelSet::select(const CpuFeatures& cpu, Isa max_isa, Precision precision) {
  KernelSet s;
  s.precision_ = precision;
  for (Isa isa : cpu.isas())
    if (isa <= max_isa) s.max_isa_ = std::max(s.max_isa_, isa);
  // "Highest" is numeric enum order: the ISAs are not a chain (avx_vnni lacks AVX-512), but an
  // entry is only a candidate when the CPU has its ISA, so any candidate is runnable. Under kFast
  // a fast entry beats every exact one whatever their ISAs: the arithmetic (W8A8 for Q8_ROW) is
  // what the caller chose and what a reference reproduces bit for bit, so it must not depend on
  // whether the CPU has, say, AVX-512F but not VNNI; among fast entries the highest ISA wins.
  const bool skip_bf16_dot = skips_bf16_dot(cpu, max_isa), skip_zmm_gemm = skips_zmm_gemm(cpu, max_isa);
  for (const KernelEntry& e : kernel_table()) {
    if (!cpu.has(e.isa) || e.isa > s.max_isa_) continue;
    if (skip_bf16_dot && e.isa == Isa::kAvx512Bf16) continue;
    if (skip_zmm_gemm && e.op == Op::kLinear && e.isa == Isa::kAvx512 && !e.fast) continue;
    if (e.fast && precision != Precision::kFast) continue;
    const KernelEntry*& c = s.chosen_[static_cast<int>(e.op)][static_cast<int>(e.format)];
    if (!c || (e.fast && !c->fast) || (e.fast == c->fast && e.isa > c->isa)) c = &e;
  }
  return s;
}

const KernelEntry* KernelSet::find(Op op, DType format) const {
  if (op >= Op::kCount || format >= DType::kCount) return nullptr;
  return chosen_[static_cast<int>(op)][static_cast<int>(format)];
}

const KernelEntry& KernelSet::get(Op op, DType format) const {
  const KernelEntry* e = find(op, format);
  if (!e)
    throw std::invalid_argument(std::string(op_name(op)) + ": no kernel for weight format " +
                                std::string(dtype_name(format)));
  return *e;
}

std::string KernelSet::describe() const {
  std::string s;
  for (int op = 0; op < static_cast<int>(Op::kCount); ++op)
    for (int f = 0; f < static_cast<int>(DType::kCount); ++f)
      if (const KernelEntry* e = chosen_[op][f])
        s += std::string(op_name(e->op)) + " " + std::string(dtype_name(e->format)) + ": " +
             std::string(isa_name(e->isa)) + " (" + std::string(e->name) + ")" + (e->fast ? " [fast]" : "") +
             "\n";
  return s;
}

}  // namespace klein::kernels
