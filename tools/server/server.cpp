#include "server.h"

#include <httplib.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "client_socket.h"
#include "klein/klein.h"

namespace klein::server {

extern const char kIndexHtml[];  // web/index.html, embedded at build time

namespace {

using nlohmann::json;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  res.set_content(e.json(), "application/json");
}

void send_busy(httplib::Response& res, const ApiError& e, int retry_after_s) {
  res.set_header("Retry-After", std::to_string(retry_after_s));
  send_error(res, e);
}

uint64_t random_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  // JavaScript numbers hold integers exactly up to 2^53: the page can show and reuse any seed.
  return rng() & ((uint64_t{1} << 53) - 1);
}

// The body as a JobSpec: JSON, or multipart (images as uploads, decoded here so a bad one is a
// 400 before it takes a place in the queue).
std::optional<ApiError> parse_request(const httplib::Request& req, const Limits& lim, bool edit, JobSpec* spec) {
  if (req.is_multipart_form_data()) {
    std::vector<FormPart> parts;
    for (const auto& [name, f] : req.files) parts.push_back({f.name, f.filename, f.content_type, f.content});
    if (auto e = parse_form_request(parts, lim, random_seed(), edit, spec)) return e;
    for (const ReferenceImage& r : spec->references) {
      auto img = decode_image(r.data, r.name);
      if (!img.ok()) return invalid("image", img.status().message(), "invalid_image");
    }
    return std::nullopt;
  }
  if (edit) return invalid("", "images/edits takes multipart/form-data with one or more 'image' parts", "invalid_content_type");
  return parse_json_request(req.body, lim, random_seed(), spec);
}

class Service {
 public:
  explicit Service(const ServerOptions& o) : opt_(o), queue_(o.queue) {}

  void routes(httplib::Server& svr) {
    svr.set_payload_max_length(opt_.max_body_bytes);
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return authorize(req, res) ? httplib::Server::HandlerResponse::Unhandled : httplib::Server::HandlerResponse::Handled;
    });
    // The library's own refusals (413 too large, 400 unparsable, 404) get OpenAI's error shape too.
    svr.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 413)
        send_error(res, {413, "the request body is larger than " + std::to_string(opt_.max_body_bytes >> 20) + " MiB",
                         "invalid_request_error", "", "request_too_large"});
      else if (res.status == 404)
        send_error(res, {404, "no such endpoint", "invalid_request_error", "", "not_found"});
      else
        send_error(res, {res.status, "malformed request (" + std::to_string(res.status) + ")", "invalid_request_error", "",
                         "malformed_request"});
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      send_error(res, {500, "internal error", "server_error", "", "internal_error"});
    });
    svr.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kIndexHtml, "text/html; charset=utf-8"); });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", queue_.model_name()}, {"object", "model"}, {"created", 0}, {"owned_by", "klein.cpp"}};
      res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
    });
    svr.Post("/v1/images/generations", [this](const httplib::Request& req, httplib::Response& res) { sync(req, res, false); });
    svr.Post("/v1/images/edits", [this](const httplib::Request& req, httplib::Response& res) { sync(req, res, true); });
    svr.Post("/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) { submit(req, res); });
    svr.Get(R"(/v1/jobs/([A-Za-z0-9_]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (auto job = job_or_404(req, res)) res.set_content(job->status_json(), "application/json");
    });
    svr.Get(R"(/v1/jobs/([A-Za-z0-9_]+)/events)", [this](const httplib::Request& req, httplib::Response& res) { events(req, res); });
    svr.Delete(R"(/v1/jobs/([A-Za-z0-9_]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (auto job = job_or_404(req, res)) {
        if (!job->done()) queue_.cancel(job);
        job->wait_done(std::chrono::milliseconds(2000));  // a running job stops at its next step
        res.set_content(job->status_json(), "application/json");
      }
    });
  }

  JobQueue& queue() { return queue_; }

 private:
  bool authorize(const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return true;
    const std::string want = "Bearer " + opt_.api_key;
    const std::string got = req.get_header_value("Authorization");
    // Constant time in the key's length: no timing hint about how much of a guess was right.
    unsigned diff = got.size() != want.size();
    for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(want[i] ^ (i < got.size() ? got[i] : 0));
    if (diff == 0) return true;
    send_error(res, {401, "missing or wrong API key (Authorization: Bearer ...)", "invalid_request_error", "", "invalid_api_key"});
    return false;
  }

  void health(httplib::Response& res) {
    const auto h = queue_.health();
    const char* s = h == JobQueue::Health::kLoading ? "loading"
                    : h == JobQueue::Health::kBusy  ? "busy"
                    : h == JobQueue::Health::kReady ? "ready"
                                                    : "failed";
    res.status = h == JobQueue::Health::kLoading || h == JobQueue::Health::kFailed ? 503 : 200;
    const auto n = queue_.counts();
    res.set_content(json{{"status", s}, {"model", queue_.model_name()}, {"queued", queue_.waiting()},
                         {"max_queue", queue_.max_queue()}, {"version", version()},
                         {"jobs", {{"succeeded", n.succeeded}, {"failed", n.failed}, {"cancelled", n.cancelled}}}}.dump(),
                    "application/json");
  }

  std::shared_ptr<Job> queue_request(const httplib::Request& req, httplib::Response& res, bool edit, bool keep) {
    JobSpec spec;
    if (auto e = parse_request(req, opt_.limits, edit, &spec)) {
      send_error(res, *e);
      return nullptr;
    }
    ApiError err;
    auto job = queue_.submit(std::move(spec), keep, keep, &err);
    if (!job) send_busy(res, err, queue_.retry_after_s());
    return job;
  }

  // The OpenAI endpoints answer when the job ends. A client that hangs up cancels its job, so
  // the worker moves on to the next one.
  void sync(const httplib::Request& req, httplib::Response& res, bool edit) {
    auto job = queue_request(req, res, edit, false);
    if (!job) return;
    const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
    while (!job->wait_done(std::chrono::milliseconds(50))) {
      if (fd >= 0 && !job->cancel_requested && peer_closed(fd)) queue_.cancel(job);
    }
    if (job->state() == JobState::kSucceeded) res.set_content(job->response_json(), "application/json");
    else send_error(res, job->error());
  }

  void submit(const httplib::Request& req, httplib::Response& res) {
    auto job = queue_request(req, res, false, true);
    if (!job) return;
    res.status = 202;
    res.set_content(json{{"id", job->id}, {"object", "image.job"}, {"status", "queued"},
                         {"events", "/v1/jobs/" + job->id + "/events"}}.dump(),
                    "application/json");
  }

  std::shared_ptr<Job> job_or_404(const httplib::Request& req, httplib::Response& res) {
    auto job = queue_.find(req.matches[1]);
    if (!job) send_error(res, {404, "no job " + std::string(req.matches[1]), "invalid_request_error", "id", "job_not_found"});
    return job;
  }

  // Server-Sent Events: queued, started, progress (phase/step), preview (the latest only, JPEG
  // base64), then done (the images response), error or cancelled. Closing the stream before the
  // end cancels the job.
  void events(const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto cursor = std::make_shared<Job::Cursor>();
    JobQueue* q = &queue_;
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, cursor](size_t, httplib::DataSink& sink) {
          std::string out = job->next_events(cursor.get(), std::chrono::milliseconds(250));
          // A comment line when nothing happened: writing is how a closed stream is noticed.
          if (out.empty()) out = ": waiting\n\n";
          if (!sink.write(out.data(), out.size())) return false;
          if (cursor->ended) sink.done();
          return true;
        },
        [job, cursor, q](bool success) {
          if (!cursor->ended && !job->done()) q->cancel(job);
        });
  }

  ServerOptions opt_;
  JobQueue queue_;
};

}  // namespace

int serve(const ServerOptions& o) {
  // Signals go to one thread that stops the server; every other thread keeps them blocked.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // glibc gives each thread that allocates its own arena: with dozens of connection threads the
  // heap would grow with the number of clients rather than with the jobs. Two arenas suffice.
  mallopt(M_ARENA_MAX, 2);

  httplib::Server svr;
  const size_t pool = static_cast<size_t>(o.threads_http);
  svr.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  // An idle keep-alive connection holds a thread, and shutdown waits for it: keep that short.
  svr.set_keep_alive_timeout(2);
  Service service(o);
  service.routes(svr);
  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) {
      std::fprintf(stderr, "klein: serve: cannot listen on %s\n", o.host.c_str());
      return 1;
    }
  } else if (!svr.bind_to_port(o.host, port)) {
    std::fprintf(stderr, "klein: serve: cannot listen on %s:%d (in use, or not an address of this machine)\n", o.host.c_str(), port);
    return 1;
  }
  std::atomic<int> exit_code{0};
  std::atomic<bool> finished{false};
  std::thread on_signal([&svr, &finished, sigs] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (finished) return;  // woken by serve() itself on the way out
    while (!svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    svr.stop();
  });
  service.queue().start([&](const Status& s) {
    std::fprintf(stderr, "klein: serve: %s\n", s.to_string().c_str());
    exit_code = 1;
    // stop() does nothing before listen has started: wait for it (a model can fail at once).
    while (!svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    svr.stop();
  });
  const bool loopback = o.host == "127.0.0.1" || o.host == "localhost" || o.host == "::1";
  std::fprintf(stderr, "klein serve: listening on http://%s:%d/ (model %s loading)%s\n", o.host.c_str(), port,
               o.queue.model_dir.c_str(), loopback ? "" : " — reachable from other machines");
  std::fflush(stderr);
  svr.listen_after_bind();
  finished = true;
  pthread_kill(on_signal.native_handle(), SIGTERM);  // blocked everywhere: only sigwait takes it
  on_signal.join();
  return exit_code;
}

}  // namespace klein::server
