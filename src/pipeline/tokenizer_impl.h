// Internals of the Qwen3 tokenizer (see tokenizer.h), shared by tokenizer*.cpp, bpe.cpp and
// pretokenize.cpp. Not part of the public API.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace klein::tok {

// ---------------------------------------------------------------------------------------------
// Unicode helpers and the pre-tokenizer (pretokenize.cpp)

// The only Split regex we implement (Qwen2/Qwen2.5/Qwen3), as it appears in tokenizer.json.
extern const std::string_view kQwen2Pattern;

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Replaces each maximal ill-formed subsequence by U+FFFD, as Rust's String::from_utf8_lossy and
// Python's errors="replace" do.
std::string sanitize_utf8(std::string_view s);
// NFC of valid UTF-8 `s` into `out`. Returns false (and leaves `out` unspecified) when `s` is
// already known to be unchanged by NFC (pure ASCII), so the caller can keep using `s`.
bool nfc(std::string_view s, std::string& out);

// A piece of the input as a byte range [begin, end).
struct Span {
  uint32_t begin, end;
};
// Splits valid UTF-8 `s` with the Qwen2 regex (behavior Isolated): appends one span per match,
// covering all of `s` in order.
void pretokenize_qwen2(std::string_view s, std::vector<Span>& pieces);

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level mapping and BPE (bpe.cpp)

// bytes_to_unicode(): byte -> code point of its printable stand-in.
const std::array<uint16_t, 256>& byte_to_char();
// HF ByteLevel decoder for one token: every char mapped back to its byte; a token with a char
// outside the mapping is taken as its own UTF-8 bytes.
void byte_level_decode_append(std::string_view token, std::string& out);

// `s` made safe for a one-line message: control bytes as \xNN, cut after about max_bytes.
std::string for_message(std::string_view s, size_t max_bytes = 80);

class BpeModel {
 public:
  // Loading: tokens and merges in file order; finalize() resolves the merges to ids.
  void reserve(size_t tokens, size_t merges);
  void add_token(std::string_view text, int32_t id);
  void add_merge(std::string_view left, std::string_view right);
  // `label` names the source file in error messages.
  Status finalize(const std::string& label);

  // Id of a vocab token given as byte-level text, or -1.
  int32_t lookup(std::string_view text) const;
  // BPE over the raw bytes of one pre-token; appends the ids.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;
  // Byte-level text of id, or nullptr when the vocab has no such id.
  const std::string_view* token(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < id_to_text_.size() && id_to_text_[id].data()
               ? &id_to_text_[id]
               : nullptr;
  }
  int32_t max_id() const { return static_cast<int32_t>(id_to_text_.size()) - 1; }
  size_t num_tokens() const { return entries_.size(); }
  size_t num_merges() const { return num_merges_; }

 private:
  struct Entry {
    uint32_t off, len;
    int32_t id;
  };
  // Open-addressing slot of the text -> id table. The first 8 bytes of the text are kept in
  // the slot, so most lookups (tokens are mostly <= 8 bytes) touch one cache line.
  struct TextSlot {
    uint64_t prefix;  // first min(8, len) bytes, zero-padded
    uint32_t hash;
    int32_t id;  // -1 when the slot is free
    uint32_t off, len;
  };
  struct PairSlot {
    uint64_t key;  // (left << 32) | right; kEmpty when free
    uint32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  const PairSlot* find_pair(int32_t a, int32_t b) const;
  // Index of the slot holding `text`, or of the free slot where it would go.
  size_t find_text(std::string_view text, uint64_t prefix, uint32_t hash) const;

  std::string arena_;                  // all token texts back to back
  std::vector<Entry> entries_;         // in file order
  std::vector<TextSlot> slots_;
  size_t slot_mask_ = 0;
  std::vector<uint32_t> merge_text_;   // 4 per merge: left off/len, right off/len in merge_arena_
  std::string merge_arena_;
  size_t num_merges_ = 0;
  std::vector<PairSlot> pairs_;
  size_t pair_mask_ = 0;
  std::vector<std::string_view> id_to_text_;
  std::array<int32_t, 256> byte_id_{};  // id of each single byte's token, -1 when absent
};

// ---------------------------------------------------------------------------------------------
// The tokenizer state behind klein::Tokenizer (tokenizer.cpp, tokenizer_load.cpp)

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool normalized = false;  // matched after normalization instead of in the raw text
  bool special = false;
};

// Leftmost-longest literal matching of the added tokens (what HF does with aho-corasick).
class AddedMatcher {
 public:
  void build(const std::vector<AddedToken>& tokens, bool normalized);
  bool empty() const { return order_.empty(); }
  // Finds the leftmost, then longest, token occurrence in s[from..]. Returns false when none.
  bool find(std::string_view s, size_t from, size_t& pos, size_t& len, int32_t& id) const;

 private:
  struct Item {
    std::string text;
    int32_t id;
  };
  std::vector<Item> order_;  // longest first
  std::array<bool, 256> first_{};
};

struct TokenizerImpl {
  BpeModel bpe;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;
  bool nfc = true;
  int32_t pad_id = -1;
  size_t vocab_size = 0;  // one past the largest id, added tokens included
  std::vector<int32_t> added_index;  // id -> index in `added`, -1 when not an added token

  // Cache of BPE results for repeated pre-tokens (HF keeps one too). Bounded; guarded by `mu`
  // because encode() is const and may run on several threads.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxKey = 256;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // Completes the tables once tokens and added tokens are in; `label` names the source file.
  Status finish(const std::string& label);
};

// Loaders (tokenizer_load.cpp).
Status load_tokenizer_json(const std::string& path, TokenizerImpl& impl);
// The same from tokenizer.json's text in memory (the built-in tokenizer); `path` names it.
Status load_tokenizer_json_text(std::string_view text, const std::string& path, TokenizerImpl& impl);
Status load_vocab_merges(const std::string& vocab_path, const std::string& merges_path,
                         const std::string& config_path /* empty when absent */,
                         TokenizerImpl& impl);

// A whole file's bytes, memory-mapped read-only when possible (no copy, no zero-fill of an 11 MB
// buffer), else read into memory. Errors (not found, I/O) name the file.
class FileText {
 public:
  static Result<FileText> open(const std::string& path);
  FileText(FileText&& o) noexcept { *this = std::move(o); }
  FileText& operator=(FileText&& o) noexcept;
  FileText(const FileText&) = delete;
  FileText& operator=(const FileText&) = delete;
  ~FileText();
  std::string_view view() const { return map_ ? std::string_view(static_cast<const char*>(map_), size_) : std::string_view(copy_); }

 private:
  FileText() = default;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::string copy_;
};

}  // namespace klein::tok
