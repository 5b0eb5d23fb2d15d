#include "api/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace klein::api {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

namespace {
std::function<void(MemoryPlan&)>& adjuster() {
  static std::function<void(MemoryPlan&)> fn;
  return fn;
}
}  // namespace

void set_plan_adjuster(std::function<void(MemoryPlan&)> fn) { adjuster() = std::move(fn); }
const std::function<void(MemoryPlan&)>& plan_adjuster() { return adjuster(); }

uint64_t MemoryPlan::peak() const { return std::max({encode, denoise, decode}); }

std::string MemoryPlan::summary() const {
  if (encode_only)
    return "memory plan: text encoder " + std::string(stream_te ? "streamed" : "whole") + "; estimated peak " +
           gib(encode) + " GiB";
  std::string s = "memory plan: text encoder " + std::string(stream_te ? "streamed" : "whole") + ", transformer " +
                  (stream_dit ? "streamed" : "whole") + ", VAE " +
                  (vae_tile > 0 ? "tiles of " + std::to_string(vae_tile) + " px" : std::string("whole image")) +
                  "; estimated peak " + gib(peak()) + " GiB (encode " + gib(encode) + ", denoise " + gib(denoise) +
                  ", decode " + gib(decode) + ")";
  return s;
}

namespace {

uint64_t resident(const BlockedWeights& w, bool stream) { return stream ? w.outside + w.largest_block : w.total; }
// What stays in memory after a phase with kResident (streaming drops the last block too).
uint64_t left_over(const BlockedWeights& w, bool stream) { return stream ? w.outside : w.total; }

struct Phases {
  uint64_t encode, denoise, vae_fixed;  // vae_fixed: decode without its activations
  std::string denoise_detail, encode_detail;
};

Phases phases(const MemoryNeeds& n, bool st, bool sd) {
  Phases p;
  const uint64_t common = n.base + n.scratch;
  p.encode = common + resident(n.te, st) + n.te_activations;
  p.encode_detail = "text encoder weights " + gib(resident(n.te, st)) + " + activations " + gib(n.te_activations);
  uint64_t carried = n.resident ? left_over(n.te, st) : 0;
  const uint64_t vae_held = n.vae_during_denoise || n.resident ? n.vae_weights : 0;
  p.denoise = common + carried + vae_held + resident(n.dit, sd) + n.dit_activations;
  p.denoise_detail = "transformer weights " + gib(resident(n.dit, sd)) + " + activations " + gib(n.dit_activations);
  if (n.resident) carried += left_over(n.dit, sd);
  p.vae_fixed = common + carried + n.vae_weights;
  return p;
}

// A prompt encoded on its own: the text encoder's phase is the whole request.
Result<MemoryPlan> plan_encode(const MemoryNeeds& n, uint64_t budget) {
  MemoryPlan plan;
  plan.encode_only = true;
  for (bool st : {false, true}) {
    const Phases p = phases(n, st, true);
    plan.stream_te = st;
    plan.encode = p.encode;
    if (plan.encode <= budget) return plan;
  }
  return Status{Code::kOutOfMemory, "--max-memory " + gib(budget) + ": this request needs at least " +
                                        gib(plan.encode) + " GiB (encode: " + phases(n, true, true).encode_detail +
                                        ", kernel scratch " + gib(n.scratch) + ", process " + gib(n.base) + " GiB)"};
}

}  // namespace

Result<MemoryPlan> plan_memory(const MemoryNeeds& n, uint64_t budget) {
  if (n.encode_only) return plan_encode(n, budget);
  // Tiles the planner tries, largest first; the tiled pass recomputes more halo per pixel as
  // tiles shrink, so the largest that fits is the fastest.
  std::vector<int64_t> tiles;
  if (n.vae_forced_tile > 0) tiles = {n.vae_forced_tile};
  else if (n.vae_forced_tile < 0) tiles = {0};
  else tiles = {0, 1024, 768, 512, 384, 256, 192, 128, 64};
  const bool combos[4][2] = {{false, false}, {true, false}, {false, true}, {true, true}};
  MemoryPlan best;
  bool have_best = false;
  for (const auto& c : combos) {
    const Phases p = phases(n, c[0], c[1]);
    MemoryPlan plan;
    plan.stream_te = c[0];
    plan.stream_dit = c[1];
    plan.encode = p.encode;
    plan.denoise = p.denoise;
    for (int64_t t : tiles) {
      const uint64_t act = t == 0 ? n.vae_whole : (n.vae_tiled ? n.vae_tiled(t) : n.vae_whole);
      plan.vae_tile = t;
      plan.decode = p.vae_fixed + act;
      if (plan.decode <= budget || t == tiles.back()) break;
    }
    if (plan.peak() <= budget) {
      // What the decode phase leaves keeps whole activations between the statistics passes
      // (fewer recomputed tiles: time for memory); half of it, for the estimate's error.
      const uint64_t slack = budget - plan.decode;
      plan.vae_keep_bytes = plan.vae_tile > 0 ? std::min<uint64_t>(slack / 2, uint64_t{256} << 20) : 0;
      plan.decode += plan.vae_keep_bytes;
      return plan;
    }
    if (!have_best || plan.peak() < best.peak()) best = plan, have_best = true;
  }
  // Name the phase that does not fit even with everything streamed and the smallest tile.
  const Phases p = phases(n, true, true);
  std::string detail;
  if (best.peak() == best.encode) detail = "encode: " + p.encode_detail;
  else if (best.peak() == best.denoise) detail = "denoise: " + p.denoise_detail;
  else detail = "decode: VAE weights " + gib(n.vae_weights) + " + tiled activations " + gib(best.decode - p.vae_fixed);
  return Status{Code::kOutOfMemory, "--max-memory " + gib(budget) + ": this request needs at least " + gib(best.peak()) +
                       " GiB (" + detail + ", kernel scratch " + gib(n.scratch) + ", process " + gib(n.base) +
                       " GiB)"};
}

}  // namespace klein::api
