// The Qwen3 tokenizer against HF tokenizers' output (tests/data/tokenizer/*.json, produced with
// the same tokenizer.json), plus the vocab.json + merges.txt path, decoding and bad input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "pipeline/tokenizer.h"
#include "testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, std::string_view data) {
  std::ofstream f(p, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// The real Qwen3 tokenizer.json, shipped with the tiny model (KLEIN_TOKENIZER_DIR is only a
// fallback for a checkout that lacks it).
fs::path tokenizer_dir() {
  const fs::path shipped = testing::data_dir() / "tiny" / "tokenizer";
  if (fs::exists(shipped / "tokenizer.json")) return shipped;
  if (const char* env = std::getenv("KLEIN_TOKENIZER_DIR")) return env;
  return shipped;
}

const Tokenizer& qwen() {
  static const Tokenizer* tok = [] {
    auto r = Tokenizer::load(tokenizer_dir());
    if (!r.ok()) {
      ADD_FAILURE() << "cannot load the Qwen3 tokenizer from " << tokenizer_dir() << ": "
                    << r.status().to_string();
      std::abort();
    }
    return new Tokenizer(std::move(r).value());
  }();
  return *tok;
}

json load_fixture(const char* name) {
  return json::parse(slurp(testing::data_dir() / "tokenizer" / name));
}

std::string show(std::string_view s) {
  std::string out = json(std::string(s)).dump();  // escaped, ASCII-safe enough for a log
  return out.size() > 120 ? out.substr(0, 117) + "..." : out;
}

std::string first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream os;
  os << "got " << got.size() << " ids, want " << want.size() << "; first difference at index " << i;
  if (i < got.size()) os << ": got " << got[i];
  if (i < want.size()) os << (i < got.size() ? ", want " : ": want ") << want[i];
  return os.str();
}

// Runs every raw-encode case of public.json through `tok`; returns the number that match.
int check_public_cases(const Tokenizer& tok, const std::string& which) {
  const json cases = load_fixture("public.json");
  int pass = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"];
    const std::vector<int32_t> want = cases[i]["ids"];
    const std::vector<int32_t> got = tok.encode(text);
    if (got == want) {
      ++pass;
    } else {
      ADD_FAILURE() << which << ": public.json case " << i << " (" << cases[i].value("note", "") << ")\n  text "
                    << show(text) << "\n  " << first_difference(got, want);
    }
  }
  return pass;
}

TEST(Tokenizer, LoadsQwen3) {
  const Tokenizer& tok = qwen();
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_EQ(tok.pad_id(), 151643);
}

TEST(Tokenizer, PublicFixtureRawEncode) {
  const json cases = load_fixture("public.json");
  ASSERT_GE(cases.size(), 40u);
  const int pass = check_public_cases(qwen(), "tokenizer.json");
  std::printf("public.json: %d/%zu cases byte-exact\n", pass, cases.size());
  EXPECT_EQ(pass, static_cast<int>(cases.size()));
}

TEST(Tokenizer, PaddedFixtureTemplatedEncode) {
  const json cases = load_fixture("padded_512.json");
  ASSERT_GE(cases.size(), 3u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    SCOPED_TRACE("padded_512.json case " + std::to_string(i) + " (" + c.value("note", "") + ")");
    const std::string prompt = c["prompt"];
    const std::string text = Tokenizer::klein_template(prompt);
    EXPECT_EQ(text, c["text"].get<std::string>());
    const Tokenizer::Padded p = qwen().encode_padded(text, c["max_length"].get<int>());
    const std::vector<int32_t> want_ids = c["input_ids"], want_mask = c["attention_mask"];
    EXPECT_TRUE(p.ids == want_ids) << first_difference(p.ids, want_ids);
    EXPECT_TRUE(p.mask == want_mask) << first_difference(p.mask, want_mask);
    EXPECT_EQ(p.num_real, c["num_real_tokens"].get<int>());
    EXPECT_EQ(p.untruncated_length, c["untruncated_length"].get<int>());
  }
}

TEST(Tokenizer, KnownIds) {
  const Tokenizer& tok = qwen();
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok.encode(" Hello world"), (std::vector<int32_t>{21927, 1879}));
  EXPECT_TRUE(tok.encode("").empty());
  // The empty prompt in the template (CFG's negative prompt): 12 real tokens.
  EXPECT_EQ(tok.encode(Tokenizer::klein_template("")),
            (std::vector<int32_t>{151644, 872, 198, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271}));
}

// Unicode corners beyond the fixtures; ids from HF tokenizers 0.23.3 on the same tokenizer.json.
// The texts are JSON string literals (so control characters can be written as escapes).
TEST(Tokenizer, UnicodeCorners) {
  const struct {
    const char* what;
    const char* json_text;
    std::vector<int32_t> ids;
  } cases[] = {
      {"U+017F long s is 's' under (?i) in the contraction", R"("a'\u017fb")", {64, 6, 144815, 65}},
      {"U+2028 / U+0085 are \\s but may prefix a letter run", R"("x\u2028y\u0085z")", {87, 378, 101, 88, 126, 227, 89}},
      {"NBSP and ideographic space are \\s", R"("a \u00a0b\u3000\u3000c")", {64, 220, 4102, 65, 22441, 22441, 66}},
      {"titlecase letter, letter numbers, No", R"("\u01c5emal \u216b\u2160 \u00bd")",
       {131, 227, 336, 278, 220, 70467, 104, 70467, 254, 220, 26062}},
      {"VT/FF are \\s, U+001C..U+001F are not", R"("\u000b\f\u001c\u001f x")", {199, 200, 216, 219, 856}},
      {"NFC with a second combining mark", R"("e\u0301\u0301 A\u030a")", {963, 53839, 79252}},
      {"broken special token before a real one", R"("<|im_start|<|im_start|>>")", {27, 91, 318, 4906, 91, 151644, 29}},
      {"CRLF runs and trailing space runs", R"("\r\n\r\n  \n x")", {871, 2303, 856}},
      {"mixed-case contractions, tab before one", R"("you'RE we'Ll  \t'd")", {9330, 94153, 582, 91426, 75, 256, 197, 4172}},
  };
  for (const auto& c : cases) {
    const std::string text = json::parse(c.json_text).get<std::string>();
    EXPECT_EQ(qwen().encode(text), c.ids) << c.what;
  }
}

TEST(Tokenizer, PaddingEdgeCases) {
  const Tokenizer& tok = qwen();
  const std::vector<int32_t> ids = tok.encode("A cat holding a sign");
  ASSERT_EQ(ids.size(), 5u);
  auto p = tok.encode_padded("A cat holding a sign", 3);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{ids[0], ids[1], ids[2]}));
  EXPECT_EQ(p.mask, (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(p.num_real, 3);
  EXPECT_EQ(p.untruncated_length, 5);
  p = tok.encode_padded("A cat holding a sign", 7);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{ids[0], ids[1], ids[2], ids[3], ids[4], 151643, 151643}));
  EXPECT_EQ(p.mask, (std::vector<int32_t>{1, 1, 1, 1, 1, 0, 0}));
  p = tok.encode_padded("A cat", 0);
  EXPECT_TRUE(p.ids.empty() && p.mask.empty());
  EXPECT_EQ(p.untruncated_length, 2);
  p = tok.encode_padded("A cat", -4);
  EXPECT_TRUE(p.ids.empty() && p.mask.empty());
  p = tok.encode_padded("", 4);
  EXPECT_EQ(p.ids, (std::vector<int32_t>(4, 151643)));
  EXPECT_EQ(p.mask, (std::vector<int32_t>(4, 0)));
  EXPECT_EQ(p.num_real, 0);
}

TEST(Tokenizer, DecodeRoundTrip) {
  const Tokenizer& tok = qwen();
  const json cases = load_fixture("public.json");
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"];
    const std::string note = cases[i].value("note", "");
    const std::vector<int32_t> ids = tok.encode(text);
    const std::string back = tok.decode(ids);
    // Two cases are not in NFC (decomposed accents, conjoining jamo): they come back composed.
    if (note.find("NFD") != std::string::npos || note.find("jamo") != std::string::npos) {
      EXPECT_NE(back, text) << "case " << i;
      EXPECT_EQ(tok.encode(back), ids) << "case " << i;
      EXPECT_LT(back.size(), text.size()) << "case " << i;
    } else {
      EXPECT_EQ(back, text) << "public.json case " << i << " (" << note << ")";
    }
  }
  EXPECT_EQ(tok.decode({151644, 872, 198}), "<|im_start|>user\n");
  EXPECT_EQ(tok.decode({9707, -1, 99999999, 1879}), "Hello world");  // unknown ids are skipped
  // A lone lead byte of a multi-byte character decodes to U+FFFD rather than invalid UTF-8.
  const std::vector<int32_t> euro = tok.encode("\xE2\x82\xAC");  // U+20AC: several byte tokens
  if (euro.size() > 1) {
    EXPECT_EQ(tok.decode({euro[0]}), "\xEF\xBF\xBD");
  }
}

TEST(Tokenizer, InvalidUtf8IsReplacedNotFatal) {
  const Tokenizer& tok = qwen();
  // Each maximal ill-formed subsequence counts as one U+FFFD.
  EXPECT_EQ(tok.encode("a\xFF" "b"), tok.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(tok.encode("x\xE2\x82"), tok.encode("x\xEF\xBF\xBD"));             // truncated sequence
  EXPECT_EQ(tok.encode("\xED\xA0\x80"), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));  // surrogate
  const std::string nul("a\0b", 3);  // NUL is an ordinary "other" char
  EXPECT_EQ(tok.decode(tok.encode(nul)), nul);
}

TEST(Tokenizer, ConcurrentEncodeAgrees) {
  const Tokenizer& tok = qwen();
  const json cases = load_fixture("public.json");
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (const json& c : cases)
          if (tok.encode(c["text"].get<std::string>()) != c["ids"].get<std::vector<int32_t>>()) ++bad[t];
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

// vocab.json + merges.txt (+ tokenizer_config.json) as HF ships them, derived from
// tokenizer.json unless tests/data/tokenizer_vocab_merges holds them.
fs::path vocab_merges_dir() {
  const fs::path shipped = testing::data_dir() / "tokenizer_vocab_merges";
  if (fs::exists(shipped / "vocab.json")) return shipped;
  static const fs::path made = [] {
    const fs::path dir = testing::make_temp_dir("tok_vm");
    const json tj = json::parse(slurp(tokenizer_dir() / "tokenizer.json"));
    const json& model = tj["model"];
    spit(dir / "vocab.json", model["vocab"].dump());
    std::string merges = "#version: 0.2\n";
    for (const json& m : model["merges"]) {
      merges += m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>();
      merges += '\n';
    }
    spit(dir / "merges.txt", merges);
    json dec = json::object();
    for (const json& t : tj["added_tokens"]) {
      json e = t;
      e.erase("id");
      dec[std::to_string(t["id"].get<int>())] = e;
    }
    spit(dir / "tokenizer_config.json", json{{"added_tokens_decoder", dec}, {"pad_token", "<|endoftext|>"}}.dump(2));
    return dir;
  }();
  return made;
}

TEST(Tokenizer, VocabMergesPathMatchesTokenizerJson) {
  auto r = Tokenizer::load(vocab_merges_dir());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Tokenizer& tok = r.value();
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_EQ(tok.pad_id(), 151643);
  const json cases = load_fixture("public.json");
  const int pass = check_public_cases(tok, "vocab.json+merges.txt");
  std::printf("public.json via vocab.json+merges.txt: %d/%zu cases byte-exact\n", pass, cases.size());
  EXPECT_EQ(pass, static_cast<int>(cases.size()));
  const json padded = load_fixture("padded_512.json");
  for (const json& c : padded) {
    const auto p = tok.encode_padded(Tokenizer::klein_template(c["prompt"].get<std::string>()), 512);
    EXPECT_EQ(p.ids, c["input_ids"].get<std::vector<int32_t>>());
  }
}

TEST(Tokenizer, VocabMergesWithoutConfigAddsEndOfText) {
  const fs::path src = vocab_merges_dir();
  const fs::path dir = testing::make_temp_dir("tok_noconfig");
  fs::copy_file(src / "vocab.json", dir / "vocab.json");
  fs::copy_file(src / "merges.txt", dir / "merges.txt");
  auto r = Tokenizer::load(dir);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->pad_id(), 151643);
  EXPECT_EQ(r->vocab_size(), 151644u);
  EXPECT_EQ(r->encode("Hello world<|endoftext|>"), (std::vector<int32_t>{9707, 1879, 151643}));
  EXPECT_NE(r->encode("<|im_start|>"), (std::vector<int32_t>{151644}));  // not an added token here
}

// ---- A hand-made byte-level tokenizer.json to pin down BPE details and the file formats.

// The 256 byte-level chars as ids 0..255 (in byte order), then `extra` tokens from 256 on.
std::string mini_tokenizer_json(const std::vector<std::string>& extra, const json& merges,
                                const json& normalizer = {{"type", "NFC"}},
                                const std::string& regex = "") {
  json vocab = json::object();
  int next = 0, shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(shifted++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = next++;
  }
  for (const std::string& e : extra) vocab[e] = next++;
  json pre = json::parse(R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":""},
      "behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,
      "use_regex":false}]})");
  pre["pretokenizers"][0]["pattern"]["Regex"] =
      regex.empty() ? std::string(
                          "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
                    : regex;
  json tj = {{"version", "1.0"},
             {"added_tokens", json::array({{{"id", next}, {"content", "<|endoftext|>"}, {"single_word", false},
                                            {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                            {"special", true}}})},
             {"normalizer", normalizer},
             {"pre_tokenizer", pre},
             {"post_processor", {{"type", "ByteLevel"}}},
             {"decoder", {{"type", "ByteLevel"}}},
             {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merges}}}};
  return tj.dump(1);
}

fs::path write_mini(const std::string& tag, const std::string& content) {
  const fs::path dir = testing::make_temp_dir(tag);
  spit(dir / "tokenizer.json", content);
  return dir;
}

TEST(Tokenizer, MiniBpeMergeOrderAndMergeFormats) {
  // ids: a=97, b=98, c=99; 256 "aa", 257 "aaaa", 258 "bc", 259 "ab", 260 "abc"
  const std::vector<std::string> extra = {"aa", "aaaa", "bc", "ab", "abc"};
  const json pairs = json::parse(R"([["a","a"],["aa","aa"],["b","c"],["a","b"],["a","bc"]])");
  const json strings = json::parse(R"(["a a","aa aa","b c","a b","a bc"])");
  auto t1 = Tokenizer::load(write_mini("tok_mini_pairs", mini_tokenizer_json(extra, pairs)) / "tokenizer.json");
  auto t2 = Tokenizer::load(write_mini("tok_mini_strings", mini_tokenizer_json(extra, strings)));
  ASSERT_TRUE(t1.ok()) << t1.status().to_string();
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  for (const char* text : {"aaaa", "aaa", "aaaaa", "abc", "ab", "abcaaaa", "x aaa\nabc", "a<|endoftext|>b"}) {
    EXPECT_EQ(t1->encode(text), t2->encode(text)) << text;
    EXPECT_EQ(t1->decode(t1->encode(text)), text);
  }
  // Ties go to the leftmost pair: "aaa" -> "aa" + "a"; "aaaaa" -> "aaaa" + "a".
  EXPECT_EQ(t1->encode("aaa"), (std::vector<int32_t>{256, 97}));
  EXPECT_EQ(t1->encode("aaaaa"), (std::vector<int32_t>{257, 97}));
  // The lowest rank goes first: "b c" (rank 2) before "a b" (rank 3), then "a bc".
  EXPECT_EQ(t1->encode("abc"), (std::vector<int32_t>{260}));
  EXPECT_EQ(t1->encode("a<|endoftext|>b"), (std::vector<int32_t>{97, 261, 98}));
  EXPECT_EQ(t1->pad_id(), 261);
  EXPECT_EQ(t1->vocab_size(), 262u);
}

// ---- Bad input: every failure is a Status naming the file, never a crash.

void expect_error(const Result<Tokenizer>& r, Code code, const std::string& must_mention) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(must_mention), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().to_string();
}

TEST(TokenizerErrors, MissingFolder) {
  const fs::path p = testing::data_dir() / "no_such_tokenizer_dir";
  expect_error(Tokenizer::load(p), Code::kNotFound, p.string());
}

TEST(TokenizerErrors, FolderWithoutTokenizerFiles) {
  const fs::path dir = testing::make_temp_dir("tok_empty");
  expect_error(Tokenizer::load(dir), Code::kNotFound, dir.string());
  spit(dir / "vocab.json", "{}");
  expect_error(Tokenizer::load(dir), Code::kNotFound, "merges.txt");
}

TEST(TokenizerErrors, TruncatedJson) {
  const std::string full = slurp(tokenizer_dir() / "tokenizer.json");
  ASSERT_GT(full.size(), 1000000u);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{5000}, full.size() / 2, full.size() - 3}) {
    const fs::path dir = write_mini("tok_trunc", full.substr(0, cut));
    auto r = Tokenizer::load(dir);
    expect_error(r, Code::kFormatError, (dir / "tokenizer.json").string());
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("end of file"), std::string::npos) << r.status().to_string();
    }
  }
}

TEST(TokenizerErrors, NotJson) {
  for (const char* junk : {"hello", "{\"model\": nope}", "[1, 2]", "{\"a\": 1,}", "{} trailing", "\xFF\xFE{"}) {
    const fs::path dir = write_mini("tok_junk", junk);
    expect_error(Tokenizer::load(dir), Code::kFormatError, (dir / "tokenizer.json").string());
  }
  const fs::path dir = write_mini("tok_nomodel", "{\"version\": \"1.0\"}");
  expect_error(Tokenizer::load(dir), Code::kFormatError, "model");
}

TEST(TokenizerErrors, UnsupportedSettings) {
  const json merges = json::array();
  fs::path dir = write_mini("tok_nfkc", mini_tokenizer_json({}, merges, {{"type", "NFKC"}}));
  expect_error(Tokenizer::load(dir), Code::kUnsupported, "NFKC");
  dir = write_mini("tok_regex", mini_tokenizer_json({}, merges, {{"type", "NFC"}}, "\\w+|\\s+"));
  expect_error(Tokenizer::load(dir), Code::kUnsupported, (dir / "tokenizer.json").string());
  // null normalizer is fine (no NFC then)
  dir = write_mini("tok_nonorm", mini_tokenizer_json({}, merges, nullptr));
  EXPECT_TRUE(Tokenizer::load(dir).ok());
}

TEST(TokenizerErrors, MergeOfUnknownToken) {
  const fs::path dir = write_mini("tok_badmerge", mini_tokenizer_json({"ab"}, json::parse(R"([["a","b"],["ab","q"]])")));
  expect_error(Tokenizer::load(dir), Code::kFormatError, "'abq' is not in the vocab");
  const fs::path vm = testing::make_temp_dir("tok_badmerges_txt");
  spit(vm / "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  spit(vm / "merges.txt", "#version: 0.2\na b\nab\n");
  expect_error(Tokenizer::load(vm), Code::kFormatError, "merges.txt: line 3");
  spit(vm / "vocab.json", R"({"a": 0, "b": 1, "ab": 2)");
  expect_error(Tokenizer::load(vm), Code::kFormatError, "vocab.json");
}

}  // namespace
}  // namespace klein
