// Loading the tokenizer: tokenizer.json (authoritative), or vocab.json + merges.txt
// (+ tokenizer_config.json). The big sections (vocab, merges) are streamed with JsonCursor;
// the small ones are handed to nlohmann::json through their raw text.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <utility>
#include <nlohmann/json.hpp>

#include "io/file_counter.h"
#include "io/json_scan.h"
#include "pipeline/tokenizer.h"
#include "pipeline/tokenizer_impl.h"

namespace klein {
namespace tok {
namespace fs = std::filesystem;
using Json = nlohmann::json;

FileText& FileText::operator=(FileText&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, size_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    copy_ = std::move(o.copy_);
  }
  return *this;
}

FileText::~FileText() {
  if (map_) munmap(map_, size_);
}

Result<FileText> FileText::open(const std::string& path) {
  note_file_opened(path);  // every tokenizer file goes through here
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + std::strerror(errno));
  }
  FileText f;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) {
      f.map_ = p;
      f.size_ = static_cast<size_t>(st.st_size);
      ::close(fd);
      return f;
    }
  }
  // Not mappable (empty, a pipe, ...): read it.
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return io_error(path + ": read failed: " + std::strerror(err));
    }
    f.copy_.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return f;
}

namespace {

// Parses a small, already validated JSON span; nlohmann may throw, we may not.
Result<Json> parse_small(std::string_view span, const std::string& label, const char* what) {
  try {
    return Json::parse(span.begin(), span.end());
  } catch (const std::exception& e) {
    return format_error(label + ": " + what + ": " + e.what());
  }
}

std::string type_of(const Json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return for_message(j["type"].get<std::string>());
  return for_message(j.dump(), 60);
}

bool flag(const Json& obj, const char* key, bool dflt) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  return it->is_boolean() ? it->get<bool>() : dflt;
}

Status check_normalizer(const Json& j, const std::string& label, TokenizerImpl& impl) {
  if (j.is_null()) {
    impl.nfc = false;
    return Status::Ok();
  }
  if (j.is_object() && type_of(j) == "NFC") {
    impl.nfc = true;
    return Status::Ok();
  }
  return unsupported(label + ": normalizer '" + type_of(j) + "' is not supported (only NFC or none)");
}

Status check_pre_tokenizer(const Json& j, const std::string& label) {
  const std::string what = label + ": pre_tokenizer: ";
  if (!j.is_object() || type_of(j) != "Sequence" || !j.contains("pretokenizers") ||
      !j["pretokenizers"].is_array() || j["pretokenizers"].size() != 2)
    return unsupported(what + "'" + (j.is_null() ? std::string("null") : type_of(j)) +
                       "' is not supported (only the Qwen2 Sequence of Split + ByteLevel)");
  const Json& split = j["pretokenizers"][0];
  const Json& bl = j["pretokenizers"][1];
  if (type_of(split) != "Split") return unsupported(what + "first step '" + type_of(split) + "' is not Split");
  const Json* pattern = split.contains("pattern") ? &split["pattern"] : nullptr;
  if (!pattern || !pattern->is_object() || !pattern->contains("Regex") || !(*pattern)["Regex"].is_string())
    return unsupported(what + "Split pattern is not a Regex");
  const std::string regex = (*pattern)["Regex"].get<std::string>();
  if (regex != kQwen2Pattern)
    return unsupported(what + "Split regex is not the Qwen2 pattern (only that one is implemented): " + for_message(regex, 200));
  if (!split.contains("behavior") || split["behavior"] != "Isolated" || flag(split, "invert", false))
    return unsupported(what + "Split must have behavior Isolated and invert false");
  if (type_of(bl) != "ByteLevel") return unsupported(what + "second step '" + type_of(bl) + "' is not ByteLevel");
  if (flag(bl, "add_prefix_space", false) || flag(bl, "use_regex", true))
    return unsupported(what + "ByteLevel must have add_prefix_space false and use_regex false");
  return Status::Ok();
}

Status check_byte_level_or_null(const Json& j, const std::string& label, const char* section) {
  if (j.is_null() || (j.is_object() && type_of(j) == "ByteLevel")) return Status::Ok();
  return unsupported(label + ": " + section + " '" + type_of(j) + "' is not supported (only ByteLevel or none)");
}

Status read_added_token(const Json& t, int64_t id, const std::string& label, TokenizerImpl& impl) {
  if (!t.is_object() || !t.contains("content") || !t["content"].is_string())
    return format_error(label + ": added token " + std::to_string(id) + " has no string 'content'");
  AddedToken a;
  a.id = static_cast<int32_t>(id);
  a.content = t["content"].get<std::string>();
  a.special = flag(t, "special", false);
  a.normalized = flag(t, "normalized", !a.special);  // HF's default for a missing field
  if (flag(t, "single_word", false) || flag(t, "lstrip", false) || flag(t, "rstrip", false))
    return unsupported(label + ": added token '" + for_message(a.content) + "' uses single_word/lstrip/rstrip, not supported");
  impl.added.push_back(std::move(a));
  return Status::Ok();
}

Status read_added_tokens(const Json& j, const std::string& label, TokenizerImpl& impl) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_array()) return format_error(label + ": added_tokens is not an array");
  for (const Json& t : j) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer())
      return format_error(label + ": an added token has no integer 'id'");
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= std::numeric_limits<int32_t>::max())
      return format_error(label + ": added token id " + std::to_string(id) + " out of range");
    KLEIN_RETURN_IF_ERROR(read_added_token(t, id, label, impl));
  }
  return Status::Ok();
}

// Streams a {"token": id, ...} object into the BPE model.
bool read_vocab(JsonCursor& cur, BpeModel& bpe) {
  if (!cur.obj_begin()) return false;
  bool first = true, has = false;
  std::string key;
  int64_t id = 0;
  for (;;) {
    if (!cur.obj_next(first, key, has)) return false;
    if (!has) return true;
    if (!cur.integer(id, 0, std::numeric_limits<int32_t>::max() - 1)) return false;
    bpe.add_token(key, static_cast<int32_t>(id));
  }
}

// The "model" object of tokenizer.json.
Status read_model(JsonCursor& cur, const std::string& label, TokenizerImpl& impl) {
  if (!cur.obj_begin()) return cur.error();
  bool first = true, has = false, saw_vocab = false, saw_merges = false;
  std::string key, left, right, merge;
  for (;;) {
    if (!cur.obj_next(first, key, has)) return cur.error();
    if (!has) break;
    if (key == "vocab") {
      saw_vocab = true;
      if (!read_vocab(cur, impl.bpe)) return cur.error();
    } else if (key == "merges") {
      saw_merges = true;
      if (!cur.arr_begin()) return cur.error();
      bool mfirst = true, mhas = false;
      for (size_t i = 0;; ++i) {
        if (!cur.arr_next(mfirst, mhas)) return cur.error();
        if (!mhas) break;
        const char c = cur.peek();
        if (c == '"') {  // "left right" (older serialization)
          if (!cur.string(merge)) return cur.error();
          const size_t sp = merge.find(' ');
          if (sp == std::string::npos || sp == 0 || sp + 1 == merge.size() ||
              merge.find(' ', sp + 1) != std::string::npos)
            return format_error(label + ": model.merges[" + std::to_string(i) + "] '" + for_message(merge) +
                                "' is not of the form 'left right'");
          impl.bpe.add_merge(std::string_view(merge).substr(0, sp), std::string_view(merge).substr(sp + 1));
        } else if (c == '[') {  // ["left", "right"]
          bool pfirst = true, phas = false;
          if (!cur.arr_begin() || !cur.arr_next(pfirst, phas)) return cur.error();
          if (!phas || !cur.string(left) || !cur.arr_next(pfirst, phas)) {
            if (!phas) cur.fail("a merge pair needs two strings");
            return cur.error();
          }
          if (!phas || !cur.string(right) || !cur.arr_next(pfirst, phas)) {
            if (!phas) cur.fail("a merge pair needs two strings");
            return cur.error();
          }
          if (phas) {
            cur.fail("a merge pair has more than two strings");
            return cur.error();
          }
          impl.bpe.add_merge(left, right);
        } else {
          cur.fail("expected a merge (\"left right\" or [\"left\", \"right\"])");
          return cur.error();
        }
      }
    } else {
      std::string_view span;
      if (!cur.skip(&span)) return cur.error();
      KLEIN_ASSIGN_OR_RETURN(Json v, parse_small(span, label, "model"));
      if (key == "type" && !(v.is_string() && v.get<std::string>() == "BPE"))
        return unsupported(label + ": model type " + for_message(v.dump()) + " is not supported (only BPE)");
      if (key == "dropout" && !v.is_null() && !(v.is_number() && v.get<double>() == 0.0))
        return unsupported(label + ": model.dropout " + for_message(v.dump()) + " is not supported");
      if ((key == "continuing_subword_prefix" || key == "end_of_word_suffix") && !v.is_null() &&
          !(v.is_string() && v.get<std::string>().empty()))
        return unsupported(label + ": model." + for_message(key) + " " + for_message(v.dump()) + " is not supported");
      if (key == "ignore_merges" && v.is_boolean() && v.get<bool>())
        return unsupported(label + ": model.ignore_merges true is not supported");
    }
  }
  if (!saw_vocab) return format_error(label + ": model has no vocab");
  if (!saw_merges) return format_error(label + ": model has no merges");
  return Status::Ok();
}

}  // namespace

Status load_tokenizer_json(const std::string& path, TokenizerImpl& impl) {
  KLEIN_ASSIGN_OR_RETURN(FileText file, FileText::open(path));
  return load_tokenizer_json_text(file.view(), path, impl);
}

Status load_tokenizer_json_text(std::string_view text, const std::string& path, TokenizerImpl& impl) {
  impl.bpe.reserve(160000, 160000);
  JsonCursor cur(text, path);
  if (!cur.obj_begin()) return cur.error();
  bool first = true, has = false, saw_model = false;
  std::string key;
  std::string_view added_span, normalizer_span, pre_span, post_span, decoder_span;
  for (;;) {
    if (!cur.obj_next(first, key, has)) return cur.error();
    if (!has) break;
    if (key == "model") {
      saw_model = true;
      KLEIN_RETURN_IF_ERROR(read_model(cur, path, impl));
      continue;
    }
    std::string_view span;
    if (!cur.skip(&span)) return cur.error();
    if (key == "added_tokens") added_span = span;
    else if (key == "normalizer") normalizer_span = span;
    else if (key == "pre_tokenizer") pre_span = span;
    else if (key == "post_processor") post_span = span;
    else if (key == "decoder") decoder_span = span;
  }
  if (!cur.at_end()) {
    cur.fail("unexpected characters after the top-level object");
    return cur.error();
  }
  if (!saw_model) return format_error(path + ": no \"model\" section");

  auto section = [&](std::string_view span, const char* what) -> Result<Json> {
    if (span.empty()) return Json(nullptr);
    return parse_small(span, path, what);
  };
  KLEIN_ASSIGN_OR_RETURN(Json normalizer, section(normalizer_span, "normalizer"));
  KLEIN_RETURN_IF_ERROR(check_normalizer(normalizer, path, impl));
  if (pre_span.empty()) return unsupported(path + ": no pre_tokenizer (the Qwen2 Split + ByteLevel is required)");
  KLEIN_ASSIGN_OR_RETURN(Json pre, section(pre_span, "pre_tokenizer"));
  KLEIN_RETURN_IF_ERROR(check_pre_tokenizer(pre, path));
  KLEIN_ASSIGN_OR_RETURN(Json post, section(post_span, "post_processor"));
  KLEIN_RETURN_IF_ERROR(check_byte_level_or_null(post, path, "post_processor"));
  KLEIN_ASSIGN_OR_RETURN(Json decoder, section(decoder_span, "decoder"));
  KLEIN_RETURN_IF_ERROR(check_byte_level_or_null(decoder, path, "decoder"));
  KLEIN_ASSIGN_OR_RETURN(Json added, section(added_span, "added_tokens"));
  KLEIN_RETURN_IF_ERROR(read_added_tokens(added, path, impl));

  KLEIN_RETURN_IF_ERROR(impl.bpe.finalize(path));
  return impl.finish(path);
}

Status load_vocab_merges(const std::string& vocab_path, const std::string& merges_path,
                         const std::string& config_path, TokenizerImpl& impl) {
  impl.nfc = true;  // Qwen2Tokenizer applies NFC itself (prepare_for_tokenization)
  {
    KLEIN_ASSIGN_OR_RETURN(FileText file, FileText::open(vocab_path));
    const std::string_view text = file.view();
    impl.bpe.reserve(160000, 160000);
    JsonCursor cur(text, vocab_path);
    if (!read_vocab(cur, impl.bpe)) return cur.error();
    if (!cur.at_end()) {
      cur.fail("unexpected characters after the top-level object");
      return cur.error();
    }
  }
  {
    KLEIN_ASSIGN_OR_RETURN(FileText file, FileText::open(merges_path));
    const std::string_view text = file.view();
    size_t pos = 0, line_no = 0;
    while (pos < text.size()) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string_view::npos) eol = text.size();
      std::string_view line(text.data() + pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      // Python's line.strip(); byte-level tokens never contain ASCII whitespace.
      while (!line.empty() && std::strchr(" \t\r\f\v", line.back())) line.remove_suffix(1);
      while (!line.empty() && std::strchr(" \t\r\f\v", line.front())) line.remove_prefix(1);
      if (line.empty() || (line_no == 1 && line.substr(0, 9) == "#version:")) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        return format_error(merges_path + ": line " + std::to_string(line_no) + ": expected 'left right'");
      impl.bpe.add_merge(line.substr(0, sp), line.substr(sp + 1));
    }
  }
  KLEIN_RETURN_IF_ERROR(impl.bpe.finalize(merges_path));

  std::string label = vocab_path;
  if (!config_path.empty()) {
    label = config_path;
    KLEIN_ASSIGN_OR_RETURN(FileText file, FileText::open(config_path));
    const std::string_view text = file.view();
    Json cfg;
    try {
      cfg = Json::parse(text.begin(), text.end());
    } catch (const std::exception& e) {
      return format_error(config_path + ": invalid JSON: " + e.what());
    }
    if (!cfg.is_object()) return format_error(config_path + ": not a JSON object");
    if (cfg.contains("added_tokens_decoder")) {
      const Json& dec = cfg["added_tokens_decoder"];
      if (!dec.is_object()) return format_error(config_path + ": added_tokens_decoder is not an object");
      for (auto it = dec.begin(); it != dec.end(); ++it) {
        const std::string& k = it.key();
        char* end = nullptr;
        errno = 0;
        const long long id = std::strtoll(k.c_str(), &end, 10);
        if (k.empty() || *end != '\0' || errno != 0 || id < 0 || id >= std::numeric_limits<int32_t>::max())
          return format_error(config_path + ": added_tokens_decoder key '" + for_message(k) + "' is not a token id");
        KLEIN_RETURN_IF_ERROR(read_added_token(it.value(), id, config_path, impl));
      }
    }
  }
  // Qwen2Tokenizer's defaults make <|endoftext|> the unk/eos/pad token, added after the vocab.
  bool have_eot = impl.bpe.lookup("<|endoftext|>") >= 0;
  for (const AddedToken& t : impl.added) have_eot = have_eot || t.content == "<|endoftext|>";
  if (!have_eot) {
    int32_t next = impl.bpe.max_id() + 1;
    for (const AddedToken& t : impl.added) next = std::max(next, t.id + 1);
    impl.added.push_back(AddedToken{"<|endoftext|>", next, false, true});
  }
  return impl.finish(label);
}

}  // namespace tok

Result<Tokenizer> Tokenizer::from_json_text(std::string_view text, const std::string& label) {
  try {
    auto impl = std::make_shared<tok::TokenizerImpl>();
    KLEIN_RETURN_IF_ERROR(tok::load_tokenizer_json_text(text, label, *impl));
    return Tokenizer(std::move(impl));
  } catch (const std::bad_alloc&) {
    return io_error(label + ": out of memory while loading the tokenizer");
  } catch (const std::exception& e) {
    return internal_error(label + ": " + e.what());
  }
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  try {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) return not_found(path.string() + ": no such file or directory");
    auto impl = std::make_shared<tok::TokenizerImpl>();
    if (fs::is_directory(st)) {
      const fs::path tj = path / "tokenizer.json";
      const fs::path vocab = path / "vocab.json", merges = path / "merges.txt";
      const fs::path config = path / "tokenizer_config.json";
      if (fs::exists(tj, ec)) {
        KLEIN_RETURN_IF_ERROR(tok::load_tokenizer_json(tj.string(), *impl));
      } else if (fs::exists(vocab, ec) || fs::exists(merges, ec)) {
        if (!fs::exists(vocab, ec)) return not_found(vocab.string() + ": no such file (merges.txt needs it)");
        if (!fs::exists(merges, ec)) return not_found(merges.string() + ": no such file (vocab.json needs it)");
        KLEIN_RETURN_IF_ERROR(tok::load_vocab_merges(vocab.string(), merges.string(),
                                                     fs::exists(config, ec) ? config.string() : "", *impl));
      } else {
        return not_found(path.string() + ": no tokenizer.json (nor vocab.json + merges.txt) in this folder");
      }
    } else {
      KLEIN_RETURN_IF_ERROR(tok::load_tokenizer_json(path.string(), *impl));
    }
    return Tokenizer(std::move(impl));
  } catch (const std::bad_alloc&) {
    return io_error(path.string() + ": out of memory while loading the tokenizer");
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

}  // namespace klein
