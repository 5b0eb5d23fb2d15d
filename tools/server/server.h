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
  int threads_http = 64;   // connection threads kept (each open connection holds one; more start on demand)
  int max_watchers = 8;    // event streams open on one job at once; more get 429
  bool verbose = false;    // -v: also /health requests, client addresses, each job's end
  QueueOptions queue;
  Limits limits;
};

// Connection threads at most: beyond this, connections wait for a thread. Well under select()'s
// FD_SETSIZE (1024), which httplib's sockets must stay below.
inline constexpr size_t kMaxConnectionThreads = 512;

// Serves until SIGINT/SIGTERM; returns the process exit code.
int serve(const ServerOptions& options);

}  // namespace klein::server
