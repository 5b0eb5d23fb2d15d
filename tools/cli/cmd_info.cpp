// `klein info`: what a model folder holds — components, classes, config dims, dtypes, sizes.
#include <cstdio>
#include <map>
#include <memory>

#include "core/format.h"
#include "commands.h"
#include "common.h"
#include "io/model_folder.h"
#include "io/safetensors.h"

namespace klein::cli {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.3f B", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.3f M", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace

Command make_info_command() {
  auto model = std::make_shared<std::string>();
  Command c;
  c.attach_fn = [model](CLI::App& app) {
    auto* s = app.add_subcommand("info", "Describe a model folder: components, classes, config, dtypes, sizes");
    s->add_option("--model", *model, "Model folder (diffusers layout, with model_index.json)")->required();
    return s;
  };
  c.run = [model]() -> int {
    auto m = ModelFolder::open(*model);
    if (!m.ok()) return fail(m.status());
    std::printf("model      %s\n", m->root().string().c_str());
    std::printf("pipeline   %s%s\n", m->pipeline_class().c_str(), m->is_distilled() ? " (distilled: 4 steps, no CFG)" : "");
    int errors = 0;
    for (const auto& [name, ci] : m->components()) {
      std::printf("\n[%s] %s (%s)\n", name.c_str(), ci.class_name.c_str(), ci.library.c_str());
      auto comp = m->component(name);
      if (!comp.ok()) {
        std::printf("  missing: %s\n", comp.status().message().c_str());
        ++errors;
        continue;
      }
      if (name != "tokenizer") {
        auto cfg = m->config(name);
        if (!cfg.ok()) {
          std::printf("  config: %s\n", cfg.status().message().c_str());
          ++errors;
        } else {
          std::string line;
          for (auto it = cfg->begin(); it != cfg->end(); ++it) {
            if (it.key().starts_with("_")) continue;
            if (it->is_number() || it->is_boolean() || (it->is_array() && it->size() <= 8 && !it->empty() && (*it)[0].is_number())) {
              std::string item = it.key() + "=" + it->dump();
              if (line.size() + item.size() > 96) {
                std::printf("  %s\n", line.c_str());
                line.clear();
              }
              line += (line.empty() ? "" : "  ") + item;
            }
          }
          if (!line.empty()) std::printf("  %s\n", line.c_str());
        }
      }
      if (name == "tokenizer" || name == "scheduler") continue;
      auto store = WeightStore::open(comp->dir);
      if (!store.ok()) {
        std::printf("  weights: %s\n", store.status().message().c_str());
        ++errors;
        continue;
      }
      std::map<std::string, std::pair<double, double>> by_dtype;  // dtype -> (params, bytes)
      double params = 0;
      for (const auto& n : store->names()) {
        const TensorEntry* e = store->entry(n);
        const double cnt = static_cast<double>(shape_numel(e->shape));
        params += cnt;
        auto& slot = by_dtype[std::string(dtype_name(e->dtype))];
        slot.first += cnt;
        slot.second += static_cast<double>(e->nbytes);
      }
      std::printf("  weights    %zu file(s), %zu tensors, %s parameters, %s\n", store->files().size(),
                  store->names().size(), human_count(params).c_str(), human_bytes(static_cast<double>(store->total_bytes())).c_str());
      for (const auto& [dt, v] : by_dtype)
        std::printf("    %-8s %s parameters, %s\n", dt.c_str(), human_count(v.first).c_str(), human_bytes(v.second).c_str());
    }
    return errors ? 1 : 0;
  };
  return c;
}

std::vector<Command> all_commands() {
  return {make_generate_command(), make_encode_command(), make_tokenize_command(), make_info_command()};
}

}  // namespace klein::cli
