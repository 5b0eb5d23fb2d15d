// The FLUX.2 [klein] prompt tokenizer: Qwen3's byte-level BPE (HF `Qwen2TokenizerFast`),
// reproducing HF `tokenizers` id for id.
//
// Pipeline (the HF order; see docs/reference/qwen3-text-encoder.md §3):
//   1. added tokens (<|im_start|>, <think>, ...) are cut out of the raw text first: literal,
//      leftmost-longest, so a prompt that contains "<|im_end|>" gets that control id;
//   2. NFC on the remaining segments (not NFKC: "ﬁ", "½", full-width forms stay);
//   3. the Qwen2 pre-tokenizer regex splits each segment into pre-tokens;
//   4. each pre-token's UTF-8 bytes go through GPT-2 byte-level BPE (lowest merge rank first,
//      leftmost on ties).
// No BOS/EOS are added (Qwen's post-processor adds none).
//
// Input that is not valid UTF-8 is not an error: each ill-formed sequence is read as U+FFFD
// (Python could not even hold such a string; this is what Rust's from_utf8_lossy does).
//
// A Tokenizer is immutable after load() and cheap to copy (copies share the tables); encode()
// and decode() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace klein {

namespace tok {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // `path` is a folder holding tokenizer.json, or (fallback) vocab.json + merges.txt (+
  // tokenizer_config.json for the added tokens, in its "added_tokens_decoder"), or a path
  // directly to a tokenizer.json file.
  //
  // tokenizer.json is authoritative: its normalizer must be NFC (or null), its pre-tokenizer
  // the Qwen2 Split regex + ByteLevel, its model BPE without dropout/affixes; anything else is
  // reported as unsupported rather than tokenized differently from HF. The vocab.json +
  // merges.txt fallback assumes exactly those settings (as the slow Qwen2Tokenizer does); with
  // no tokenizer_config.json it adds <|endoftext|> after the vocab, as Qwen2Tokenizer's
  // defaults do.
  //
  // Errors are one line naming the file: not found (missing folder/file, folder without
  // tokenizer files), I/O, format (invalid or truncated JSON, a merge over unknown tokens, no
  // <|endoftext|> to pad with), unsupported (another normalizer/pre-tokenizer/model).
  static Result<Tokenizer> load(const std::filesystem::path& path);
  // The same from a tokenizer.json's text (`label` names it in errors).
  static Result<Tokenizer> from_json_text(std::string_view text, const std::string& label);
  // The Qwen3 tokenizer built into the library (the tokenizer.json of FLUX.2-klein's
  // tokenizer/ folder, embedded at build time), parsed on every call.
  static Result<Tokenizer> builtin();
  // That tokenizer.json's text (to write it out beside a converted model).
  static std::string_view builtin_json();

  // Raw text -> ids; no chat template, no truncation, no padding. "" gives no ids.
  std::vector<int32_t> encode(std::string_view text) const;

  struct Padded {
    std::vector<int32_t> ids;   // exactly max_length ids
    std::vector<int32_t> mask;  // 1 for the num_real real ids, then 0 on padding
    int num_real = 0;            // min(untruncated_length, max_length)
    int untruncated_length = 0;  // length of encode(text) before truncation
  };
  // encode(text), truncated on the right to max_length and padded on the right with pad_id(),
  // as transformers' tokenizer(text, padding="max_length", truncation=True, max_length=N) does
  // for Qwen (right padding side, no special tokens added). A negative max_length counts as 0.
  // Apply klein_template() first for the klein text-encoder input.
  Padded encode_padded(std::string_view text, int max_length) const;

  // The Qwen3 chat template as diffusers' Flux2KleinPipeline renders it for one user message
  // (add_generation_prompt=True, enable_thinking=False); the prompt goes in verbatim:
  // "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
  static std::string klein_template(std::string_view prompt);

  // Id of <|endoftext|> (151643 for Qwen3), the pad token of Qwen2TokenizerFast.
  int32_t pad_id() const;

  // Ids -> text with HF's ByteLevel decoder (added tokens appear as their text; ids the
  // tokenizer does not know are skipped; bytes that do not form valid UTF-8 become U+FFFD).
  // For debugging and round trips: decode(encode(t)) == NFC(t).
  std::string decode(const std::vector<int32_t>& ids) const;

  // One past the largest id, added tokens included (151669 for Qwen3; the text encoder's
  // embedding has 151936 rows, the rest unused).
  size_t vocab_size() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;

  std::shared_ptr<const tok::TokenizerImpl> impl_;
};

}  // namespace klein
