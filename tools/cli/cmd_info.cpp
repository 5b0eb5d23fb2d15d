// `klein info`: what a model folder holds — components, classes, config dims, dtypes, sizes —
// and, with --cpu, what this CPU offers the kernels.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "commands.h"
#include "common.h"
#include "klein/klein.h"

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

// "1024x768" -> {1024, 768}.
bool parse_size(const std::string& s, std::pair<int, int>* out) {
  const auto x = s.find('x');
  if (x == std::string::npos) return false;
  try {
    size_t a = 0, b = 0;
    const int w = std::stoi(s.substr(0, x), &a), h = std::stoi(s.substr(x + 1), &b);
    if (a != x || b != s.size() - x - 1 || w < 1 || h < 1 || w > 65536 || h > 65536) return false;
    *out = {w, h};
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

Command make_info_command() {
  struct Opts {
    ModelArgs ma;
    bool cpu = false;
    std::string isa;
    int width = 0, height = 0;
    std::vector<std::string> refs;
    double guidance = -1;
  };
  auto o = std::make_shared<Opts>();
  Command c;
  c.attach_fn = [o](CLI::App& app) {
    auto* s = app.add_subcommand("info", "Describe a model (layout, components, naming schemes, families, variant, "
                                         "config, formats, sizes) or this CPU; exits 1 when a part is missing");
    o->ma.add(s, kModelFileHelp);
    s->add_flag("--cpu", o->cpu, "Describe this CPU and the kernel klein.cpp chooses per op and weight format (the exact precision fp32, and what the default precision fast changes)");
    s->add_option("--isa", o->isa,
                  "With --cpu: the kernels chosen under this ISA ceiling (scalar, avx2, avx512, ...; one this CPU has)");
    s->add_option("--width,-W", o->width, "With a model: the request whose memory needs are shown has this width (default: the model's native size)")
        ->check(CLI::Range(16, 8192));
    s->add_option("--height,-H", o->height, "... and this height")->check(CLI::Range(16, 8192));
    s->add_option("--ref-size", o->refs, "... and a reference image of this size, WxH in pixels (repeatable)");
    s->add_option("--guidance-scale", o->guidance, "... and this guidance scale (base models: > 1 runs CFG; default 4.0)");
    return s;
  };
  c.run = [o]() -> int {
    if (!o->ma.any() && !o->cpu)
      return fail(invalid_argument("info: give --model (a folder or file), --diffusion-model / --text-encoder / --vae "
                                   "files, and/or --cpu"));
    if (!o->isa.empty() && !o->cpu) return fail(invalid_argument("--isa " + o->isa + ": only with --cpu"));
    if (o->cpu) {
      // The same check as the commands that run kernels: a known ISA that this CPU has.
      LoadOptions lo;
      lo.isa = o->isa;
      if (Status st = check_load_options_cli(lo); !st.ok()) return fail(st);
      auto report = cpu_info(o->isa);
      if (!report.ok()) return fail(report.status());
      std::printf("%s", report->c_str());
    }
    if (!o->ma.any()) return 0;
    LoadOptions lo;
    o->ma.apply(lo);
    auto m = Model::inspect(o->ma.model, lo);
    if (!m.ok()) return fail(m.status());
    if (o->cpu) std::printf("\n");
    std::printf("model      %s\n", m->path.c_str());
    std::printf("layout     %s\n", m->layout.c_str());
    if (!m->pipeline_class.empty()) std::printf("pipeline   %s\n", m->pipeline_class.c_str());
    std::printf("variant    %s (%s)%s\n", m->kv ? "kv" : m->distilled ? "distilled" : "base", m->variant_source.c_str(),
                m->kv          ? ": 4 steps, no CFG, references' keys and values cached after the first step"
                : m->distilled ? ": 4 steps, no CFG"
                               : ": 50 steps, classifier-free guidance 4.0 by default");
    print_notes(m->notes);
    for (const auto& ci : m->components) {
      if (ci.class_name.empty()) std::printf("\n[%s]\n", ci.name.c_str());  // not in model_index.json
      else std::printf("\n[%s] %s (%s)\n", ci.name.c_str(), ci.class_name.c_str(), ci.library.c_str());
      if (!ci.dir.empty()) std::printf("  from       %s\n", ci.dir.c_str());
      if (!ci.scheme.empty())
        std::printf("  names      %s%s%s\n", ci.scheme.c_str(), ci.family.empty() ? "" : "; family ",
                    ci.family.c_str());
      if (!ci.description.empty()) std::printf("  detected   %s\n", ci.description.c_str());
      if (!ci.container.empty()) std::printf("  container  %s\n", ci.container.c_str());
      std::string line;
      for (const auto& [key, value] : ci.config) {
        std::string item = key + "=" + value;
        if (line.size() + item.size() > 96) {
          std::printf("  %s\n", line.c_str());
          line.clear();
        }
        line += (line.empty() ? "" : "  ") + item;
      }
      if (!line.empty()) std::printf("  %s\n", line.c_str());
      if (!ci.error.empty()) {
        std::printf("  %s\n", ci.error.c_str());
        // The report goes on with the other components; the error also goes to stderr, where a
        // script looks for why the exit code is 1.
        std::fprintf(stderr, "klein: %s: %s\n", ci.name.c_str(), ci.error.c_str());
      }
      if (!ci.has_weights) continue;
      std::printf("  weights    %zu file(s), %zu tensors, %s parameters, %s\n", ci.files, ci.tensors,
                  human_count(ci.parameters).c_str(), human_bytes(static_cast<double>(ci.bytes)).c_str());
      for (const auto& d : ci.by_dtype)
        std::printf("    %-8s %s parameters in %zu tensors, %s\n", d.dtype.c_str(), human_count(d.parameters).c_str(),
                    d.tensors, human_bytes(static_cast<double>(d.bytes)).c_str());
    }
    if (m->errors) return 1;
    // What one request needs in memory: the planner behind --max-memory, nothing loaded or run.
    RequestSize rs;
    rs.width = o->width;
    rs.height = o->height;
    rs.guidance_scale = o->guidance;
    for (const auto& r : o->refs) {
      std::pair<int, int> wh;
      if (!parse_size(r, &wh)) return fail(invalid_argument("--ref-size " + r + ": expected WIDTHxHEIGHT, e.g. 1024x768"));
      rs.references.push_back(wh);
    }
    auto model = Model::open(o->ma.model, lo);
    if (!model.ok()) return fail(model.status());
    auto est = (*model)->estimate_memory(rs);
    if (!est.ok()) return fail(est.status());
    std::printf("\n[request] %dx%d: %lld image tokens", est->width, est->height,
                static_cast<long long>(est->image_tokens));
    if (est->reference_tokens)
      std::printf(", %zu reference(s) of %lld tokens", rs.references.size(),
                  static_cast<long long>(est->reference_tokens));
    std::printf("%s\n", est->guidance ? ", classifier-free guidance" : "");
    std::printf("  fastest    %s\n", est->resident_plan.c_str());
    std::printf("  smallest   %s\n", est->minimum_plan.c_str());
    std::printf("             (--max-memory %.2f or more runs it)\n",
                std::ceil(static_cast<double>(est->minimum_bytes) / (1ull << 30) * 100) / 100);
    return 0;
  };
  return c;
}

std::vector<Command> all_commands() {
  return {make_generate_command(), make_encode_command(), make_tokenize_command(), make_info_command(),
          make_quantize_command(), make_decode_command(), make_compare_command(), make_serve_command(), make_manifest_command()};
}

}  // namespace klein::cli
