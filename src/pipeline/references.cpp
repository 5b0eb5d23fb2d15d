#include "pipeline/references.h"

#include <cstring>

#include "io/image_reader.h"
#include "pipeline/image_preprocess.h"
#include "pipeline/latents.h"

namespace klein {

Result<std::vector<PreparedReference>> prepare_references(const std::vector<std::string>& paths) {
  std::vector<PreparedReference> out;
  for (const auto& p : paths) {
    KLEIN_ASSIGN_OR_RETURN(auto img, read_image(p));
    KLEIN_ASSIGN_OR_RETURN(Tensor t, preprocess_reference(img, p));
    out.push_back({p, std::move(t)});
  }
  return out;
}

Result<ReferenceTokens> encode_references(const Flux2Vae& vae, const std::vector<PreparedReference>& refs,
                                          const RunContext& ctx) {
  ReferenceTokens r;
  std::vector<Tensor> packed;
  int64_t total = 0, C = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("reference encoding"));
    KLEIN_ASSIGN_OR_RETURN(Tensor mean, vae.encode_mean(refs[i].pixels, ctx));  // [1, 32, H/8, W/8]
    KLEIN_ASSIGN_OR_RETURN(Tensor z, patchify(mean));                          // [1, 128, H/16, W/16]
    KLEIN_RETURN_IF_ERROR(normalize_latents(z, vae.latent_stats()));
    C = z.dim(1);
    const int64_t h = z.dim(2), w = z.dim(3), n = h * w;
    Tensor t = pack_latents(z);  // [n, C]
    const Flux2Ids ids = flux2_image_ids(static_cast<int>(h), static_cast<int>(w), 10 + 10 * static_cast<int>(i));
    r.ids.insert(r.ids.end(), ids.begin(), ids.end());
    total += n;
    packed.push_back(std::move(t));
  }
  r.tokens = Tensor({total, C});
  int64_t off = 0;
  for (const auto& t : packed) {
    std::memcpy(r.tokens.data() + off * C, t.data(), t.numel() * sizeof(float));
    off += t.dim(0);
  }
  ctx.dump("ref_latents", r.tokens, {1, total, C});
  return r;
}

}  // namespace klein
