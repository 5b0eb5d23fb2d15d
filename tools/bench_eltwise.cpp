// klein-bench_eltwise: the element-wise ops (norms, RoPE, SwiGLU, modulation, residuals) through
// the CPU backend at the real model's shapes, once per element-wise kernel (scalar reference,
// AVX2, AVX-512), in GB/s of the bytes each op must move and as a speedup over the scalar loops;
// then one DiT single-stream and one double-stream block at 256² (768 tokens) op by op, to give
// the element-wise share of a transformer step with scalar and with SIMD element-wise kernels,
// under both precisions (bf16 weights: fp32 AVX-512 GEMM / bf16 dot-product GEMM).
//
//   klein-bench_eltwise [--threads N] [--reps R] [--no-blocks]
//
// Shapes (FLUX.2 [klein] 4B at 256²: 512 text + 256 image tokens, D = 3072 = 24 heads × 128,
// MLP 9216; Qwen3-4B text encoder: 512 tokens, hidden 2560, 32 q heads × 128, MLP 9728; VAE
// decoder GroupNorm at 128² × 256 channels). Times are the best of R wall-clock repetitions.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <time.h>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "bench_timing.h"

using namespace klein;

namespace {

using bench::cpu_s;
using bench::now_s;
using bench::Time;
using bench::time_best;

void must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    std::exit(1);
  }
}

Tensor random_tensor(const Shape& s, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  Tensor t(s);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = d(rng);
  return t;
}

// The activations the benchmarked ops read and write, allocated once at the DiT / Qwen shapes.
struct Buffers {
  static constexpr int64_t S = 768, D = 3072, F = 9216, HD = 128;  // DiT at 256²
  static constexpr int64_t L = 512, Dq = 2560, Fq = 9728;          // Qwen3-4B, 512 tokens
  std::mt19937 rng{7};
  Tensor h = random_tensor({S, D}, rng), nrm = random_tensor({S, D}, rng), o = random_tensor({S, D}, rng);
  Tensor P = random_tensor({S, 3 * D + 2 * F}, rng), cat = random_tensor({S, D + F}, rng);
  Tensor onep = random_tensor({D}, rng, 0.5f, 1.5f), shift = random_tensor({D}, rng), gate = random_tensor({D}, rng);
  Tensor qw = random_tensor({HD}, rng, 0.5f, 1.5f);
  Tensor rcos = random_tensor({S, HD}, rng, -1, 1), rsin = random_tensor({S, HD}, rng, -1, 1);
  Tensor qx = random_tensor({L, Dq}, rng), qh = random_tensor({L, Dq}, rng), qnw = random_tensor({Dq}, rng);
  Tensor qq = random_tensor({L, 32 * HD}, rng);
  Tensor hcos = random_tensor({L, HD / 2}, rng), hsin = random_tensor({L, HD / 2}, rng);
  Tensor qg = random_tensor({L, Fq}, rng), qu = random_tensor({L, Fq}, rng);
  Tensor vae = random_tensor({1, 256, 128, 128}, rng);
  Tensor gsc = random_tensor({256}, rng), gsh = random_tensor({256}, rng);
  std::vector<float> gamma = std::vector<float>(256, 1.0f), beta = std::vector<float>(256, 0.0f);
};

Weight f32_weight(const std::vector<float>& v, const char* name) {
  Weight w;
  w.name = name;
  w.dtype = DType::kF32;
  w.shape = {static_cast<int64_t>(v.size())};
  w.data = v.data();
  w.nbytes = v.size() * sizeof(float);
  return w;
}

struct EltOp {
  std::string name;
  double bytes;  // bytes the op must read + write at least
  std::function<Status(Backend&, Buffers&)> run;
};

std::vector<EltOp> eltwise_ops() {
  using B = Buffers;
  const double f = sizeof(float);
  std::vector<EltOp> ops;
  ops.push_back({"dit modulated_layer_norm [768, 3072]", 2.0 * B::S * B::D * f, [](Backend& be, B& b) {
                   return be.modulated_layer_norm(b.h, b.nrm, b.onep, b.shift, 1e-6f);
                 }});
  // q of the single block's fused projection: row stride 3D + 2F, as the model calls it.
  ops.push_back({"dit qk_norm_rope [768, 24x128] ld 27648", (2.0 * B::S * B::D + 2.0 * B::S * B::HD) * f,
                 [](Backend& be, B& b) {
                   return be.qk_norm_rope(b.P.view().col_range(0, B::D), 24, b.qw, 1e-6f, b.rcos, b.rsin);
                 }});
  ops.push_back({"dit rope_interleaved [768, 24x128] ld 27648", (2.0 * B::S * B::D + 2.0 * B::S * B::HD) * f,
                 [](Backend& be, B& b) {
                   return be.rope_interleaved(b.P.view().col_range(B::D, 2 * B::D), 24, b.rcos, b.rsin);
                 }});
  ops.push_back({"dit swiglu [768, 9216] (P -> cat)", 3.0 * B::S * B::F * f, [](Backend& be, B& b) {
                   const TensorView P = b.P;
                   return be.swiglu(P.col_range(3 * B::D, 3 * B::D + B::F),
                                    P.col_range(3 * B::D + B::F, 3 * B::D + 2 * B::F),
                                    b.cat.view().col_range(B::D, B::D + B::F));
                 }});
  ops.push_back({"dit gated_add [768, 3072]", 3.0 * B::S * B::D * f,
                 [](Backend& be, B& b) { return be.gated_add(b.h, b.o, b.gate); }});
  ops.push_back({"dit add_scalar [1, 3072] (1 + scale)", 2.0 * B::D * f,
                 [](Backend& be, B& b) { return be.add_scalar(b.shift, 1.0f, b.onep); }});
  ops.push_back({"qwen rms_norm [512, 2560]", 2.0 * B::L * B::Dq * f,
                 [](Backend& be, B& b) { return be.rms_norm(b.qx, b.qh, b.qnw, 1e-6f); }});
  ops.push_back({"qwen rms_norm heads [16384, 128] in place", 2.0 * B::L * 32 * B::HD * f, [](Backend& be, B& b) {
                   const TensorView q = b.qq.view().reshaped({B::L * 32, B::HD});
                   return be.rms_norm(q, q, b.qw, 1e-6f);
                 }});
  ops.push_back({"qwen rope_half [512, 32x128]", (2.0 * B::L * 32 * B::HD + B::L * B::HD) * f,
                 [](Backend& be, B& b) { return be.rope_half(b.qq, 32, b.hcos, b.hsin); }});
  ops.push_back({"qwen swiglu [512, 9728] in place", 3.0 * B::L * B::Fq * f,
                 [](Backend& be, B& b) { return be.swiglu(b.qg, b.qu, b.qg); }});
  ops.push_back({"qwen add [512, 2560]", 3.0 * B::L * B::Dq * f,
                 [](Backend& be, B& b) { return be.add(b.qx, b.qh); }});
  ops.push_back({"vae group_norm_affine [256, 128x128] 32 groups", 1.0 * 256 * 128 * 128 * f,
                 [](Backend& be, B& b) {
                   return be.group_norm_affine(b.vae, f32_weight(b.gamma, "gamma"), f32_weight(b.beta, "beta"), 32,
                                               1e-6, b.gsc, b.gsh);
                 }});
  ops.push_back({"vae scale_shift rows [256, 128x128]", 2.0 * 256 * 128 * 128 * f, [](Backend& be, B& b) {
                   const TensorView v = b.vae.view().reshaped({256, 128 * 128});
                   return be.scale_shift(v, v, b.gsc, b.gsh, true);
                 }});
  return ops;
}

// ---- one DiT block at 256², op by op

struct BlockOp {
  std::string name;
  bool eltwise;
  std::function<Status(Backend&)> run;
};

// One bf16 weight buffer, viewed as every [N, K] projection (the values do not matter for time;
// each view is larger than the last-level cache, so it streams from memory like the real one).
struct Weights {
  std::vector<uint16_t> buf;
  explicit Weights(int64_t n) : buf(n) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> d(-0.02f, 0.02f);
    for (auto& v : buf) v = f32_to_bf16(d(rng));
  }
  Weight view(int64_t N, int64_t K, const char* name) const {
    Weight w;
    w.name = name;
    w.dtype = DType::kBF16;
    w.shape = {N, K};
    w.data = buf.data();
    w.nbytes = static_cast<size_t>(N * K) * 2;
    return w;
  }
};

// The ops of Flux2Transformer::single_block / double_block (src/models/flux2_dit_forward.cpp)
// on the buffers of one step, with T = 512 text and N = 256 image rows.
std::vector<BlockOp> block_ops(bool single, Buffers& b, const Weights& w) {
  using B = Buffers;
  const int64_t S = B::S, D = B::D, F = B::F, T = 512;
  const float eps = 1e-6f, scale = 1.0f / std::sqrt(128.0f);
  std::vector<BlockOp> ops;
  auto add = [&](std::string n, bool e, std::function<Status(Backend&)> f) { ops.push_back({n, e, std::move(f)}); };
  const TensorView h = b.h, nrm = b.nrm, P = b.P, cat = b.cat, o = b.o;
  if (single) {
    add("modulated_layer_norm", true,
        [=, &b](Backend& be) { return be.modulated_layer_norm(h, nrm, b.onep, b.shift, eps); });
    add("linear qkv_mlp 3072->27648", false,
        [=, &w](Backend& be) { return be.linear(nrm, w.view(3 * D + 2 * F, D, "qkv_mlp"), nullptr, P); });
    for (int i = 0; i < 2; ++i)
      add("qk_norm_rope", true, [=, &b](Backend& be) {
        return be.qk_norm_rope(P.col_range(i * D, (i + 1) * D), 24, b.qw, eps, b.rcos, b.rsin);
      });
    add("attention", false, [=](Backend& be) {
      return be.attention(P.col_range(0, D), P.col_range(D, 2 * D), P.col_range(2 * D, 3 * D), cat.col_range(0, D),
                          24, 24, scale, AttnMask{});
    });
    add("swiglu", true, [=](Backend& be) {
      return be.swiglu(P.col_range(3 * D, 3 * D + F), P.col_range(3 * D + F, 3 * D + 2 * F), cat.col_range(D, D + F));
    });
    add("linear to_out 12288->3072", false,
        [=, &w](Backend& be) { return be.linear(cat, w.view(D, D + F, "to_out"), nullptr, o); });
    add("gated_add", true, [=, &b](Backend& be) { return be.gated_add(h, o, b.gate); });
    return ops;
  }
  const TensorView qkv = P.reshaped({S, 3 * D}), u = P.reshaped({S, 2 * F}), act = cat.reshaped({S, F});
  // Text rows [0, T), then image rows [T, S): each stream has its own weights in the model.
  const std::pair<int64_t, int64_t> streams[2] = {{0, T}, {T, S}};
  for (const auto& rr : streams)
    add("modulated_layer_norm", true,
        [=, &b, r0 = rr.first, r1 = rr.second](Backend& be) {
          return be.modulated_layer_norm(h.row_range(r0, r1), nrm.row_range(r0, r1), b.onep, b.shift, eps);
        });
  for (const auto& rr : streams)
    for (int i = 0; i < 3; ++i)
      add("linear q/k/v 3072->3072", false, [=, &w, r0 = rr.first, r1 = rr.second](Backend& be) {
        return be.linear(nrm.row_range(r0, r1), w.view(D, D, "qkv"), nullptr,
                         qkv.col_range(i * D, (i + 1) * D).row_range(r0, r1));
      });
  for (const auto& rr : streams)
    for (int i = 0; i < 2; ++i)
      add("qk_norm_rope", true, [=, &b, r0 = rr.first, r1 = rr.second](Backend& be) {
        return be.qk_norm_rope(qkv.col_range(i * D, (i + 1) * D).row_range(r0, r1), 24, b.qw, eps,
                               b.rcos.view().row_range(r0, r1), b.rsin.view().row_range(r0, r1));
      });
  add("attention", false, [=](Backend& be) {
    return be.attention(qkv.col_range(0, D), qkv.col_range(D, 2 * D), qkv.col_range(2 * D, 3 * D),
                        cat.reshaped({S, D}), 24, 24, scale, AttnMask{});
  });
  for (const auto& rr : streams)
    add("linear attn out 3072->3072", false, [=, &w, r0 = rr.first, r1 = rr.second](Backend& be) {
      return be.linear(cat.reshaped({S, D}).row_range(r0, r1), w.view(D, D, "out"), nullptr, o.row_range(r0, r1));
    });
  for (const auto& rr : streams)
    add("gated_add", true, [=, &b, r0 = rr.first, r1 = rr.second](Backend& be) {
      return be.gated_add(h.row_range(r0, r1), o.row_range(r0, r1), b.gate);
    });
  for (const auto& rr : streams)
    add("modulated_layer_norm", true,
        [=, &b, r0 = rr.first, r1 = rr.second](Backend& be) {
          return be.modulated_layer_norm(h.row_range(r0, r1), nrm.row_range(r0, r1), b.onep, b.shift, eps);
        });
  for (const auto& rr : streams)
    add("linear ff_in 3072->18432", false, [=, &w, r0 = rr.first, r1 = rr.second](Backend& be) {
      return be.linear(nrm.row_range(r0, r1), w.view(2 * F, D, "ff_in"), nullptr, u.row_range(r0, r1));
    });
  add("swiglu", true, [=](Backend& be) { return be.swiglu(u.col_range(0, F), u.col_range(F, 2 * F), act); });
  for (const auto& rr : streams)
    add("linear ff_out 9216->3072", false, [=, &w, r0 = rr.first, r1 = rr.second](Backend& be) {
      return be.linear(act.row_range(r0, r1), w.view(D, F, "ff_out"), nullptr, o.row_range(r0, r1));
    });
  for (const auto& rr : streams)
    add("gated_add", true, [=, &b, r0 = rr.first, r1 = rr.second](Backend& be) {
      return be.gated_add(h.row_range(r0, r1), o.row_range(r0, r1), b.gate);
    });
  return ops;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark the element-wise ops per ISA at the model's shapes, and their share of a DiT block"};
  int threads = 2, reps = 5;
  bool no_blocks = false;
  app.add_option("--threads", threads, "threads of the backend");
  app.add_option("--reps", reps, "timed repetitions (best is reported)");
  app.add_flag("--no-blocks", no_blocks, "skip the DiT block measurement (GEMMs: a few seconds)");
  CLI11_PARSE(app, argc, argv);

  const CpuFeatures& cpu = CpuFeatures::host();
  std::printf("cpu features: %s\nthreads: %d, best of %d\n\n", cpu.flags().c_str(), threads, reps);
  // One backend per element-wise kernel: the ceiling that selects it.
  std::vector<Isa> ceilings = {Isa::kScalar};
  if (cpu.has(Isa::kAvx2)) ceilings.push_back(Isa::kAvx2);
  if (cpu.has(Isa::kAvx512)) ceilings.push_back(Isa::kAvx512);
  std::vector<std::unique_ptr<CpuBackend>> backends;
  for (Isa c : ceilings) backends.push_back(std::make_unique<CpuBackend>(CpuBackendOptions{threads, c}));

  Buffers buf;
  std::printf("%-48s", "op (bytes moved)");
  for (auto& be : backends)
    std::printf(" %14s %6s", std::string(be->kernels().eltwise_name()).c_str(), "GB/s");
  std::printf("  speedup (wall, cpu)\n");
  for (const EltOp& op : eltwise_ops()) {
    std::printf("%-48s", op.name.c_str());
    std::vector<Time> t;
    for (auto& be : backends) {
      t.push_back(time_best(reps, [&] { must(op.run(*be, buf)); }));
      std::printf(" %11.3f ms %6.1f", t.back().wall * 1e3, op.bytes / t.back().wall / 1e9);
    }
    std::printf("  %.1fx %.1fx\n", t.front().wall / t.back().wall, t.front().cpu / t.back().cpu);
  }
  if (no_blocks) return 0;

  // Element-wise share of one block: GEMMs and attention timed on the best backend, the
  // element-wise ops on each element-wise kernel; a step is 5 double + 20 single blocks.
  const Weights w(int64_t{27648} * 3072);
  for (auto precision : {kernels::Precision::kFp32, kernels::Precision::kFast}) {
    CpuBackend best(CpuBackendOptions{threads, Isa::kCount, precision});
    std::printf("\nDiT blocks at 256^2 (768 tokens), bf16 weights, precision %s (%s):\n",
                std::string(kernels::precision_name(precision)).c_str(),
                std::string(best.kernels().get(kernels::Op::kLinear, DType::kBF16).name).c_str());
    double step_other = 0;
    std::vector<double> step_elt(backends.size(), 0.0);
    for (bool single : {false, true}) {
      double other = 0;
      std::vector<double> elt(backends.size(), 0.0);
      for (const BlockOp& op : block_ops(single, buf, w)) {
        if (!op.eltwise) {
          other += time_best(std::max(1, reps / 3), [&] { must(op.run(best)); }).wall;
          continue;
        }
        for (size_t i = 0; i < backends.size(); ++i)
          elt[i] += time_best(reps, [&] { must(op.run(*backends[i])); }).wall;
      }
      const int count = single ? 20 : 5;
      std::printf("  %s block: GEMM + attention %.1f ms; element-wise", single ? "single" : "double", other * 1e3);
      for (size_t i = 0; i < backends.size(); ++i) {
        std::printf(" %s %.2f ms (%.1f%%)", std::string(isa_name(backends[i]->kernels().max_isa())).c_str(),
                    elt[i] * 1e3, 100 * elt[i] / (other + elt[i]));
        step_elt[i] += count * elt[i];
      }
      std::printf("\n");
      step_other += count * other;
    }
    std::printf("  step (5 double + 20 single): GEMM + attention %.2f s; element-wise", step_other);
    for (size_t i = 0; i < backends.size(); ++i)
      std::printf(" %s %.3f s (%.1f%%)", std::string(isa_name(backends[i]->kernels().max_isa())).c_str(), step_elt[i],
                  100 * step_elt[i] / (step_other + step_elt[i]));
    std::printf("\n");
  }
  return 0;
}
