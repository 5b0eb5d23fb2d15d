#include "pipeline/references.h"

#include <cstring>

#include "backend/transfer.h"
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

Result<std::vector<Tensor>> encode_reference_latents(const Flux2Vae& vae, const std::vector<PreparedReference>& refs,
                                                     const RunContext& ctx, const VaeTiling& tiling) {
  std::vector<Tensor> out;
  const int n = static_cast<int>(refs.size());
  ctx.report("vae encode", 0, n);
  for (int i = 0; i < n; ++i) {
    KLEIN_RETURN_IF_ERROR(ctx.check_cancel("reference encoding"));
    KLEIN_ASSIGN_OR_RETURN(Tensor dev, vae.encode_mean(refs[i].pixels, ctx, tiling));  // [1, 32, H/8, W/8]
    KLEIN_ASSIGN_OR_RETURN(Tensor mean, to_host(ctx.be(), std::move(dev)));
    // A non-finite latent comes from a non-finite weight: name it here, not as "NaN image tokens" later.
    if (!all_finite(mean.data(), mean.numel())) return vae.non_finite_status();
    KLEIN_ASSIGN_OR_RETURN(Tensor z, patchify(mean));                          // [1, 128, H/16, W/16]
    KLEIN_RETURN_IF_ERROR(normalize_latents(z, vae.latent_stats()));
    out.push_back(std::move(z));
    ctx.report("vae encode", i + 1, n);
  }
  return out;
}

Result<ReferenceTokens> pack_reference_tokens(const std::vector<Tensor>& latents, const RunContext& ctx) {
  ReferenceTokens r;
  if (latents.empty()) return r;
  std::vector<Tensor> packed;
  int64_t total = 0;
  const int64_t C = latents[0].dim(1);
  for (size_t i = 0; i < latents.size(); ++i) {
    const Tensor& z = latents[i];
    if (z.shape().size() != 4 || z.dim(0) != 1 || z.dim(1) != C)
      return invalid_argument("reference latent " + std::to_string(i + 1) + " has shape " + shape_str(z.shape()) +
                              ", expected [1, " + std::to_string(C) + ", h, w]");
    const int64_t h = z.dim(2), w = z.dim(3);
    Tensor t = pack_latents(z);  // [h*w, C]
    const Flux2Ids ids = flux2_image_ids(static_cast<int>(h), static_cast<int>(w), 10 + 10 * static_cast<int>(i));
    r.ids.insert(r.ids.end(), ids.begin(), ids.end());
    total += h * w;
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

Result<ReferenceTokens> encode_references(const Flux2Vae& vae, const std::vector<PreparedReference>& refs,
                                          const RunContext& ctx) {
  KLEIN_ASSIGN_OR_RETURN(auto latents, encode_reference_latents(vae, refs, ctx));
  return pack_reference_tokens(latents, ctx);
}

}  // namespace klein
