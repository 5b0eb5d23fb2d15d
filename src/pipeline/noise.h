// Initial noise, bit-identical to
//   torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=float32|bfloat16)
// which is what diffusers' randn_tensor does for Flux2KleinPipeline with a CPU generator.
//
// What torch (2.x, verified on 2.15) does on the CPU:
//  * Generator: a standard MT19937 seeded with (uint32)seed (init_genrand); random() = one output,
//    random64() = (first << 32) | second.
//  * numel >= 16 and contiguous ("normal_fill", float and bf16 alike, math in float32):
//      uniform u = (random() & 0xFFFFFF) * 2^-24.
//      Each block of 16 values is Box-Muller on 8 pairs: u1 = 1 - u[j], u2 = u[j+8] (j = 0..7),
//      out[j] = r*cos(theta), out[j+8] = r*sin(theta), r = sqrt(-2*log(u1)), theta = 2*pi*u2.
//      float32: all numel uniforms are drawn first, blocks 0,16,32,... are transformed in place;
//      if numel % 16 != 0, 16 *more* uniforms are drawn and transformed into the last 16 slots
//      (overwriting the tail of the last full block).
//      bf16: uniforms are drawn block by block (16 at a time) into a float buffer, transformed,
//      rounded to bf16 (nearest even); the tail block is the same 16 new uniforms written to the
//      last 16 slots. So bf16 == round(float32 result) exactly when numel % 16 == 0 and differs
//      otherwise (the tail uses different uniforms).
//      log/sin/cos depend on the ATen CPU kernel: on x86 with AVX2 (also on AVX-512 CPUs, since
//      normal_ is not dispatched to AVX-512) the AVX2 kernel uses avx_mathfun's Cephes log256_ps /
//      sincos256_ps with the FMA contractions of torch's GCC build and theta = f32(2pi) * u2 in
//      float32; the DEFAULT kernel (ATEN_CPU_CAPABILITY=default, non-AVX2 CPUs) uses libm
//      logf / sincosf with theta = f32(2pi_double * u2) computed in double.
//  * numel < 16 (or non-contiguous): element by element, at::normal_distribution<double>:
//      u1, u2 = (random64() & (2^53-1)) * 2^-53; r = sqrt(-2 * log1p(-u2)); theta = 2pi * u1;
//      returns r*cos(theta) and caches r*sin(theta) in the generator for the next element.
//      Stored as float(value) for float32 and bf16(float(value)) (double rounding) for bf16.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace klein {

// torch's CPU generator (at::CPUGeneratorImpl) after manual_seed(seed).
class TorchCpuGenerator {
 public:
  explicit TorchCpuGenerator(uint64_t seed);
  uint32_t random() { return static_cast<uint32_t>(engine_()); }
  uint64_t random64() {
    const uint64_t hi = random();
    const uint64_t lo = random();
    return (hi << 32) | lo;
  }
  // at::uniform_real_distribution<float>(0, 1): 24 random bits.
  float uniform_float() {
    return static_cast<float>(random() & 0xFFFFFFu) * (1.0f / 16777216.0f);
  }
  // at::uniform_real_distribution<double>(0, 1): 53 random bits.
  double uniform_double() {
    return static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) *
           (1.0 / 9007199254740992.0);
  }
  // at::normal_distribution<double>(0, 1), using and refilling the generator's cached value.
  double normal_double();

 private:
  std::mt19937 engine_;  // MT19937 with init_genrand seeding, same as at::mt19937
  std::optional<double> next_double_normal_;
};

// Which ATen CPU kernel to reproduce for numel >= 16.
enum class TorchCpuKernel {
  kAvx2,     // any x86-64 CPU with AVX2 (incl. AVX-512 ones): what torch runs almost everywhere
  kDefault,  // ATEN_CPU_CAPABILITY=default / CPUs without AVX2 (uses this machine's libm)
};

// torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype) as float values;
// with bf16 = true every value is a bfloat16 value (exactly representable in the float storage).
Tensor torch_randn(const std::vector<int64_t>& shape, uint64_t seed, bool bf16,
                   TorchCpuKernel kernel = TorchCpuKernel::kAvx2);

// The same draw into `out` (n values, contiguous) from an existing generator, as a second
// torch.randn call on that generator would continue.
void torch_normal_fill(TorchCpuGenerator& gen, float* out, int64_t n, bool bf16,
                       TorchCpuKernel kernel = TorchCpuKernel::kAvx2);

// The latent noise shape of Flux2KleinPipeline.prepare_latents: (1, 128, H/16, W/16).
std::vector<int64_t> klein_noise_shape(int64_t width, int64_t height);

}  // namespace klein
