#include "server.h"

#include <httplib.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <sys/socket.h>

#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>

#include "client_socket.h"
#include "klein/klein.h"

namespace klein::server {

extern const char kIndexHtml[];  // web/index.html, embedded at build time

namespace {

using nlohmann::json;

// What the request log line says about the request being served on this thread: httplib calls
// the pre-routing handler, the route and the logger on the connection's thread, in that order.
struct RequestLog {
  std::chrono::steady_clock::time_point start{};
  std::string job, size, code;
  int n = 0, steps = -1;
  bool close_after = false;  // the framing of the rest of the connection is unknown: close it
};
thread_local RequestLog t_log;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  res.set_content(e.json(), "application/json");
  t_log.code = e.code;
}

// httplib's ThreadPool has a fixed size and a connection holds its thread until it closes, so a
// few dozen clients that open connections and send half a request (or nothing) would starve
// everyone else for the whole read timeout. This pool keeps `base` threads and grows to `max`
// while all are busy; the extra threads leave after a while idle.
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t base, size_t max) : s_(std::make_shared<State>()), base_(base), max_(max) {}
  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->tasks.push_back(std::move(fn));
    // An idle thread may already be promised to an earlier task it has not taken yet: a new
    // thread unless there are more idle threads than waiting tasks.
    if (s_->tasks.size() <= s_->idle || s_->threads >= max_) {
      s_->cv.notify_one();
      return;
    }
    ++s_->threads;
    try {
      // The thread holds the state, so its last unlock never touches a destroyed pool.
      std::thread([s = s_, base = base_] { work(s, base); }).detach();
    } catch (const std::system_error&) {
      // No thread to be had (a process or memory limit): the task waits for a running one.
      --s_->threads;
      s_->cv.notify_one();
    }
  }
  void shutdown() override {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->stop = true;
    s_->cv.notify_all();
    s_->gone.wait(lock, [&] { return s_->threads == 0; });
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv, gone;
    std::deque<std::function<void()>> tasks;
    size_t threads = 0, idle = 0;
    bool stop = false;
  };
  static void work(const std::shared_ptr<State>& s, size_t base) {
    std::unique_lock<std::mutex> lock(s->mu);
    for (;;) {
      ++s->idle;
      const bool woke = s->cv.wait_for(lock, std::chrono::seconds(10), [&] { return s->stop || !s->tasks.empty(); });
      --s->idle;
      if (s->tasks.empty()) {
        if (s->stop || (!woke && s->threads > base)) break;
        continue;
      }
      auto fn = std::move(s->tasks.front());
      s->tasks.pop_front();
      lock.unlock();
      fn();  // httplib's connection handler: it catches what its handlers throw
      lock.lock();
    }
    --s->threads;
    s->gone.notify_all();
  }
  std::shared_ptr<State> s_;
  const size_t base_, max_;
};

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
    if (spec->mask) {
      auto img = decode_image(spec->mask->data, spec->mask->name);
      if (!img.ok()) return invalid("mask", img.status().message(), "invalid_image");
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
      t_log = RequestLog{};
      t_log.start = std::chrono::steady_clock::now();
      return framing_ok(req, res) && authorize(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                                         : httplib::Server::HandlerResponse::Handled;
    });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) { log_request(req, res); });
    // The library's own refusals (413 too large, 400 unparsable, 404) get OpenAI's error shape too.
    svr.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 413)
        send_error(res, body_too_large(opt_.max_body_bytes));
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
  // httplib would wait for a body of a negative or 23-digit length until the read timeout (and
  // read a too-large one to the end before its 413): such a request is answered at once, and
  // the connection closed after the answer, since where its next request starts is unknown.
  bool framing_ok(const httplib::Request& req, httplib::Response& res) {
    std::vector<std::string> lengths;
    for (auto [it, end] = req.headers.equal_range("Content-Length"); it != end; ++it) lengths.push_back(it->second);
    if (lengths.empty()) return true;
    auto e = check_content_length(lengths, req.has_header("Transfer-Encoding"), opt_.max_body_bytes);
    if (!e) return true;
    send_error(res, *e);
    res.set_header("Connection", "close");
    t_log.close_after = true;
    return false;
  }

  void log_request(const httplib::Request& req, const httplib::Response& res) {
    RequestLog l = std::move(t_log);
    t_log = RequestLog{};
    if (l.close_after) {
      // The answer is written: end the connection (httplib would read on for the next request).
      const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
    // Health probes come every few seconds from monitors: only with -v, unless they fail.
    if (!opt_.verbose && req.path == "/health" && res.status < 400) return;
    // The method and path come from the client, decoded: no control characters into the log.
    const auto printable = [](std::string t) {
      if (t.empty()) return std::string("?");
      if (t.size() > 200) t.resize(200);
      for (char& c : t)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
      return t;
    };
    std::string line = "klein serve: " + printable(req.method) + " " + printable(req.path) + " " + std::to_string(res.status);
    if (!l.job.empty())
      line += " " + l.job + " size=" + l.size + " n=" + std::to_string(l.n) + " steps=" +
              (l.steps > 0 ? std::to_string(l.steps) : std::string("default"));
    if (l.start != std::chrono::steady_clock::time_point{}) {
      char t[32];
      std::snprintf(t, sizeof t, " %.3fs", std::chrono::duration<double>(std::chrono::steady_clock::now() - l.start).count());
      line += t;
    }
    if (!l.code.empty()) line += " " + l.code;
    if (opt_.verbose) line += " from " + req.remote_addr + ":" + std::to_string(req.remote_port);
    std::fprintf(stderr, "%s\n", line.c_str());
  }

  bool authorize(const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return true;
    if (bearer_matches(req.get_header_value("Authorization"), opt_.api_key)) return true;
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
    if (keep && spec.stream) {
      send_error(res, invalid("stream", "/v1/jobs streams through GET /v1/jobs/{id}/events; 'stream' is for "
                                        "/v1/images/generations and /v1/images/edits"));
      return nullptr;
    }
    t_log.size = spec.width ? std::to_string(spec.width) + "x" + std::to_string(spec.height) : "auto";
    t_log.n = spec.n;
    t_log.steps = spec.steps;
    ApiError err;
    auto job = queue_.submit(std::move(spec), keep, keep, &err);
    if (!job) send_busy(res, err, queue_.retry_after_s());
    else t_log.job = job->id;
    return job;
  }

  // The OpenAI endpoints answer when the job ends. A client that hangs up cancels its job, so
  // the worker moves on to the next one.
  void sync(const httplib::Request& req, httplib::Response& res, bool edit) {
    auto job = queue_request(req, res, edit, false);
    if (!job) return;
    if (job->spec.stream) return stream(res, job, edit ? "image_edit" : "image_generation");
    const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
    while (!job->wait_done(std::chrono::milliseconds(50))) {
      if (fd >= 0 && !job->cancel_requested && peer_closed(fd)) queue_.cancel(job);
    }
    if (job->state() == JobState::kSucceeded) res.set_content(job->response_json(), "application/json");
    else send_error(res, job->error());
  }

  // An event stream of `job`: `next` turns what happened since the cursor into SSE text.
  // Closing the stream before the job ends cancels it; `on_close` (optional) runs when it ends.
  void sse(httplib::Response& res, const std::shared_ptr<Job>& job,
           std::function<std::string(Job::Cursor*)> next, std::function<void()> on_close = {}) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto cursor = std::make_shared<Job::Cursor>();
    JobQueue* q = &queue_;
    res.set_chunked_content_provider(
        "text/event-stream",
        [cursor, next = std::move(next)](size_t, httplib::DataSink& sink) {
          std::string out = next(cursor.get());
          // A comment line when nothing happened: writing is how a closed stream is noticed.
          if (out.empty()) out = ": waiting\n\n";
          if (!sink.write(out.data(), out.size())) return false;
          if (cursor->ended) sink.done();
          return true;
        },
        [job, cursor, q, on_close = std::move(on_close)](bool) {
          if (on_close) on_close();
          if (!cursor->ended && !job->done()) q->cancel(job);
        });
  }

  // OpenAI's image streaming: `<type>.partial_image` events as the job makes them, then one
  // `<type>.completed` per image, or an `error` event ({"error": ...}, which the openai client
  // raises).
  void stream(httplib::Response& res, const std::shared_ptr<Job>& job, const std::string& type) {
    sse(res, job, [job, type](Job::Cursor* cursor) {
      std::string out;
      for (const Job::Event& e : job->next_raw(cursor, std::chrono::milliseconds(250))) {
        if (e.name == "partial") out += "event: " + type + ".partial_image\ndata: " + e.data + "\n\n";
        else if (e.name == "done") out += job->completed_events(type);
        else if (e.name == "error" || e.name == "cancelled") out += "event: error\ndata: " + e.data + "\n\n";
      }
      return out;
    });
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
    // Each stream holds an HTTP thread until the job ends: a bounded number per job.
    if (job->watchers.fetch_add(1) >= opt_.max_watchers) {
      job->watchers.fetch_sub(1);
      send_busy(res,
                {429, "job " + job->id + " already has " + std::to_string(opt_.max_watchers) + " event streams open",
                 "rate_limit_error", "", "too_many_streams"},
                1);
      return;
    }
    t_log.job = job->id;
    sse(
        res, job, [job](Job::Cursor* cursor) { return job->next_events(cursor, std::chrono::milliseconds(250)); },
        [job] { job->watchers.fetch_sub(1); });
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
  svr.new_task_queue = [pool] { return new ConnectionPool(pool, std::max(pool, kMaxConnectionThreads)); };
  // httplib's default sets SO_REUSEPORT, with which a second server on a busy port binds too and
  // the kernel splits connections between them: plain SO_REUSEADDR makes a busy port an error.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  // An idle keep-alive connection holds a thread, and shutdown waits for it: keep that short.
  svr.set_keep_alive_timeout(2);
  ServerOptions so = o;
  if (o.verbose)
    so.queue.on_job_end = [](const Job& job, double seconds) {
      std::fprintf(stderr, "klein serve: job %s %s after %.3f s on the worker\n", job.id.c_str(), state_name(job.state()),
                   seconds);
    };
  Service service(so);
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
  const bool loopback = o.host == "127.0.0.1" || o.host == "localhost" || o.host == "::1";
  std::fprintf(stderr, "klein serve: listening on http://%s:%d/ (model %s loading)%s\n", o.host.c_str(), port,
               o.queue.model_dir.c_str(), loopback ? "" : " — reachable from other machines");
  std::fflush(stderr);
  const std::string address = "http://" + o.host + ":" + std::to_string(port) + "/";
  service.queue().start(
      [&](const Status& s) {
        std::fprintf(stderr, "klein: serve: %s\n", s.to_string().c_str());
        exit_code = 1;
        // stop() does nothing before listen has started: wait for it (a model can fail at once).
        while (!svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        svr.stop();
      },
      [&service, &o, address](double load_s) {
        std::fprintf(stderr, "klein serve: ready: model %s (%s) on %s, loaded in %.2f s\n",
                     service.queue().model_name().c_str(), o.queue.model_dir.c_str(), address.c_str(), load_s);
      });
  svr.listen_after_bind();
  finished = true;
  pthread_kill(on_signal.native_handle(), SIGTERM);  // blocked everywhere: only sigwait takes it
  on_signal.join();
  return exit_code;
}

}  // namespace klein::server
