// Model::estimate_memory: what a request of a given shape needs, from the planner behind
// max_memory_gib (api/memory_plan.h) without loading or running anything.
#include <cstdint>
#include <limits>
#include <mutex>

#include "api/guard.h"
#include "api/memory_needs.h"
#include "api/model_impl.h"
#include "pipeline/image_preprocess.h"
#include "pipeline/prompt_encoder.h"

namespace klein {

Result<MemoryEstimate> Model::estimate_memory(const RequestSize& request) const {
  return api::guarded("estimate_memory", [&]() -> Result<MemoryEstimate> {
    KLEIN_RETURN_IF_ERROR(impl_->require_full_model("estimate_memory"));
    std::lock_guard<std::mutex> lock(impl_->mu);
    const Impl& m = *impl_;
    MemoryEstimate e;
    int64_t ref_tokens = 0;
    std::pair<int, int> first;
    for (size_t i = 0; i < request.references.size(); ++i) {
      const auto [w, h] = request.references[i];
      KLEIN_ASSIGN_OR_RETURN(auto g, plan_reference(w, h, "reference " + std::to_string(i + 1)));
      if (i == 0) first = {g.width, g.height};
      ref_tokens += static_cast<int64_t>(g.width / 16) * (g.height / 16);
    }
    if (request.inpaint && request.references.empty())
      return invalid_argument("estimate_memory: inpainting needs the source image's size as the first reference");
    KLEIN_ASSIGN_OR_RETURN(auto geo, m.resolve(request.width, request.height, 0,
                                               request.references.empty() ? nullptr : &first, nullptr));
    KLEIN_ASSIGN_OR_RETURN(auto guide, m.guidance(request.guidance_scale, nullptr));
    e.width = geo.width;
    e.height = geo.height;
    e.image_tokens = static_cast<int64_t>(geo.width / 16) * (geo.height / 16);
    e.reference_tokens = ref_tokens;
    e.guidance = guide.cfg;
    std::optional<api::WeightSizes> measured;
    if (!m.sizes) {
      KLEIN_ASSIGN_OR_RETURN(measured, api::measure_weights(m.te_spec, kKleinTextLayersNeeded, m.dit_spec, m.vae_spec,
                                                            {m.options.loras, m.options.lora_mode,
                                                             m.options.precision == Precision::kFp32}));
    }
    const api::MemoryNeeds n =
        m.needs_for(m.sizes ? *m.sizes : *measured, e.width, e.height, ref_tokens, false, guide.cfg, request.inpaint);
    KLEIN_ASSIGN_OR_RETURN(auto fast, api::plan_memory(n, std::numeric_limits<uint64_t>::max()));
    e.resident_bytes = fast.peak();
    e.resident_plan = fast.summary();
    // The smallest budget that plans: plan_memory is monotone in the budget (a plan under B is a
    // plan under any larger one), so bisect between nothing and the fastest plan's peak.
    uint64_t lo = 0, hi = e.resident_bytes;
    while (hi - lo > (uint64_t{1} << 20)) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (api::plan_memory(n, mid).ok()) hi = mid;
      else lo = mid;
    }
    KLEIN_ASSIGN_OR_RETURN(auto lean, api::plan_memory(n, hi));
    e.minimum_bytes = hi;
    e.minimum_plan = lean.summary();
    return e;
  });
}

}  // namespace klein
