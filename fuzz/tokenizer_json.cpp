// The input as tokenizer.json: the streamed vocab/merges reader, the checks on normalizer,
// pre-tokenizer, decoder and added tokens, the table building; a tokenizer that loads then
// encodes and decodes a few fixed prompts (added tokens, Unicode, invalid UTF-8).
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "pipeline/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("tokenizer-json");
  const auto path = scratch.write("tokenizer.json", data, size);
  auto tok = klein::Tokenizer::load(path);
  if (!tok.ok()) return 0;
  static const std::string kPrompts[] = {
      "", "hello world", "A cat holding a sign that says hello world",
      "<|im_start|>user\n<|im_end|><|endoftext|>", "e\xcc\x81 \xef\xac\x81 \xe6\x97\xa5\xe6\x9c\xac  \t\n 123",
      std::string("bad \xff\xc0\x80 utf8\0nul", sizeof "bad \xff\xc0\x80 utf8\0nul" - 1)};
  for (const auto& p : kPrompts) {
    auto ids = tok->encode(p);
    (void)tok->decode(ids);
    (void)tok->encode_padded(klein::Tokenizer::klein_template(p), 16);
  }
  (void)tok->pad_id();
  (void)tok->vocab_size();
  return 0;
}
