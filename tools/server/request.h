// An image request as the server runs it (JobSpec), parsed and validated from OpenAI Images API
// bodies: JSON (generations) or multipart/form-data (edits, with `image` / `image[]` parts).
// Unknown fields are rejected (400, code "unknown_parameter"), as OpenAI's API does, so a typo
// never silently changes nothing; so are OpenAI fields klein cannot honour (input_fidelity).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api_error.h"
#include "klein/klein.h"

namespace klein::server {

struct JobSpec {
  std::string prompt;
  int n = 1;
  int width = 0, height = 0;  // 0: the default (the first reference's size, else the model's native size)
  int steps = 0;              // 0: the model's default
  uint64_t seed = 0;          // image i uses seed + i
  double guidance_scale = -1; // base models' classifier-free guidance (< 0: the default 4.0)
  std::string negative_prompt;
  ImageFileFormat format = ImageFileFormat::kPng;
  std::string format_name = "png";
  int quality = 90;  // JPEG / WebP
  std::vector<ReferenceImage> references;
  // Edits: a `mask` part makes the first image the inpainting source (white = repaint, as
  // diffusers; the other images stay references); `strength` without a mask makes it an
  // image-to-image source. strength < 0: the default 0.8.
  std::optional<ReferenceImage> mask;
  double strength = -1;
  // OpenAI image streaming: the endpoint answers with SSE, `partial_images` (0..3) previews per
  // image then one completed event per image.
  bool stream = false;
  int partial_images = 0;
  // `lora`: files in the server's --lora-dir with their scales (paths joined there), applied to
  // this request only, at run time (GenerateRequest::loras).
  std::vector<LoraSpec> loras;
};

struct Limits {
  int max_side = 2048;     // width and height: 16..max_side, multiples of 16
  int max_n = 10;
  int max_steps = 100;
  size_t max_prompt_bytes = 64 * 1024;
  int max_images = 8;      // reference images per edit
  std::string lora_dir;    // --lora-dir: where a request's `lora` names are looked up ("": none allowed)
  int max_loras = 8;
};

// A JSON body. `random_seed` is used when the body has no seed.
std::optional<ApiError> parse_json_request(const std::string& body, const Limits& limits, uint64_t random_seed,
                                           JobSpec* out);

// A multipart part, as the HTTP library hands it over.
struct FormPart {
  std::string name, filename, content_type, content;
};
// A multipart body: text fields as in JSON (numbers as text), `image` / `image[]` file parts as
// references (at least one when `need_image`), an optional `mask` part (edits).
std::optional<ApiError> parse_form_request(const std::vector<FormPart>& parts, const Limits& limits,
                                           uint64_t random_seed, bool need_image, JobSpec* out);

// 413 for a body over the limit.
ApiError body_too_large(size_t max_body_bytes);

// The Content-Length header values of a request (normally one). Decimal digits only, all equal,
// at most `max_body_bytes`, and not beside a Transfer-Encoding (two framings: which one a proxy
// in front used is unknown): anything else is answered at once (400, or 413 when too large)
// instead of waiting for a body that will never match.
std::optional<ApiError> check_content_length(const std::vector<std::string>& values, bool transfer_encoding,
                                             size_t max_body_bytes);

// "Authorization: Bearer <key>" against the key, in time independent of how much matches.
bool bearer_matches(const std::string& authorization, const std::string& key);

}  // namespace klein::server
