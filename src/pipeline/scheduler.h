// The sigma schedule and Euler update of diffusers' FlowMatchEulerDiscreteScheduler as
// Flux2KleinPipeline drives it, reproduced bit for bit (same precision at every step:
// numpy float64 linspace -> float32 numpy shift -> float32 torch timesteps).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace klein {

enum class TimeShiftType { kExponential, kLinear };

// scheduler/scheduler_config.json. Only the keys that change the klein schedule are kept;
// options diffusers supports but this engine does not (karras/exponential/beta sigmas,
// stochastic sampling, use_flow_sigmas) are rejected by from_json with kUnsupported.
struct FlowMatchConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;  // used only when !use_dynamic_shifting
  bool use_dynamic_shifting = false;
  TimeShiftType time_shift_type = TimeShiftType::kExponential;
  // Kept for completeness; the klein pipeline does not use them (it computes its own mu).
  std::optional<double> base_shift = 0.5;
  std::optional<double> max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  std::optional<double> shift_terminal;  // null (or 0) = off
  bool invert_sigmas = false;

  // Defaults are diffusers' constructor defaults; keys may be absent or null.
  static Result<FlowMatchConfig> from_json(const nlohmann::json& j,
                                           const std::string& where = "scheduler_config.json");
  static Result<FlowMatchConfig> from_file(const std::filesystem::path& path);
  // The FLUX.2 / klein values (dynamic shifting, exponential, shift 3.0).
  static FlowMatchConfig flux2();
};

// Flux2KleinPipeline's compute_empirical_mu, in double exactly as Python evaluates it (no fused
// multiply-add), including the jump at image_seq_len > 4300 where num_steps is ignored.
// It returns double, not float: the scheduler uses math.exp(mu) of the Python float, so rounding
// mu to float32 first would change sigmas in the last bit.
double compute_empirical_mu(int64_t image_seq_len, int num_steps);

// Output tokens of a W x H image: (H / 16) * (W / 16), sizes floored as the pipeline does.
int64_t klein_image_seq_len(int64_t width, int64_t height);

struct Schedule {
  std::vector<float> sigmas;     // N + 1; last is 0 (1 with invert_sigmas)
  std::vector<float> timesteps;  // N; sigmas[i] * num_train_timesteps in float32
  double mu = 0.0;               // the mu passed to set_timesteps
};

// FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=sigmas_in, mu=mu) with custom float64 sigmas.
// mu is required when cfg.use_dynamic_shifting.
Result<Schedule> flow_match_set_timesteps(const FlowMatchConfig& cfg,
                                          const std::vector<double>& sigmas_in,
                                          std::optional<double> mu);

// What Flux2KleinPipeline computes for num_steps steps at image_seq_len output tokens:
// sigmas_in = np.linspace(1.0, 1/N, N); mu = compute_empirical_mu(seq_len, N); set_timesteps.
Result<Schedule> make_klein_schedule(const FlowMatchConfig& cfg, int num_steps,
                                     int64_t image_seq_len);

// numpy.linspace(start, stop, num) in float64, element for element (endpoint=True).
std::vector<double> numpy_linspace(double start, double stop, int64_t num);

// One FlowMatchEuler step (stochastic_sampling false), in place: latents += (sigma_next - sigma) * v.
// Float32 model dtype (the fp32 pipeline): dt = f32(sigma_next - sigma);
// latents = f32(latents + f32(dt * v)) -- two roundings, never fused.
void euler_step(float* latents, const float* velocity, int64_t n, float sigma, float sigma_next);
Status euler_step(Tensor& latents, const Tensor& velocity, float sigma, float sigma_next);

// Bfloat16 model dtype on the CPU (latents and velocity hold bf16 values in float storage):
// torch promotes `dt * model_output` to bf16 and casts the 0-dim fp32 dt to bf16 first, then the
// sum is fp32 and is cast back: latents = bf16(latents + bf16(bf16(dt) * v)).
void euler_step_bf16(float* latents, const float* velocity, int64_t n, float sigma,
                     float sigma_next);

}  // namespace klein
