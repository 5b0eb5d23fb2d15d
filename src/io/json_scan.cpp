#include "io/json_scan.h"

#include <cstdio>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace klein::tok {
namespace {

constexpr int kMaxDepth = 512;  // deeper nesting is rejected rather than recursing unboundedly

inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string describe(const char* p, const char* end) {
  if (p >= end) return "unexpected end of file";
  unsigned char c = static_cast<unsigned char>(*p);
  if (c >= 0x20 && c < 0x7F) return std::string("unexpected character '") + static_cast<char>(c) + "'";
  char buf[48];
  std::snprintf(buf, sizeof buf, "unexpected byte 0x%02X", c);
  return buf;
}

}  // namespace

bool JsonCursor::fail(std::string what) {
  if (err_at_ == nullptr) {
    err_at_ = p_;
    what_ = std::move(what);
  }
  return false;
}

Status JsonCursor::error() const {
  const char* at = err_at_ ? err_at_ : p_;
  int line = 1, col = 1;
  for (const char* q = begin_; q < at && q < end_; ++q) {
    if (*q == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(*q) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return format_error(file_ + ": invalid JSON at line " + std::to_string(line) + ", column " +
                      std::to_string(col) + ": " + (what_.empty() ? "parse error" : what_));
}

char JsonCursor::peek() {
  // Pretty-printed files (tokenizer.json) are about half indentation, so whitespace is skipped
  // 16 bytes at a time where SSE2 is there (always on x86-64).
#if defined(__SSE2__)
  const __m128i sp = _mm_set1_epi8(' '), nl = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r'),
                tab = _mm_set1_epi8('\t');
  while (end_ - p_ >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p_));
    const __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, nl)),
                                    _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, tab)));
    const unsigned other = ~static_cast<unsigned>(_mm_movemask_epi8(ws)) & 0xFFFFu;
    if (other) {
      p_ += __builtin_ctz(other);
      return *p_;
    }
    p_ += 16;
  }
#endif
  while (p_ < end_ && is_ws(*p_)) ++p_;
  return p_ < end_ ? *p_ : '\0';
}

bool JsonCursor::expect(char c) {
  if (peek() != c || p_ == end_) return fail(describe(p_, end_) + ", expected '" + c + "'");
  ++p_;
  return true;
}

bool JsonCursor::obj_next(bool& first, std::string& key, bool& has) {
  char c = peek();
  if (first) {
    first = false;
    if (c == '}') {
      ++p_;
      has = false;
      return true;
    }
  } else {
    if (c == '}') {
      ++p_;
      has = false;
      return true;
    }
    if (c != ',' || p_ == end_) return fail(describe(p_, end_) + ", expected ',' or '}'");
    ++p_;
  }
  if (peek() != '"') return fail(describe(p_, end_) + ", expected a member name");
  if (!string(key)) return false;
  if (!expect(':')) return false;
  has = true;
  return true;
}

bool JsonCursor::arr_next(bool& first, bool& has) {
  char c = peek();
  if (first) {
    first = false;
    if (c == ']') {
      ++p_;
      has = false;
      return true;
    }
  } else {
    if (c == ']') {
      ++p_;
      has = false;
      return true;
    }
    if (c != ',' || p_ == end_) return fail(describe(p_, end_) + ", expected ',' or ']'");
    ++p_;
  }
  if (peek() == ']' || p_ == end_) return fail(describe(p_, end_) + ", expected a value");
  has = true;
  return true;
}

bool JsonCursor::string(std::string& out) {
  if (peek() != '"' || p_ == end_) return fail(describe(p_, end_) + ", expected a string");
  ++p_;
  out.clear();
  for (;;) {
    // Copy the run of plain characters in one go.
    const char* run = p_;
    while (p_ < end_) {
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"' || c == '\\' || c < 0x20) break;
      ++p_;
    }
    out.append(run, p_);
    if (p_ >= end_) return fail("unexpected end of file inside a string");
    char c = *p_;
    if (c == '"') {
      ++p_;
      return true;
    }
    if (c != '\\') return fail("control character inside a string");
    ++p_;
    if (p_ >= end_) return fail("unexpected end of file inside a string");
    char e = *p_++;
    switch (e) {
      case '"': out.push_back('"'); break;
      case '\\': out.push_back('\\'); break;
      case '/': out.push_back('/'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        auto read4 = [&](uint32_t& v) {
          if (end_ - p_ < 4) return false;
          v = 0;
          for (int i = 0; i < 4; ++i) {
            int d = hex_digit(p_[i]);
            if (d < 0) return false;
            v = v * 16 + static_cast<uint32_t>(d);
          }
          p_ += 4;
          return true;
        };
        uint32_t cp;
        if (!read4(cp)) return fail("bad \\u escape");
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo;
          if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return fail("lone high surrogate in \\u escape");
          p_ += 2;
          if (!read4(lo) || lo < 0xDC00 || lo > 0xDFFF) return fail("bad surrogate pair in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        append_utf8(out, cp);
        break;
      }
      default:
        --p_;
        return fail("bad escape in a string");
    }
  }
}

bool JsonCursor::integer(int64_t& out, int64_t lo, int64_t hi) {
  char c = peek();
  const char* start = p_;
  bool neg = false;
  if (c == '-') {
    neg = true;
    ++p_;
  }
  if (p_ >= end_ || *p_ < '0' || *p_ > '9') {
    p_ = start;
    return fail(describe(p_, end_) + ", expected an integer");
  }
  if (*p_ == '0' && p_ + 1 < end_ && p_[1] >= '0' && p_[1] <= '9') return fail("leading zero in a number");
  int64_t v = 0;
  while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
    if (v > (INT64_MAX - 9) / 10) {
      p_ = start;
      return fail("integer out of range");
    }
    v = v * 10 + (*p_ - '0');
    ++p_;
  }
  if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) {
    p_ = start;
    return fail("expected an integer, got a fractional number");
  }
  if (neg) v = -v;
  if (v < lo || v > hi) {
    p_ = start;
    return fail("integer " + std::to_string(v) + " out of range [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  }
  out = v;
  return true;
}

bool JsonCursor::number() {
  if (p_ < end_ && *p_ == '-') ++p_;
  if (p_ >= end_) return fail("unexpected end of file in a number");
  if (*p_ == '0') {
    ++p_;
  } else if (*p_ >= '1' && *p_ <= '9') {
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
  } else {
    return fail(describe(p_, end_) + ", expected a digit");
  }
  if (p_ < end_ && *p_ == '.') {
    ++p_;
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail("expected a digit after '.'");
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
  }
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    ++p_;
    if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail("expected a digit in the exponent");
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
  }
  return true;
}

bool JsonCursor::literal(std::string_view word) {
  if (static_cast<size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0)
    return fail(describe(p_, end_) + ", expected a value");
  p_ += word.size();
  return true;
}

bool JsonCursor::skip(std::string_view* span) {
  peek();
  const char* start = p_;
  if (!skip_depth(0)) return false;
  if (span) *span = std::string_view(start, static_cast<size_t>(p_ - start));
  return true;
}

bool JsonCursor::skip_depth(int depth) {
  if (depth > kMaxDepth) return fail("nesting too deep");
  char c = peek();
  if (p_ >= end_) return fail("unexpected end of file, expected a value");
  switch (c) {
    case '{': {
      ++p_;
      bool first = true, has = false;
      std::string key;
      for (;;) {
        if (!obj_next(first, key, has)) return false;
        if (!has) return true;
        if (!skip_depth(depth + 1)) return false;
      }
    }
    case '[': {
      ++p_;
      bool first = true, has = false;
      for (;;) {
        if (!arr_next(first, has)) return false;
        if (!has) return true;
        if (!skip_depth(depth + 1)) return false;
      }
    }
    case '"': {
      // Validate without keeping the text.
      ++p_;
      for (;;) {
        while (p_ < end_) {
          unsigned char b = static_cast<unsigned char>(*p_);
          if (b == '"' || b == '\\' || b < 0x20) break;
          ++p_;
        }
        if (p_ >= end_) return fail("unexpected end of file inside a string");
        if (*p_ == '"') {
          ++p_;
          return true;
        }
        if (*p_ != '\\') return fail("control character inside a string");
        ++p_;
        if (p_ >= end_) return fail("unexpected end of file inside a string");
        char e = *p_++;
        if (e == 'u') {
          if (end_ - p_ < 4) return fail("bad \\u escape");
          for (int i = 0; i < 4; ++i)
            if (hex_digit(p_[i]) < 0) return fail("bad \\u escape");
          p_ += 4;
        } else if (!std::strchr("\"\\/bfnrt", e) || e == '\0') {
          --p_;
          return fail("bad escape in a string");
        }
      }
    }
    case 't': return literal("true");
    case 'f': return literal("false");
    case 'n': return literal("null");
    default:
      if (c == '-' || (c >= '0' && c <= '9')) return number();
      return fail(describe(p_, end_) + ", expected a value");
  }
}

}  // namespace klein::tok
