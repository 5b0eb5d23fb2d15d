// UTF-8 handling, NFC and the Qwen2 pre-tokenizer regex, implemented by hand over code points.
//
// The regex (tokenizer.json pre_tokenizer.pretokenizers[0].pattern.Regex) is
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// HF tokenizers runs it with Oniguruma: matches are found left to right, each at the leftmost
// position, and among the alternatives the first one that matches wins (leftmost-first, with
// backtracking inside an alternative). match_at() below reproduces that alternative by
// alternative, with the backtracking worked out by hand (see the comments there).
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>

#include "pipeline/tokenizer_impl.h"

namespace klein::tok {

const std::string_view kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

// ------------------------------------------------------------------------------------------
// UTF-8

// Length of the well-formed sequence starting at s[i] (and its code point), or, when it is
// ill-formed, 0 with `bad` = the length of its maximal ill-formed prefix (>= 1), per Unicode's
// "U+FFFD substitution of maximal subparts" (what Rust's from_utf8_lossy does).
inline size_t utf8_step(const unsigned char* s, size_t n, size_t i, uint32_t& cp, size_t& bad) {
  unsigned char b = s[i];
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
    cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    cp = b & 0x0F;
    if (b == 0xE0) lo = 0xA0;  // no overlongs
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    cp = b & 0x07;
    if (b == 0xF0) lo = 0x90;  // no overlongs
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= n) {
      bad = k;
      return 0;
    }
    unsigned char c = s[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      bad = k;
      return 0;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  return need + 1;
}

// ------------------------------------------------------------------------------------------
// Character classes used by the regex

enum : uint8_t {
  kL = 1,     // \p{L}: Lu Ll Lt Lm Lo
  kN = 2,     // \p{N}: Nd Nl No
  kS = 4,     // \s: Unicode White_Space (Oniguruma's and Rust regex's \s)
  kCRLF = 8,  // \r or \n
};

// Unicode White_Space (PropList.txt; unchanged since Unicode 6.3, when U+180E left it):
// U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F,
// U+205F, U+3000. Not U+200B (ZERO WIDTH SPACE, a Cf), not U+FEFF, not U+001C..U+001F (which
// Python's str.isspace() would count).
inline bool is_white_space(uint32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  if (c == 0x85 || c == 0xA0 || c == 0x1680 || c == 0x2028 || c == 0x2029 || c == 0x202F ||
      c == 0x205F || c == 0x3000)
    return true;
  return c >= 0x2000 && c <= 0x200A;
}

struct AsciiClasses {
  uint8_t v[128];
  constexpr AsciiClasses() : v() {
    for (int c = 0; c < 128; ++c) {
      uint8_t k = 0;
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k |= kL;
      if (c >= '0' && c <= '9') k |= kN;
      if (c == ' ' || (c >= 0x09 && c <= 0x0D)) k |= kS;
      if (c == '\r' || c == '\n') k |= kCRLF;
      v[c] = k;
    }
  }
};
constexpr AsciiClasses kAscii;

inline uint8_t classify(uint32_t c) {
  if (c < 128) return kAscii.v[c];
  if (is_white_space(c)) return kS;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return kL;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return kN;
    default:
      return 0;
  }
}

// Simple case folding restricted to the letters of the contractions: under (?i), Oniguruma
// (and Rust regex) also match U+017F LATIN SMALL LETTER LONG S for 's'. No other non-ASCII
// code point folds to one of s, t, r, e, v, m, l, d.
inline uint32_t fold(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c == 0x17F) return 's';
  return c;
}

inline bool is_other(uint8_t k) { return (k & (kS | kL | kN)) == 0; }  // [^\s\p{L}\p{N}]

// Length in code points of the regex match starting at i (>= 1), or 0 when no alternative
// matches there (cannot happen: every code point is L, N, White_Space or "other").
size_t match_at(const uint32_t* cp, const uint8_t* cls, size_t n, size_t i) {
  const uint32_t c = cp[i];
  const uint8_t k = cls[i];

  // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d) -- ASCII apostrophe only.
  if (c == '\'' && i + 1 < n) {
    uint32_t c1 = fold(cp[i + 1]);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (i + 2 < n) {
      uint32_t c2 = fold(cp[i + 2]);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
  }

  // 2. [^\r\n\p{L}\p{N}]?\p{L}+ -- the optional char is greedy; if it is taken but no letter
  // follows, backtracking drops it, and then \p{L}+ needs c itself to be a letter, which it is
  // not (the class excludes letters). So: either (prefix, letters...) or (letters...).
  if (!(k & (kL | kN | kCRLF)) && i + 1 < n && (cls[i + 1] & kL)) {
    size_t j = i + 2;
    while (j < n && (cls[j] & kL)) ++j;
    return j - i;
  }
  if (k & kL) {
    size_t j = i + 1;
    while (j < n && (cls[j] & kL)) ++j;
    return j - i;
  }

  // 3. \p{N} -- one digit at a time.
  if (k & kN) return 1;

  // 4. " ?[^\s\p{L}\p{N}]+[\r\n]*" -- an optional literal space (not any \s), a run of
  // "other" chars, then any \r / \n. Without an "other" char after the space, backtracking
  // drops the space and c (a space) is not "other" either, so the alternative fails.
  {
    size_t j = i;
    if (c == ' ' && i + 1 < n && is_other(cls[i + 1])) j = i + 1;
    if (is_other(cls[j])) {
      while (j < n && is_other(cls[j])) ++j;
      while (j < n && (cls[j] & kCRLF)) ++j;
      return j - i;
    }
  }

  if (k & kS) {
    size_t j = i;  // end of the maximal whitespace run
    size_t last_crlf = n;
    while (j < n && (cls[j] & kS)) {
      if (cls[j] & kCRLF) last_crlf = j;
      ++j;
    }
    // 5. \s*[\r\n]+ -- \s* backtracks from the end of the run to the last \r/\n in it; then
    // [\r\n]+ takes exactly that one (everything after it in the run is non-\r\n whitespace).
    if (last_crlf != n) return last_crlf + 1 - i;
    // 6. \s+(?!\S) -- the whole run at the end of the text; otherwise (a non-space follows)
    // back off one char so that the lookahead sees whitespace, if the run is long enough.
    if (j == n) return j - i;
    if (j - i >= 2) return j - 1 - i;
    // 7. \s+ -- a single whitespace char before a non-space.
    return j - i;
  }
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    uint32_t cp;
    size_t bad;
    size_t len = utf8_step(p, n, i, cp, bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  std::string out;
  out.reserve(n + 8);
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    size_t bad = 0;
    size_t len = utf8_step(p, n, i, cp, bad);
    if (len) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      i += bad;
    }
  }
  return out;
}

bool nfc(std::string_view s, std::string& out) {
  // Code points below U+0300 are all NFC_Quick_Check=Yes with combining class 0, and every
  // canonical composition has a second char >= U+0300, so such text is already NFC. Their
  // UTF-8 lead bytes are < 0xCC (U+0300 is CC 80) and continuation bytes are < 0xC0.
  bool simple = true;
  for (unsigned char b : s) {
    if (b >= 0xCC) {
      simple = false;
      break;
    }
  }
  if (simple) return false;
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {  // cannot happen for valid UTF-8; keep the text as it is
    std::free(dst);
    return false;
  }
  out.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
  std::free(dst);
  return true;
}

void pretokenize_qwen2(std::string_view s, std::vector<Span>& pieces) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t nbytes = s.size();
  if (nbytes == 0) return;
  thread_local std::vector<uint32_t> cps, offs;
  thread_local std::vector<uint8_t> cls;
  cps.clear();
  offs.clear();
  cls.clear();
  for (size_t i = 0; i < nbytes;) {
    uint32_t cp;
    size_t bad = 0;
    size_t len = utf8_step(p, nbytes, i, cp, bad);
    if (len == 0) {  // callers pass valid UTF-8; treat a stray byte as an "other" char
      cp = 0xFFFD;
      len = bad;
    }
    cps.push_back(cp);
    offs.push_back(static_cast<uint32_t>(i));
    cls.push_back(classify(cp));
    i += len;
  }
  const size_t n = cps.size();
  offs.push_back(static_cast<uint32_t>(nbytes));
  size_t i = 0;
  while (i < n) {
    size_t len = match_at(cps.data(), cls.data(), n, i);
    if (len == 0) len = 1;  // unreachable (see match_at); an unmatched gap is its own piece
    pieces.push_back(Span{offs[i], offs[i + len]});
    i += len;
  }
  if (cps.capacity() > (size_t{1} << 20)) {  // do not keep a huge input's scratch per thread
    cps = {};
    offs = {};
    cls = {};
  }
}

}  // namespace klein::tok
