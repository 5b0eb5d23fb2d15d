// `klein serve`: an OpenAI-compatible image server over the public API (klein/klein.h only).
#pragma once

#include <string>

#include "jobs.h"
#include "request.h"

namespace klein::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;         // 0: any free port (printed on stderr)
  std::string api_key;     // non-empty: every /v1/ request needs "Authorization: Bearer <key>"
  size_t max_body_bytes = size_t{32} << 20;
  int threads_http = 64;   // connections served at once (each waiting client holds one)
  QueueOptions queue;
  Limits limits;
};

// Serves until SIGINT/SIGTERM; returns the process exit code.
int serve(const ServerOptions& options);

}  // namespace klein::server
