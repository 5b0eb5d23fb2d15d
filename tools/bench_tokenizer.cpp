// klein-bench_tokenizer: how long the Qwen3 tokenizer takes to load and to encode a prompt of
// about 512 tokens (the klein text-encoder length). Targets: load <= 300 ms, encode <= 5 ms.
//
//   klein-bench_tokenizer [--tokenizer DIR] [--reps N] [--prompt TEXT]
//
// Prints the median wall and CPU milliseconds. On a busy shared machine the wall time mostly
// measures the neighbours; the CPU time (this thread only) tells how long the work itself took.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <time.h>
#include <vector>

#include "pipeline/tokenizer.h"

using namespace klein;

namespace {

double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

struct Sample {
  double wall, cpu;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void report(const char* what, const std::vector<Sample>& s) {
  std::vector<double> w, c;
  for (const Sample& x : s) {
    w.push_back(x.wall);
    c.push_back(x.cpu);
  }
  std::printf("%-34s median %8.3f ms wall, %8.3f ms CPU  (min %.3f / %.3f, n=%zu)\n", what, median(w), median(c),
              *std::min_element(w.begin(), w.end()), *std::min_element(c.begin(), c.end()), s.size());
}

// A varied image prompt (no repeated paragraphs, so the word cache does not flatter the first
// encode), repeated only if it is still short of 512 tokens.
const char* kPrompt =
    "A sweeping aerial view of a terraced tea plantation in the misty highlands at sunrise, rows of "
    "emerald bushes curving along the hills like contour lines, pickers in bright scarves carrying "
    "woven baskets, a small wooden factory with a rusted tin roof and smoke drifting from its chimney. "
    "Soft volumetric light breaks through low clouds; dew sparkles on the leaves. Shot on a 35mm lens "
    "at f/2.8, 1/250s, ISO 200 - cinematic color grading, teal & orange, film grain, 8k, ultra-detailed, "
    "award-winning photograph (National Geographic style), \"golden hour\" warmth, no text, no watermark. "
    "In the foreground, an elderly farmer with a weathered face and a straw hat inspects a handful of "
    "freshly plucked buds; her calloused fingers are stained green. Behind her, a narrow-gauge railway "
    "winds past a whitewashed shrine decorated with marigold garlands and brass bells. Two children chase "
    "a scruffy terrier along the embankment while a steam locomotive, painted maroon with gold trim, "
    "puffs toward a stone viaduct that spans a rushing waterfall. Mood: serene, nostalgic, hopeful. "
    "Composition follows the rule of thirds, with leading lines drawn by the terraces and the railway "
    "converging on the distant snow-capped peaks; atmospheric perspective softens the farthest ridges "
    "into layered silhouettes of lilac and slate blue. Render the textures meticulously: glossy tea "
    "leaves, rough bark of silver oaks planted for shade, peeling paint on the factory shutters, wet "
    "gravel on the paths, the frayed edges of the pickers' shawls. Lighting: warm rim light from the "
    "low sun, cool fill from the overcast sky, subtle god rays through drifting fog banks, specular "
    "highlights on puddles. Avoid: oversaturation, plastic skin, distorted hands, extra limbs, blurry "
    "faces, lens flare artifacts, chromatic aberration, jpeg compression, cropped heads, duplicated "
    "figures. Style references: Steve McCurry's portraits, Hiroshi Yoshida's woodblock landscapes, and "
    "the painterly matte backgrounds of classic animated films; aspect ratio 16:9, 4096x2304 pixels, "
    "shallow depth of field on the farmer, everything else gently out of focus, 10-bit HDR master. "
    "Extra details for the background: a flock of egrets lifting off a paddy field, a red post box "
    "leaning at the crossing, prayer flags fluttering over the ridge, a lone cyclist pushing uphill "
    "with sacks of rice strapped to the rack, and faint stars still visible in the western sky. ";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark the Qwen3 tokenizer: load time and encode time of a ~512-token prompt"};
  std::string dir = "tests/data/tiny/tokenizer";
  int reps = 20;
  std::string prompt;
  app.add_option("--tokenizer", dir, "folder with tokenizer.json (or vocab.json + merges.txt), or the file itself");
  app.add_option("--reps", reps, "repetitions (load: reps/4, at least 3)")->check(CLI::Range(1, 100000));
  app.add_option("--prompt", prompt, "prompt to encode instead of the built-in ~512-token one");
  CLI11_PARSE(app, argc, argv);

  // Load, and the first encode on each fresh tokenizer (empty word cache).
  const int load_reps = std::max(3, reps / 4);
  std::vector<Sample> loads, cold;
  std::vector<Tokenizer> keep;
  std::string text;
  for (int r = 0; r < load_reps; ++r) {
    const double w0 = wall_ms(), c0 = cpu_ms();
    auto tok = Tokenizer::load(dir);
    const double w1 = wall_ms(), c1 = cpu_ms();
    if (!tok.ok()) {
      std::fprintf(stderr, "error: %s\n", tok.status().to_string().c_str());
      return 1;
    }
    loads.push_back({w1 - w0, c1 - c0});
    bool warmed = false;  // building the default prompt ran encode() on this tokenizer
    if (text.empty()) {
      warmed = prompt.empty();
      if (prompt.empty()) {
        while (tok->encode(Tokenizer::klein_template(prompt)).size() < 512) prompt += kPrompt;
      }
      text = Tokenizer::klein_template(prompt);
    }
    const double w2 = wall_ms(), c2 = cpu_ms();
    auto p = tok->encode_padded(text, 512);
    const double w3 = wall_ms(), c3 = cpu_ms();
    if (!warmed) cold.push_back({w3 - w2, c3 - c2});
    if (r == 0) keep.push_back(std::move(tok).value());
  }
  const Tokenizer& tok = keep.front();
  const auto padded = tok.encode_padded(text, 512);
  std::printf("tokenizer: %s (vocab %zu, pad id %d)\n", dir.c_str(), tok.vocab_size(), tok.pad_id());
  std::printf("prompt: %zu bytes, %d tokens templated (%d kept of 512)\n", text.size(), padded.untruncated_length,
              padded.num_real);

  std::vector<Sample> warm;
  for (int r = 0; r < reps; ++r) {
    const double w0 = wall_ms(), c0 = cpu_ms();
    auto p = tok.encode_padded(text, 512);
    const double w1 = wall_ms(), c1 = cpu_ms();
    warm.push_back({w1 - w0, c1 - c0});
  }
  report("load", loads);
  report("encode 512 (first, cold cache)", cold);
  report("encode 512 (repeat, warm cache)", warm);
  return 0;
}
