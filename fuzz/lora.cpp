// The input as a LoRA .safetensors file, read against the tiny transformer's weights and a few
// text-encoder weights (io/lora.h): key schemes, pairs, ranks and shapes against the targets,
// alphas, PEFT header settings, LoKr / LoHa factors, fused-qkv splits and the final-layer swap;
// then every delta merged into a float32 copy of its target (models/lora_apply.h).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>

#include "fuzz_util.h"
#include "io/lora.h"
#include "models/lora_apply.h"

namespace fs = std::filesystem;

namespace {

const std::vector<klein::LoraTarget>& targets() {
  static const std::vector<klein::LoraTarget> t = [] {
    auto m = klein::Flux2Transformer::load(fs::path(KLEIN_SOURCE_DIR) / "tests/data/tiny/transformer");
    std::vector<klein::LoraTarget> v = m.ok() ? klein::lora_targets(*m) : std::vector<klein::LoraTarget>{};
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"})
      v.push_back({klein::LoraComponent::kTextEncoder, std::string("model.layers.0.self_attn.") + n + ".weight",
                   {16, 16}});
    return v;
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("lora");
  const auto path = scratch.write("lora.safetensors", data, size);
  for (auto comp : {klein::LoraComponent::kTransformer, klein::LoraComponent::kTextEncoder}) {
    auto f = klein::load_lora(path, targets(), comp);
    if (!f.ok()) continue;
    (void)f->bytes();
    for (const klein::LoraDelta& d : f->deltas) {
      // A zero float32 target of the delta's width and enough rows, merged into.
      const int64_t rows = d.row0 + d.rows;
      if (rows * d.cols > (int64_t{1} << 20)) continue;
      std::vector<float> zeros(static_cast<size_t>(rows * d.cols), 0.0f);
      klein::Weight w;
      w.name = d.target;
      w.shape = {rows, d.cols};
      w.data = zeros.data();
      w.nbytes = zeros.size() * sizeof(float);
      auto m = klein::merge_lora_deltas(w, {{&d, 0.5f}}, klein::DType::kF32);
      if (m.ok()) fuzz::consume(m->data, m->nbytes);
    }
  }
  return 0;
}
