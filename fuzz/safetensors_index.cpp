// The input as model.safetensors.index.json beside two valid shards (written once): the
// sharded-checkpoint path of WeightStore::open — weight_map, shard names (no path escapes),
// tensors listed in the wrong shard or in none.
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"

namespace {

const fuzz::Scratch& folder() {
  static const fuzz::Scratch scratch("safetensors-index");
  static const bool shards = [] {
    const std::vector<float> a(6, 1.0f), b(4, 2.0f);
    const std::vector<int8_t> q(8, 3);
    const std::vector<float> qs(2, 0.5f);
    bool ok = klein::write_safetensors(scratch.dir() / "model-00001-of-00002.safetensors",
                                       {{"a.weight", klein::DType::kF32, {2, 3}, a.data()},
                                        {"q.weight", klein::DType::kI8, {2, 4}, q.data()}})
                  .ok();
    ok = ok && klein::write_safetensors(scratch.dir() / "model-00002-of-00002.safetensors",
                                        {{"b.weight", klein::DType::kF32, {4}, b.data()},
                                         {"q.weight_scale", klein::DType::kF32, {2}, qs.data()}})
                   .ok();
    if (!ok) std::abort();
    return true;
  }();
  (void)shards;
  return scratch;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::Scratch& scratch = folder();
  scratch.write("model.safetensors.index.json", data, size);
  auto src = klein::SafetensorsSource::open(scratch.dir());
  if (!src.ok()) return 0;
  for (const auto& name : (*src)->names()) {
    auto w = (*src)->get(name);
    if (w.ok()) fuzz::consume(w->data, static_cast<size_t>(w->nbytes));
  }
  return 0;
}
