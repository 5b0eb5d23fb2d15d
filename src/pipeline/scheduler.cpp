#include "pipeline/scheduler.h"

#include <cmath>

#include "core/dtype.h"
#include "io/json_file.h"

// Every expression below mirrors one numpy/torch/Python operation with its own rounding; a fused
// multiply-add would change results in the last bit. GCC contracts a*b+c across statements by
// default in C++ whenever the target has FMA (aarch64, or x86 built with -mfma), so turn it off.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace klein {

// ------------------------------------------------------------------------------------------------
// config
// ------------------------------------------------------------------------------------------------
FlowMatchConfig FlowMatchConfig::flux2() {
  FlowMatchConfig c;
  c.num_train_timesteps = 1000;
  c.shift = 3.0;
  c.use_dynamic_shifting = true;
  c.time_shift_type = TimeShiftType::kExponential;
  return c;
}

namespace {

Result<std::optional<double>> optional_number(const nlohmann::json& j, const std::string& key,
                                              const std::string& where,
                                              std::optional<double> def) {
  if (!j.contains(key)) return def;
  if (j[key].is_null()) return std::optional<double>();
  if (!j[key].is_number()) return format_error(where + ": \"" + key + "\" is not a number");
  return std::optional<double>(j[key].get<double>());
}

}  // namespace

Result<FlowMatchConfig> FlowMatchConfig::from_json(const nlohmann::json& j,
                                                   const std::string& where) {
  if (!j.is_object()) return format_error(where + ": not a JSON object");
  if (j.contains("_class_name") && j["_class_name"].is_string() &&
      j["_class_name"].get<std::string>() != "FlowMatchEulerDiscreteScheduler") {
    return unsupported(where + ": scheduler class \"" + j["_class_name"].get<std::string>() +
                       "\" (only FlowMatchEulerDiscreteScheduler)");
  }
  FlowMatchConfig c;
  KLEIN_ASSIGN_OR_RETURN(c.num_train_timesteps,
                         json_int(j, "num_train_timesteps", where, int64_t{1000}));
  if (c.num_train_timesteps <= 0) {
    return format_error(where + ": \"num_train_timesteps\" must be positive");
  }
  KLEIN_ASSIGN_OR_RETURN(c.shift, json_number(j, "shift", where, 1.0));
  KLEIN_ASSIGN_OR_RETURN(c.use_dynamic_shifting,
                         json_bool(j, "use_dynamic_shifting", where, false));
  KLEIN_ASSIGN_OR_RETURN(std::string tst,
                         json_string(j, "time_shift_type", where, std::string("exponential")));
  if (tst == "exponential") {
    c.time_shift_type = TimeShiftType::kExponential;
  } else if (tst == "linear") {
    c.time_shift_type = TimeShiftType::kLinear;
  } else {
    return format_error(where + ": \"time_shift_type\" must be \"exponential\" or \"linear\", got \"" +
                        tst + "\"");
  }
  KLEIN_ASSIGN_OR_RETURN(c.base_shift, optional_number(j, "base_shift", where, 0.5));
  KLEIN_ASSIGN_OR_RETURN(c.max_shift, optional_number(j, "max_shift", where, 1.15));
  KLEIN_ASSIGN_OR_RETURN(c.base_image_seq_len,
                         json_int(j, "base_image_seq_len", where, int64_t{256}));
  KLEIN_ASSIGN_OR_RETURN(c.max_image_seq_len,
                         json_int(j, "max_image_seq_len", where, int64_t{4096}));
  KLEIN_ASSIGN_OR_RETURN(c.shift_terminal,
                         optional_number(j, "shift_terminal", where, std::nullopt));
  if (c.shift_terminal && *c.shift_terminal == 0.0) c.shift_terminal.reset();  // falsy in Python
  if (c.shift_terminal && *c.shift_terminal == 1.0) {
    return format_error(where + ": \"shift_terminal\" must not be 1");
  }
  KLEIN_ASSIGN_OR_RETURN(c.invert_sigmas, json_bool(j, "invert_sigmas", where, false));
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                          "stochastic_sampling", "use_flow_sigmas"}) {
    KLEIN_ASSIGN_OR_RETURN(bool on, json_bool(j, key, where, false));
    if (on) return unsupported(where + ": \"" + key + "\": true is not supported");
  }
  return c;
}

Result<FlowMatchConfig> FlowMatchConfig::from_file(const std::filesystem::path& path) {
  KLEIN_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path));
  return from_json(j, path.string());
}

// ------------------------------------------------------------------------------------------------
// mu, linspace
// ------------------------------------------------------------------------------------------------
double compute_empirical_mu(int64_t image_seq_len, int num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const double L = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) {
    const double p = a2 * L;
    return p + b2;
  }
  const double p200 = a2 * L;
  const double m_200 = p200 + b2;
  const double p10 = a1 * L;
  const double m_10 = p10 + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double q = 200.0 * a;
  const double b = m_200 - q;
  const double r = a * static_cast<double>(num_steps);
  return r + b;
}

int64_t klein_image_seq_len(int64_t width, int64_t height) { return (height / 16) * (width / 16); }

std::vector<double> numpy_linspace(double start, double stop, int64_t num) {
  std::vector<double> y;
  if (num <= 0) return y;
  y.resize(static_cast<size_t>(num));
  const int64_t div = num - 1;
  const double delta = stop - start;
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    if (step == 0.0) {
      for (int64_t i = 0; i < num; ++i) {
        const double t = static_cast<double>(i) / static_cast<double>(div);
        y[i] = t * delta;
      }
    } else {
      for (int64_t i = 0; i < num; ++i) y[i] = static_cast<double>(i) * step;
    }
  } else {
    for (int64_t i = 0; i < num; ++i) y[i] = static_cast<double>(i) * delta;
  }
  for (int64_t i = 0; i < num; ++i) y[i] = y[i] + start;
  if (num > 1) y[num - 1] = stop;
  return y;
}

// ------------------------------------------------------------------------------------------------
// set_timesteps
// ------------------------------------------------------------------------------------------------
Result<Schedule> flow_match_set_timesteps(const FlowMatchConfig& cfg,
                                          const std::vector<double>& sigmas_in,
                                          std::optional<double> mu) {
  if (sigmas_in.empty()) return invalid_argument("set_timesteps: no sigmas");
  if (cfg.use_dynamic_shifting && !mu) {
    return invalid_argument("set_timesteps: mu is required when use_dynamic_shifting is true");
  }
  const size_t n = sigmas_in.size();
  // np.array(sigmas).astype(np.float32)
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<float>(sigmas_in[i]);

  // 2. shift, numpy float32 (Python floats are weak scalars: rounded to float32 first).
  if (cfg.use_dynamic_shifting) {
    // time_shift(mu, 1.0, t): exp(mu) / (exp(mu) + (1/t - 1) ** 1.0)   [or mu / (mu + ...)]
    const float m = cfg.time_shift_type == TimeShiftType::kExponential
                        ? static_cast<float>(std::exp(*mu))
                        : static_cast<float>(*mu);
    for (size_t i = 0; i < n; ++i) {
      float r = 1.0f / s[i];
      r = r - 1.0f;  // ** 1.0 is the identity
      const float den = m + r;
      s[i] = m / den;
    }
  } else {
    // shift * t / (1 + (shift - 1) * t)
    const float sh = static_cast<float>(cfg.shift);
    const float sh1 = static_cast<float>(cfg.shift - 1.0);
    for (size_t i = 0; i < n; ++i) {
      const float num = sh * s[i];
      const float prod = sh1 * s[i];
      const float den = 1.0f + prod;
      s[i] = num / den;
    }
  }

  // 3. stretch_shift_to_terminal (numpy float32)
  if (cfg.shift_terminal) {
    std::vector<float> omz(n);
    for (size_t i = 0; i < n; ++i) omz[i] = 1.0f - s[i];
    const float scale = omz[n - 1] / static_cast<float>(1.0 - *cfg.shift_terminal);
    for (size_t i = 0; i < n; ++i) {
      const float q = omz[i] / scale;
      s[i] = 1.0f - q;
    }
  }

  // 5./6. torch float32: timesteps = sigmas * num_train_timesteps; append the terminal sigma.
  const float ntt = static_cast<float>(cfg.num_train_timesteps);
  Schedule out;
  out.mu = mu.value_or(0.0);
  out.sigmas.resize(n + 1);
  out.timesteps.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float sig = cfg.invert_sigmas ? 1.0f - s[i] : s[i];
    out.sigmas[i] = sig;
    out.timesteps[i] = sig * ntt;
  }
  out.sigmas[n] = cfg.invert_sigmas ? 1.0f : 0.0f;
  return out;
}

Result<Schedule> make_klein_schedule(const FlowMatchConfig& cfg, int num_steps,
                                     int64_t image_seq_len) {
  if (num_steps < 1) {
    return invalid_argument("number of steps must be at least 1, got " + std::to_string(num_steps));
  }
  if (image_seq_len < 1) {
    return invalid_argument("image_seq_len must be positive, got " + std::to_string(image_seq_len));
  }
  // sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
  const double last = 1.0 / static_cast<double>(num_steps);
  std::vector<double> sigmas_in = numpy_linspace(1.0, last, num_steps);
  const double mu = compute_empirical_mu(image_seq_len, num_steps);
  return flow_match_set_timesteps(cfg, sigmas_in, mu);
}

// ------------------------------------------------------------------------------------------------
// Euler step
// ------------------------------------------------------------------------------------------------
void euler_step(float* latents, const float* velocity, int64_t n, float sigma, float sigma_next) {
  const float dt = sigma_next - sigma;
  for (int64_t i = 0; i < n; ++i) {
    const float p = dt * velocity[i];  // rounded: `dt * model_output` is its own tensor
    latents[i] = latents[i] + p;
  }
}

Status euler_step(Tensor& latents, const Tensor& velocity, float sigma, float sigma_next) {
  if (latents.numel() != velocity.numel()) {
    return invalid_argument("euler_step: latents " + shape_str(latents.shape()) + " vs velocity " +
                            shape_str(velocity.shape()));
  }
  euler_step(latents.data(), velocity.data(), latents.numel(), sigma, sigma_next);
  return Status::Ok();
}

void euler_step_bf16(float* latents, const float* velocity, int64_t n, float sigma,
                     float sigma_next) {
  const float dt = round_bf16(sigma_next - sigma);
  for (int64_t i = 0; i < n; ++i) {
    const float p = round_bf16(dt * velocity[i]);
    latents[i] = round_bf16(latents[i] + p);
  }
}

}  // namespace klein
