#include "pipeline/prompt_encoder.h"

#include "backend/transfer.h"

namespace klein {

Result<PromptEncoding> encode_prompt(const Tokenizer& tok, const Qwen3Encoder& enc, const std::string& prompt,
                                     const RunContext& ctx, int max_length) {
  if (max_length <= 0) return invalid_argument("max sequence length must be positive");
  ctx.report("tokenize", 0, 1);
  auto padded = tok.encode_padded(Tokenizer::klein_template(prompt), max_length);
  ctx.report("tokenize", 1, 1);
  ctx.report("encode", 0, kKleinTextLayersNeeded);
  KLEIN_ASSIGN_OR_RETURN(Tensor dev, enc.encode(padded.ids, padded.mask, kKleinTextTaps, ctx));
  KLEIN_ASSIGN_OR_RETURN(Tensor emb, to_host(ctx.be(), std::move(dev)));  // the API hands out host arrays
  KLEIN_RETURN_IF_ERROR(emb.reshape({1, emb.dim(0), emb.dim(1)}));
  ctx.dump("prompt_embeds", emb);
  PromptEncoding r;
  r.embeds = std::move(emb);
  r.ids = std::move(padded.ids);
  r.mask = std::move(padded.mask);
  r.num_real_tokens = padded.num_real;
  r.untruncated_length = padded.untruncated_length;
  return r;
}

}  // namespace klein
