// The input as a checkpoint's tensor list, one tensor a line: "name" or "name<TAB>d0,d1,...".
// It goes through detection (prefix groups, schemes, families) and every supported part's config
// preset, and each name through every name map, checking the maps' own invariant: whatever
// unmap_name gives for a target maps forward to that target again.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint_detect.h"
#include "io/name_map.h"

namespace {

std::vector<klein::TensorInfo> parse(std::string_view in) {
  std::vector<klein::TensorInfo> out;
  while (!in.empty()) {
    const size_t nl = in.find('\n');
    std::string_view line = in.substr(0, nl);
    in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
    klein::TensorInfo t;
    const size_t tab = line.find('\t');
    t.name = std::string(line.substr(0, tab));
    if (tab != std::string_view::npos) {
      // Dimensions of up to 12 digits (a leading '-' for a negative one) keep products in range.
      std::string_view dims = line.substr(tab + 1);
      while (!dims.empty() && t.shape.size() < 8) {
        const size_t comma = dims.find(',');
        std::string_view d = dims.substr(0, comma);
        dims = comma == std::string_view::npos ? std::string_view() : dims.substr(comma + 1);
        const bool neg = !d.empty() && d[0] == '-';
        if (neg) d.remove_prefix(1);
        int64_t v = 0;
        for (size_t k = 0; k < d.size() && k < 12; ++k)
          if (d[k] >= '0' && d[k] <= '9') v = v * 10 + (d[k] - '0');
        t.shape.push_back(neg ? -v : v);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

void check_inverse(const klein::NameMap& map, const std::string& name) {
  for (const klein::MappedName& m : klein::map_name(map, name)) {
    auto back = klein::unmap_name(map, m.target);
    if (!back) std::abort();  // a target the map produces must have a source
    bool found = false;
    for (const klein::MappedName& f : klein::map_name(map, back->source)) found |= f.target == m.target;
    if (!found) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<klein::TensorInfo> tensors = parse({reinterpret_cast<const char*>(data), size});
  auto info = klein::detect_checkpoint(tensors, "fuzz.safetensors");
  if (info.ok())
    for (const klein::CheckpointPart& p : info->parts)
      if (p.supported()) (void)klein::preset_config(p, "fuzz.safetensors");
  for (const char* name : {"bfl_flux2_dit", "ldm_flux2_vae", "hf_qwen3_single_file", "mflux_flux2_dit",
                           "mflux_flux2_vae", "mflux_qwen3"}) {
    const klein::NameMap* map = klein::name_map_by_name(name);
    if (!map) std::abort();
    (void)klein::map_tensor_infos(*map, tensors, "fuzz.safetensors");
    for (const klein::TensorInfo& t : tensors) {
      check_inverse(*map, t.name);
      (void)klein::unmap_name(*map, t.name);
    }
  }
  return 0;
}
