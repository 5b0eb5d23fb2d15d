// The input as JSON text given to every config parser (text encoder, transformer, VAE,
// scheduler), then the sizes each config derives and a klein schedule from the scheduler
// config: the arithmetic that turns file values into dimensions and loop counts.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "models/flux2_dit.h"
#include "models/flux2_vae.h"
#include "models/qwen3.h"
#include "pipeline/scheduler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // No exceptions: the parsers under test get a value, as read_json_file hands them one.
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  if (auto q = klein::Qwen3Config::from_json(j, "config.json"); q.ok()) (void)q->num_heads;
  if (auto f = klein::Flux2Config::from_json(j, "config.json"); f.ok()) {
    (void)f->inner_dim();
    (void)f->mlp_hidden_dim();
  }
  if (auto v = klein::Flux2VaeConfig::from_json(j, "config.json"); v.ok()) {
    (void)v->patch_channels();
    (void)v->scale_factor();
  }
  if (auto s = klein::FlowMatchConfig::from_json(j, "scheduler_config.json"); s.ok()) {
    (void)klein::make_klein_schedule(*s, 4, 256);
    (void)klein::make_klein_schedule(*s, 50, 4096);
  }
  return 0;
}
