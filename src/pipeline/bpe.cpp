// Byte-level BPE: vocab and merge tables, and the merge loop of HF tokenizers' BPE model.
//
// The vocab is byte-level text (GPT-2 bytes_to_unicode), but nothing at encode time needs text:
// each input byte starts as the id of its single-char token, and merges are looked up by the
// pair of ids. So the string -> id table is only used while loading (to resolve merges).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include "pipeline/tokenizer_impl.h"

namespace klein::tok {
namespace {

struct ByteTables {
  std::array<uint16_t, 256> to_char{};
  std::array<int16_t, 324> from_char{};  // code point -> byte, -1 when not a stand-in
  ByteTables() {
    // bytes_to_unicode(): printable bytes stand for themselves, the other 68 map in order to
    // U+0100.. (so every stand-in is < U+0144).
    from_char.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint16_t c = printable ? static_cast<uint16_t>(b) : static_cast<uint16_t>(256 + next++);
      to_char[b] = c;
      from_char[c] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

// First min(8, size) bytes of s as a zero-padded little-endian word.
inline uint64_t prefix_of(std::string_view s) {
  uint64_t w = 0;
  std::memcpy(&w, s.data(), std::min<size_t>(8, s.size()));
  return w;
}

inline uint64_t mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

inline uint32_t hash_text(std::string_view s, uint64_t prefix) {
  uint64_t h = mix(prefix ^ (s.size() * 0x9E3779B97F4A7C15ull));
  for (size_t i = 8; i < s.size(); i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
    h = mix(h ^ w) + i;
  }
  return static_cast<uint32_t>(h);
}

inline size_t hash_pair(uint64_t key) {
  key ^= key >> 29;
  key *= 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(key ^ (key >> 32));
}

size_t table_size(size_t n) {
  size_t cap = 16;
  while (cap < n + n / 2) cap <<= 1;  // load factor <= 2/3
  return cap;
}

}  // namespace

const std::array<uint16_t, 256>& byte_to_char() { return tables().to_char; }

std::string for_message(std::string_view s, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  for (; i < s.size() && out.size() < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (i < s.size()) {
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    out += "...";
  }
  return out;
}

void byte_level_decode_append(std::string_view token, std::string& out) {
  const auto& from = tables().from_char;
  const size_t start = out.size();
  size_t i = 0;
  while (i < token.size()) {
    unsigned char b = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    size_t len;
    if (b < 0x80) {
      cp = b;
      len = 1;
    } else if ((b & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((b & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      cp = 0xFFFFFFFF;  // >= 3-byte chars are never stand-ins
      len = 1;
    }
    if (cp >= from.size() || from[cp] < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(from[cp]));
    i += len;
  }
}

void BpeModel::reserve(size_t tokens, size_t merges) {
  entries_.reserve(tokens);
  arena_.reserve(tokens * 8);
  merge_text_.reserve(merges * 4);
  merge_arena_.reserve(merges * 10);
}

void BpeModel::add_token(std::string_view text, int32_t id) {
  entries_.push_back(Entry{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(text.size()), id});
  arena_.append(text);
}

void BpeModel::add_merge(std::string_view left, std::string_view right) {
  merge_text_.push_back(static_cast<uint32_t>(merge_arena_.size()));
  merge_text_.push_back(static_cast<uint32_t>(left.size()));
  merge_arena_.append(left);
  merge_text_.push_back(static_cast<uint32_t>(merge_arena_.size()));
  merge_text_.push_back(static_cast<uint32_t>(right.size()));
  merge_arena_.append(right);
  ++num_merges_;
}

size_t BpeModel::find_text(std::string_view text, uint64_t prefix, uint32_t hash) const {
  for (size_t h = hash & slot_mask_;; h = (h + 1) & slot_mask_) {
    const TextSlot& s = slots_[h];
    if (s.id < 0) return h;
    if (s.hash == hash && s.prefix == prefix && s.len == text.size() &&
        (s.len <= 8 || std::memcmp(arena_.data() + s.off + 8, text.data() + 8, s.len - 8) == 0))
      return h;
  }
}

int32_t BpeModel::lookup(std::string_view text) const {
  if (slots_.empty()) return -1;
  const uint64_t prefix = prefix_of(text);
  return slots_[find_text(text, prefix, hash_text(text, prefix))].id;
}

const BpeModel::PairSlot* BpeModel::find_pair(int32_t a, int32_t b) const {
  if (pairs_.empty()) return nullptr;
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  for (size_t h = hash_pair(key) & pair_mask_;; h = (h + 1) & pair_mask_) {
    const PairSlot& s = pairs_[h];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
  }
}

Status BpeModel::finalize(const std::string& label) {
  // The tables are bigger than the caches, so loading is bound by memory latency: each stage
  // works on batches, first computing the hashes and prefetching the slots, then probing.
  constexpr size_t kBatch = 16;
  struct Probe {
    uint64_t prefix;
    uint32_t hash;
  };
  auto probe_of = [this](std::string_view t) {
    Probe p{prefix_of(t), 0};
    p.hash = hash_text(t, p.prefix);
    __builtin_prefetch(&slots_[p.hash & slot_mask_]);
    return p;
  };

  // String -> id. A repeated key keeps its last id (a JSON object read into a map does so too).
  slots_.assign(table_size(entries_.size()), TextSlot{0, 0, -1, 0, 0});
  slot_mask_ = slots_.size() - 1;
  int32_t max_id = -1;
  Probe probes[kBatch * 3];
  for (size_t base = 0; base < entries_.size(); base += kBatch) {
    const size_t n = std::min(kBatch, entries_.size() - base);
    for (size_t k = 0; k < n; ++k) {
      const Entry& en = entries_[base + k];
      probes[k] = probe_of(std::string_view(arena_.data() + en.off, en.len));
    }
    for (size_t k = 0; k < n; ++k) {
      const Entry& en = entries_[base + k];
      const size_t h = find_text(std::string_view(arena_.data() + en.off, en.len), probes[k].prefix, probes[k].hash);
      slots_[h] = TextSlot{probes[k].prefix, probes[k].hash, en.id, en.off, en.len};
      max_id = std::max(max_id, en.id);
    }
  }

  // Id -> text, for decoding.
  id_to_text_.assign(static_cast<size_t>(max_id + 1), std::string_view());
  for (const Entry& en : entries_) id_to_text_[static_cast<size_t>(en.id)] = std::string_view(arena_.data() + en.off, en.len);

  // Merges: rank = position in the list; a repeated pair keeps its last rank (HF collects the
  // list into a map the same way). add_merge() stored left and right back to back, so the
  // merged token's text is the span covering both.
  pairs_.assign(table_size(num_merges_), PairSlot{kEmpty, 0, 0});
  pair_mask_ = pairs_.size() - 1;
  uint64_t keys[kBatch];
  int32_t merged[kBatch];
  for (size_t base = 0; base < num_merges_; base += kBatch) {
    const size_t n = std::min(kBatch, num_merges_ - base);
    auto texts = [&](size_t k, std::string_view& left, std::string_view& right, std::string_view& joined) {
      const uint32_t* m = &merge_text_[(base + k) * 4];
      left = std::string_view(merge_arena_.data() + m[0], m[1]);
      right = std::string_view(merge_arena_.data() + m[2], m[3]);
      joined = std::string_view(merge_arena_.data() + m[0], m[1] + m[3]);
    };
    std::string_view left, right, joined;
    for (size_t k = 0; k < n; ++k) {
      texts(k, left, right, joined);
      probes[3 * k] = probe_of(left);
      probes[3 * k + 1] = probe_of(right);
      probes[3 * k + 2] = probe_of(joined);
    }
    for (size_t k = 0; k < n; ++k) {
      texts(k, left, right, joined);
      const int32_t a = slots_[find_text(left, probes[3 * k].prefix, probes[3 * k].hash)].id;
      const int32_t b = slots_[find_text(right, probes[3 * k + 1].prefix, probes[3 * k + 1].hash)].id;
      const int32_t c = slots_[find_text(joined, probes[3 * k + 2].prefix, probes[3 * k + 2].hash)].id;
      if (a < 0 || b < 0 || c < 0) {
        const std::string_view missing = a < 0 ? left : b < 0 ? right : joined;
        return format_error(label + ": merge " + std::to_string(base + k) + " ('" + for_message(left) + "' '" +
                            for_message(right) + "'): token '" + for_message(missing) + "' is not in the vocab");
      }
      keys[k] = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
      merged[k] = c;
      __builtin_prefetch(&pairs_[hash_pair(keys[k]) & pair_mask_], 1);
    }
    for (size_t k = 0; k < n; ++k) {
      for (size_t h = hash_pair(keys[k]) & pair_mask_;; h = (h + 1) & pair_mask_) {
        PairSlot& slot = pairs_[h];
        if (slot.key == kEmpty || slot.key == keys[k]) {
          slot = PairSlot{keys[k], static_cast<uint32_t>(base + k), merged[k]};
          break;
        }
      }
    }
  }
  merge_text_.clear();
  merge_text_.shrink_to_fit();
  merge_arena_.clear();
  merge_arena_.shrink_to_fit();

  // The starting symbol of each byte. A byte without a token is dropped, as HF's BPE does when
  // there is no unk_token (cannot happen with a complete byte-level vocab).
  const auto& to_char = tables().to_char;
  for (int b = 0; b < 256; ++b) {
    char buf[2];
    uint16_t c = to_char[b];
    std::string_view s;
    if (c < 0x80) {
      buf[0] = static_cast<char>(c);
      s = std::string_view(buf, 1);
    } else {
      buf[0] = static_cast<char>(0xC0 | (c >> 6));
      buf[1] = static_cast<char>(0x80 | (c & 0x3F));
      s = std::string_view(buf, 2);
    }
    byte_id_[static_cast<size_t>(b)] = lookup(s);
  }
  return Status::Ok();
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  // HF tokenizers' Word::merge_all: a min-heap of candidate merges ordered by (rank, position);
  // pop the best, skip it if stale (either symbol already merged away, or the pair there now
  // merges to a different token), merge, and push the new pairs formed with both neighbours.
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  struct Cand {
    uint32_t rank;
    int32_t pos, merged;
  };
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  syms.clear();
  heap.clear();
  for (unsigned char b : bytes) {
    int32_t id = byte_id_[b];
    if (id < 0) continue;
    int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back(Sym{id, i - 1, i + 1, true});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  if (syms.size() == 1) {
    out.push_back(syms[0].id);
    return;
  }
  // Greater-than ordering turns std::*_heap into a min-heap.
  auto worse = [](const Cand& x, const Cand& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) {
    if (const PairSlot* p = find_pair(syms[i].id, syms[i + 1].id))
      heap.push_back(Cand{p->rank, static_cast<int32_t>(i), p->merged});
  }
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Cand top = heap.back();
    heap.pop_back();
    Sym& cur = syms[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t nx = cur.next;
    const PairSlot* p = find_pair(cur.id, syms[static_cast<size_t>(nx)].id);
    if (!p || p->merged != top.merged) continue;
    cur.id = top.merged;
    syms[static_cast<size_t>(nx)].alive = false;
    cur.next = syms[static_cast<size_t>(nx)].next;
    if (cur.next >= 0) syms[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const PairSlot* q = find_pair(syms[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back(Cand{q->rank, cur.prev, q->merged});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    if (cur.next >= 0) {
      if (const PairSlot* q = find_pair(cur.id, syms[static_cast<size_t>(cur.next)].id)) {
        heap.push_back(Cand{q->rank, top.pos, q->merged});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) out.push_back(syms[static_cast<size_t>(i)].id);
  if (syms.capacity() > (size_t{1} << 20)) {  // do not keep a huge input's scratch per thread
    syms = {};
    heap = {};
  }
}

}  // namespace klein::tok
