// The input as a prompt for the real Qwen3 tokenizer (tests/data/tiny/tokenizer, loaded once):
// added-token cutting, NFC, the Qwen2 pre-tokenizer, byte-level BPE and its cache, the klein
// template with padding, decoding. Also checks the documented round trip
// decode(encode(t)) == NFC(t) for valid UTF-8.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "pipeline/tokenizer.h"
#include "pipeline/tokenizer_impl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const klein::Tokenizer tok = [] {
    auto t = klein::Tokenizer::load(KLEIN_SOURCE_DIR "/tests/data/tiny/tokenizer");
    if (!t.ok()) {
      std::fprintf(stderr, "cannot load the tokenizer: %s\n", t.status().message().c_str());
      std::abort();
    }
    return std::move(*t);
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto ids = tok.encode(text);
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= tok.vocab_size()) std::abort();
  const auto padded = tok.encode_padded(klein::Tokenizer::klein_template(text), 64);
  if (padded.ids.size() != 64 || padded.mask.size() != 64) std::abort();
  const std::string back = tok.decode(ids);
  if (klein::tok::is_valid_utf8(text)) {
    std::string normalized;
    const std::string_view want = klein::tok::nfc(text, normalized) ? std::string_view(normalized) : text;
    if (back != want) {
      std::fprintf(stderr, "round trip differs: decode(encode(t)) != NFC(t)\n");
      std::abort();
    }
  }
  return 0;
}
