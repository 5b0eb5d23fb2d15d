// klein::Tokenizer: the encode/decode pipeline (loading is in tokenizer_load.cpp).
#include "pipeline/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "pipeline/tokenizer_impl.h"

namespace klein {
namespace tok {

void AddedMatcher::build(const std::vector<AddedToken>& tokens, bool normalized) {
  order_.clear();
  first_.fill(false);
  for (const AddedToken& t : tokens) {
    if (t.normalized != normalized || t.content.empty()) continue;
    std::string text = t.content;
    // HF matches normalized added tokens against normalized text, with their content
    // normalized the same way.
    std::string n;
    if (normalized && nfc(text, n)) text = std::move(n);
    order_.push_back(Item{std::move(text), t.id});
  }
  // Longest first, so the first hit at a position is the longest one there. Equal texts keep
  // the order of the file (the first one wins).
  std::stable_sort(order_.begin(), order_.end(),
                   [](const Item& a, const Item& b) { return a.text.size() > b.text.size(); });
  for (const Item& it : order_) first_[static_cast<unsigned char>(it.text[0])] = true;
}

bool AddedMatcher::find(std::string_view s, size_t from, size_t& pos, size_t& len, int32_t& id) const {
  if (order_.empty()) return false;
  for (size_t i = from; i < s.size(); ++i) {
    if (!first_[static_cast<unsigned char>(s[i])]) continue;
    const size_t left = s.size() - i;
    for (const Item& it : order_) {
      if (it.text.size() <= left && std::memcmp(s.data() + i, it.text.data(), it.text.size()) == 0) {
        pos = i;
        len = it.text.size();
        id = it.id;
        return true;
      }
    }
  }
  return false;
}

Status TokenizerImpl::finish(const std::string& label) {
  int32_t max_id = bpe.max_id();
  for (const AddedToken& t : added) {
    if (t.id < 0) return format_error(label + ": added token '" + for_message(t.content) + "' has a negative id");
    max_id = std::max(max_id, t.id);
  }
  vocab_size = static_cast<size_t>(max_id + 1);
  added_index.assign(vocab_size, -1);
  for (size_t i = 0; i < added.size(); ++i) added_index[static_cast<size_t>(added[i].id)] = static_cast<int32_t>(i);
  raw_matcher.build(added, /*normalized=*/false);
  normalized_matcher.build(added, /*normalized=*/true);

  pad_id = -1;
  for (const AddedToken& t : added)
    if (t.content == "<|endoftext|>") pad_id = t.id;
  if (pad_id < 0) pad_id = bpe.lookup("<|endoftext|>");
  if (pad_id < 0) return format_error(label + ": no <|endoftext|> token (Qwen's pad token)");
  return Status::Ok();
}

namespace {

// Pre-tokenize one normalized segment (no added tokens in it) and BPE each piece.
void encode_plain(const TokenizerImpl& impl, std::string_view text, std::vector<int32_t>& out) {
  std::vector<Span> pieces;
  pieces.reserve(text.size() / 3 + 4);
  pretokenize_qwen2(text, pieces);
  for (const Span& sp : pieces) {
    std::string_view piece = text.substr(sp.begin, sp.end - sp.begin);
    if (piece.size() <= 1 || piece.size() > TokenizerImpl::kCacheMaxKey) {
      impl.bpe.encode_word(piece, out);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(impl.mu);
      auto it = impl.cache.find(std::string(piece));
      if (it != impl.cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const size_t start = out.size();
    impl.bpe.encode_word(piece, out);
    std::lock_guard<std::mutex> lock(impl.mu);
    // Like HF's cache, stop adding once full (the cache only speeds up repeats).
    if (impl.cache.size() < TokenizerImpl::kCacheCapacity)
      impl.cache.emplace(std::string(piece), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
  }
}

}  // namespace
}  // namespace tok

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  const tok::TokenizerImpl& impl = *impl_;
  std::string normalized;
  if (impl.nfc && tok::nfc(text, normalized)) text = normalized;
  if (impl.normalized_matcher.empty()) {
    tok::encode_plain(impl, text, out);
    return;
  }
  size_t pos = 0, mpos = 0, mlen = 0;
  int32_t id = -1;
  while (pos < text.size()) {
    if (!impl.normalized_matcher.find(text, pos, mpos, mlen, id)) {
      tok::encode_plain(impl, text.substr(pos), out);
      return;
    }
    if (mpos > pos) tok::encode_plain(impl, text.substr(pos, mpos - pos), out);
    out.push_back(id);
    pos = mpos + mlen;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  if (!impl_ || text.empty()) return out;
  out.reserve(text.size() / 3 + 4);
  std::string fixed;
  if (!tok::is_valid_utf8(text)) {
    fixed = tok::sanitize_utf8(text);
    text = fixed;
  }
  const tok::TokenizerImpl& impl = *impl_;
  size_t pos = 0, mpos = 0, mlen = 0;
  int32_t id = -1;
  while (pos < text.size()) {
    if (!impl.raw_matcher.find(text, pos, mpos, mlen, id)) {
      encode_segment(text.substr(pos), out);
      break;
    }
    if (mpos > pos) encode_segment(text.substr(pos, mpos - pos), out);
    out.push_back(id);
    pos = mpos + mlen;
  }
  return out;
}

Tokenizer::Padded Tokenizer::encode_padded(std::string_view text, int max_length) const {
  Padded p;
  const size_t max_len = static_cast<size_t>(std::max(max_length, 0));
  p.ids = encode(text);
  p.untruncated_length = static_cast<int>(p.ids.size());
  const size_t real = std::min(p.ids.size(), max_len);
  p.num_real = static_cast<int>(real);
  p.ids.resize(real);
  p.ids.resize(max_len, pad_id());
  p.mask.assign(real, 1);
  p.mask.resize(max_len, 0);
  return p;
}

std::string Tokenizer::klein_template(std::string_view prompt) {
  std::string s = "<|im_start|>user\n";
  s.append(prompt);
  s.append("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  return s;
}

int32_t Tokenizer::pad_id() const { return impl_ ? impl_->pad_id : -1; }

size_t Tokenizer::vocab_size() const { return impl_ ? impl_->vocab_size : 0; }

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  if (!impl_) return bytes;
  const tok::TokenizerImpl& impl = *impl_;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl.vocab_size) continue;
    // HF looks an id up among the added tokens first, then in the model's vocab, and runs the
    // ByteLevel decoder over all of them.
    int32_t a = impl.added_index[static_cast<size_t>(id)];
    if (a >= 0) {
      tok::byte_level_decode_append(impl.added[static_cast<size_t>(a)].content, bytes);
    } else if (const std::string_view* t = impl.bpe.token(id)) {
      tok::byte_level_decode_append(*t, bytes);
    }
  }
  if (!tok::is_valid_utf8(bytes)) return tok::sanitize_utf8(bytes);
  return bytes;
}

}  // namespace klein
