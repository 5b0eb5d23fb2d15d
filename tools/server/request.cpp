#include "request.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <set>

namespace klein::server {

namespace {

using nlohmann::json;

// Fields of OpenAI's Images API that do not change klein's output (model choice, style hints,
// moderation, user ids) are accepted and ignored; anything else unknown is an error.
const std::set<std::string> kIgnored = {"model", "quality", "style", "background", "moderation", "user"};
const std::set<std::string> kKnown = {"prompt", "n", "size", "response_format", "seed", "steps", "output_format",
                                      "output_compression", "stream", "partial_images", "input_fidelity",
                                      "guidance_scale", "negative_prompt", "strength", "lora"};

// An integer field: a JSON integer, or (from a form) decimal text.
std::optional<ApiError> get_uint(const json& v, const std::string& name, uint64_t lo, uint64_t hi, uint64_t* out) {
  const ApiError bad = invalid(name, "'" + name + "' must be an integer from " + std::to_string(lo) + " to " +
                                         std::to_string(hi));
  uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    return bad;  // negative
  } else if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return bad;
  } else {
    return bad;
  }
  if (x < lo || x > hi) return bad;
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> parse_size(const std::string& s, const Limits& lim, int* w, int* h) {
  if (s == "auto") {
    *w = *h = 0;
    return std::nullopt;
  }
  const std::string rule = "multiples of 16 from 16 to " + std::to_string(lim.max_side);
  const ApiError bad = invalid("size", "'size' must be \"WIDTHxHEIGHT\" with both " + rule + ", or \"auto\"; got \"" +
                                           s.substr(0, 40) + "\"");
  const size_t x = s.find('x');
  if (x == std::string::npos) return bad;
  int v[2] = {0, 0};
  const std::string part[2] = {s.substr(0, x), s.substr(x + 1)};
  for (int i = 0; i < 2; ++i) {
    const auto [p, ec] = std::from_chars(part[i].data(), part[i].data() + part[i].size(), v[i]);
    if (part[i].empty() || ec != std::errc() || p != part[i].data() + part[i].size()) return bad;
    if (v[i] < 16 || v[i] > lim.max_side || v[i] % 16 != 0) return bad;
  }
  *w = v[0];
  *h = v[1];
  return std::nullopt;
}

// `lora`: "NAME[:SCALE]" or a list of them (a form: NAME[:SCALE] entries separated by commas).
// NAME is a file name in --lora-dir (no folders: a request never reads elsewhere); SCALE a
// number from -100 to 100 (default 1).
std::optional<ApiError> parse_loras(const json& v, const Limits& lim, std::vector<LoraSpec>* out) {
  std::vector<std::string> items;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    for (size_t a = 0; a <= s.size();) {
      const size_t b = std::min(s.find(',', a), s.size());
      items.push_back(s.substr(a, b - a));
      a = b + 1;
    }
  } else if (v.is_array()) {
    for (const auto& e : v) {
      if (!e.is_string()) return invalid("lora", "'lora' must be a string or a list of strings \"NAME[:SCALE]\"");
      items.push_back(e.get<std::string>());
    }
  } else {
    return invalid("lora", "'lora' must be a string or a list of strings \"NAME[:SCALE]\"");
  }
  if (lim.lora_dir.empty())
    return invalid("lora", "this server takes no per-request LoRAs (start it with --lora-dir DIR)", "unsupported_value");
  if (static_cast<int>(items.size()) > lim.max_loras)
    return invalid("lora", "at most " + std::to_string(lim.max_loras) + " LoRAs per request");
  for (const std::string& item : items) {
    std::string name = item;
    float scale = 1.0f;
    const size_t colon = item.rfind(':');
    if (colon != std::string::npos) {
      name = item.substr(0, colon);
      const std::string t = item.substr(colon + 1);
      double x = 0;
      const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
      if (t.empty() || ec != std::errc() || p != t.data() + t.size() || !(x >= -100 && x <= 100))
        return invalid("lora", "'lora' " + item.substr(0, 80) + ": the scale must be a number from -100 to 100");
      scale = static_cast<float>(x);
    }
    if (name.empty() || name.size() > 255 || name[0] == '.' || name.find_first_of("/\\") != std::string::npos ||
        name.find('\0') != std::string::npos)
      return invalid("lora", "'lora' " + item.substr(0, 80) + ": a file name in the server's LoRA folder");
    out->push_back({lim.lora_dir + "/" + name, scale});
  }
  return std::nullopt;
}

// Every field of a JSON object (or a form turned into one, all values strings).
std::optional<ApiError> apply_fields(const json& body, const Limits& lim, JobSpec* out) {
  bool have_prompt = false;
  for (const auto& [key, v] : body.items()) {
    if (kIgnored.count(key)) continue;
    if (!kKnown.count(key)) return invalid(key, "Unknown parameter: '" + key + "'.", "unknown_parameter");
    uint64_t x = 0;
    if (key == "prompt") {
      if (!v.is_string() || v.get_ref<const std::string&>().empty())
        return invalid("prompt", "'prompt' must be a non-empty string");
      if (v.get_ref<const std::string&>().size() > lim.max_prompt_bytes)
        return invalid("prompt", "'prompt' is longer than " + std::to_string(lim.max_prompt_bytes) + " bytes");
      out->prompt = v.get<std::string>();
      have_prompt = true;
    } else if (key == "n") {
      if (auto e = get_uint(v, key, 1, static_cast<uint64_t>(lim.max_n), &x)) return e;
      out->n = static_cast<int>(x);
    } else if (key == "steps") {
      if (auto e = get_uint(v, key, 1, static_cast<uint64_t>(lim.max_steps), &x)) return e;
      out->steps = static_cast<int>(x);
    } else if (key == "seed") {
      if (auto e = get_uint(v, key, 0, UINT64_MAX, &x)) return e;
      out->seed = x;
    } else if (key == "output_compression") {
      if (auto e = get_uint(v, key, 0, 100, &x)) return e;
      out->quality = x < 1 ? 1 : static_cast<int>(x);
    } else if (key == "size") {
      if (!v.is_string()) return invalid("size", "'size' must be a string such as \"512x512\"");
      if (auto e = parse_size(v.get<std::string>(), lim, &out->width, &out->height)) return e;
    } else if (key == "response_format") {
      if (!v.is_string()) return invalid(key, "'response_format' must be a string");
      const std::string f = v.get<std::string>();
      if (f == "url")
        return invalid(key, "response_format 'url' is not supported by klein serve (images are not stored); use 'b64_json'",
                       "unsupported_value");
      if (f != "b64_json") return invalid(key, "'response_format' must be 'b64_json'");
    } else if (key == "stream") {
      // A JSON boolean, or (from a form, as the openai client sends it) "true" / "false".
      const std::string t = v.is_string() ? v.get<std::string>() : "";
      if (v.is_boolean()) out->stream = v.get<bool>();
      else if (t == "true" || t == "false") out->stream = t == "true";
      else return invalid(key, "'stream' must be true or false");
    } else if (key == "partial_images") {
      if (auto e = get_uint(v, key, 0, 3, &x)) return e;
      out->partial_images = static_cast<int>(x);
    } else if (key == "guidance_scale") {
      // A JSON number, or (from a form) decimal text: 0 to 100 (base models; distilled ones ignore it).
      double g = -1;
      if (v.is_number()) {
        g = v.get<double>();
      } else if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), g);
        if (ec != std::errc() || p != s.data() + s.size()) g = -1;
      }
      if (!(g >= 0 && g <= 100)) return invalid(key, "'guidance_scale' must be a number from 0 to 100");
      out->guidance_scale = g;
    } else if (key == "strength") {
      // Inpainting / image-to-image (edits): a number in (0, 1], or decimal text from a form.
      double st = -1;
      if (v.is_number()) {
        st = v.get<double>();
      } else if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), st);
        if (ec != std::errc() || p != s.data() + s.size()) st = -1;
      }
      if (!(st > 0 && st <= 1)) return invalid(key, "'strength' must be a number in (0, 1]");
      out->strength = st;
    } else if (key == "lora") {
      if (auto e = parse_loras(v, lim, &out->loras)) return e;
    } else if (key == "negative_prompt") {
      if (!v.is_string()) return invalid(key, "'negative_prompt' must be a string");
      if (v.get_ref<const std::string&>().size() > lim.max_prompt_bytes)
        return invalid(key, "'negative_prompt' is longer than " + std::to_string(lim.max_prompt_bytes) + " bytes");
      out->negative_prompt = v.get<std::string>();
    } else if (key == "input_fidelity") {
      // OpenAI's knob for how closely an edit keeps the input's features: klein has no such
      // control, and accepting it would promise a difference that never happens.
      return invalid(key, "'input_fidelity' is not supported by klein serve; omit it", "unsupported_value");
    } else if (key == "output_format") {
      const std::string f = v.is_string() ? v.get<std::string>() : "";
      if (f == "png") out->format = ImageFileFormat::kPng;
      else if (f == "jpeg" || f == "jpg") out->format = ImageFileFormat::kJpeg;
      else if (f == "webp") out->format = ImageFileFormat::kWebp;
      else return invalid(key, "'output_format' must be one of png, jpeg, webp");
      out->format_name = f == "jpg" ? "jpeg" : f;
    }
  }
  if (!have_prompt) return invalid("prompt", "'prompt' is required", "missing_required_parameter");
  if (out->partial_images > 0 && !out->stream)
    return invalid("partial_images", "'partial_images' needs 'stream': true", "invalid_value");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_json_request(const std::string& body, const Limits& limits, uint64_t random_seed,
                                           JobSpec* out) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("", "the request body is not valid JSON", "invalid_json");
  if (!j.is_object()) return invalid("", "the request body must be a JSON object", "invalid_json");
  out->seed = random_seed;
  if (auto e = apply_fields(j, limits, out)) return e;
  if (out->strength >= 0)
    return invalid("strength", "'strength' needs a source image: use images/edits with an 'image' part");
  return std::nullopt;
}

std::optional<ApiError> parse_form_request(const std::vector<FormPart>& parts, const Limits& limits,
                                           uint64_t random_seed, bool need_image, JobSpec* out) {
  json fields = json::object();
  out->seed = random_seed;
  for (const FormPart& p : parts) {
    if (p.name == "image" || p.name == "image[]") {
      if (static_cast<int>(out->references.size()) >= limits.max_images)
        return invalid("image", "at most " + std::to_string(limits.max_images) + " images per request");
      // Only the upload's own name goes into the PNG metadata; it never names a file here.
      std::string name = p.filename.empty() ? "image" + std::to_string(out->references.size() + 1) : p.filename;
      out->references.push_back({std::move(name), std::vector<uint8_t>(p.content.begin(), p.content.end())});
      continue;
    }
    if (p.name == "mask") {
      if (out->mask) return invalid("mask", "'mask' is given twice");
      // OpenAI's masks mark the area to edit by transparency; klein reads a mask as diffusers does
      // (white = repaint, black = keep) and would silently keep that area: a PNG with an alpha
      // channel (IHDR colour type 4 or 6) is refused rather than misread.
      const std::string& c = p.content;
      if (c.size() > 25 && c.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0 && (c[25] == 4 || c[25] == 6))
        return invalid("mask", "the mask has an alpha channel: klein reads masks as diffusers does (white = repaint, "
                               "black = keep), not by transparency; send an opaque black-and-white image",
                       "invalid_image");
      out->mask = ReferenceImage{p.filename.empty() ? "mask" : p.filename, std::vector<uint8_t>(c.begin(), c.end())};
      continue;
    }
    if (fields.contains(p.name)) return invalid(p.name, "'" + p.name + "' is given twice");
    fields[p.name] = p.content;
  }
  if (need_image && out->references.empty())
    return invalid("image", "at least one 'image' part is required", "missing_required_parameter");
  if (out->mask && out->references.empty())
    return invalid("mask", "'mask' needs an 'image' part (the image to inpaint)", "missing_required_parameter");
  if (auto e = apply_fields(fields, limits, out)) return e;
  if (out->strength >= 0 && out->references.empty())
    return invalid("strength", "'strength' needs an 'image' part (the source image)", "missing_required_parameter");
  return std::nullopt;
}

ApiError body_too_large(size_t max_body_bytes) {
  return {413, "the request body is larger than " + std::to_string(max_body_bytes >> 20) + " MiB",
          "invalid_request_error", "", "request_too_large"};
}

std::optional<ApiError> check_content_length(const std::vector<std::string>& values, bool transfer_encoding,
                                             size_t max_body_bytes) {
  if (transfer_encoding && !values.empty())
    return ApiError{400, "both Content-Length and Transfer-Encoding given", "invalid_request_error", "",
                    "malformed_request"};
  const auto bad = [](const std::string& v) {
    return ApiError{400, "bad Content-Length header: \"" + v.substr(0, 40) + "\" (a decimal byte count expected)",
                    "invalid_request_error", "", "malformed_request"};
  };
  for (const std::string& v : values) {
    uint64_t n = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    // from_chars takes a leading '-' for unsigned types as an error, and reports overflow.
    if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return bad(v);
    if (v != values.front()) return ApiError{400, "conflicting Content-Length headers", "invalid_request_error", "",
                                             "malformed_request"};
    if (n > max_body_bytes) return body_too_large(max_body_bytes);
  }
  return std::nullopt;
}

bool bearer_matches(const std::string& authorization, const std::string& key) {
  const std::string want = "Bearer " + key;
  // Constant time in the key's length: no timing hint about how much of a guess was right.
  unsigned diff = authorization.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i)
    diff |= static_cast<unsigned>(want[i] ^ (i < authorization.size() ? authorization[i] : 0));
  return diff == 0;
}

}  // namespace klein::server
