// A small, fast pull parser for JSON text, used to read tokenizer.json / vocab.json.
//
// Why not nlohmann::json: building a DOM of the 11 MB Qwen3 tokenizer.json (151k vocab entries,
// 151k merges) takes 280-430 ms on the 2-core dev machine, over the whole load budget. This cursor
// walks the text once without building a tree; the caller streams the big sections (vocab,
// merges) straight into its own tables and hands small sub-objects (normalizer, pre_tokenizer,
// added_tokens) to nlohmann via their raw text span.
//
// It is strict RFC 8259 JSON (no comments, no trailing commas, no control characters in
// strings, no lone surrogates). Every method returns false on error and records one message,
// which error() turns into "FILE: invalid JSON at line L, column C: WHAT".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace klein::tok {

class JsonCursor {
 public:
  JsonCursor(std::string_view text, std::string file_label)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()),
        file_(std::move(file_label)) {}

  // Skips whitespace and returns the next character without consuming it ('\0' at the end).
  char peek();
  // Consumes `c` (after whitespace) or fails.
  bool expect(char c);

  // Objects: call obj_begin(), then obj_next(first, key, has) in a loop until has == false;
  // after each has == true the cursor stands at the member's value, which the caller must read.
  bool obj_begin() { return expect('{'); }
  bool obj_next(bool& first, std::string& key, bool& has);
  // Arrays: the same protocol without keys.
  bool arr_begin() { return expect('['); }
  bool arr_next(bool& first, bool& has);

  // A string value, escapes decoded to UTF-8.
  bool string(std::string& out);
  // An integer value (no fraction, no exponent) in [lo, hi].
  bool integer(int64_t& out, int64_t lo, int64_t hi);
  // Skips any value, validating it; `span` (if given) receives its raw text.
  bool skip(std::string_view* span = nullptr);
  // True when only whitespace is left.
  bool at_end() { return peek() == '\0' && p_ == end_; }

  // Fails with a message of the caller's choosing at the current position.
  bool fail(std::string what);
  // The recorded error as a format-error Status (call only after a method returned false).
  Status error() const;

 private:
  bool skip_depth(int depth);
  bool number();
  bool literal(std::string_view word);

  const char* begin_;
  const char* p_;
  const char* end_;
  std::string file_;
  std::string what_;
  const char* err_at_ = nullptr;
};

}  // namespace klein::tok
