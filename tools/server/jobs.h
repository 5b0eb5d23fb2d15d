// The resident model and its single worker: jobs run one at a time, in order, from a bounded
// queue. Each job records its events (phases, steps, the latest preview, the result) for the
// Server-Sent Events stream and the synchronous endpoints that wait on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api_error.h"
#include "klein/klein.h"
#include "request.h"

namespace klein::server {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
const char* state_name(JobState s);

struct JobImage {
  std::string b64;  // the encoded file (spec.format), base64
  uint64_t seed = 0;
};

class Job {
 public:
  Job(std::string id, JobSpec spec, bool previews) : id(std::move(id)), spec(std::move(spec)), previews(previews) {}
  const std::string id;
  const JobSpec spec;
  const bool previews;  // encode a preview per step (only a job with an events stream needs them)
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
  std::atomic<bool> cancel_requested{false};

  // One event of the job: an SSE event name and its JSON data.
  struct Event {
    std::string name, data;
  };
  // SSE cursor: how much of this job a stream has sent.
  struct Cursor {
    size_t events = 0;
    uint64_t preview = 0;
    bool ended = false;
  };
  // Waits up to `wait` for anything past `cursor`; returns it as SSE text ("" if nothing new).
  std::string next_events(Cursor* cursor, std::chrono::milliseconds wait);
  // The same without the latest-only preview, as events (for the OpenAI image stream).
  std::vector<Event> next_raw(Cursor* cursor, std::chrono::milliseconds wait);
  // OpenAI's `<type>.completed` SSE events, one per image (a succeeded job).
  std::string completed_events(const std::string& type) const;
  // Waits up to `wait` for the job to end; true if it has.
  bool wait_done(std::chrono::milliseconds wait);
  bool done() const;
  JobState state() const;
  // The OpenAI images response (succeeded) or the error; and the job's status object.
  std::string response_json() const;
  ApiError error() const;
  std::string status_json() const;
  // Bytes of the result held (the base64 images), for the finished-jobs budget.
  size_t result_bytes() const;
  // Event streams following this job (bounded per job: each holds an HTTP thread).
  std::atomic<int> watchers{0};

 private:
  friend class JobQueue;
  void push_event(const std::string& event, const std::string& data);
  // Ends the job: its final event (done / error / cancelled) and state appear together.
  void finish(JobState s, const ApiError* err, std::chrono::milliseconds test_delay = {});
  mutable std::mutex mu_;
  std::condition_variable cv_;
  JobState state_ = JobState::kQueued;
  std::vector<Event> events_;  // in order (previews are not kept here: only the latest)
  std::string preview_event_;
  uint64_t preview_seq_ = 0;
  std::vector<JobImage> images_;
  int width_ = 0, height_ = 0, steps_ = 0;
  ApiError error_;
};

struct QueueOptions {
  std::string model_dir;
  LoadOptions load;
  int max_queue = 16;          // jobs waiting (not counting the one running)
  int keep_finished = 32;      // finished /v1/jobs jobs kept for GET after they end
  // ... and at most this many bytes of their results (base64 images), oldest dropped first;
  // the newest finished job is kept whatever its size.
  size_t keep_bytes = size_t{256} << 20;
  int test_load_delay_ms = 0;    // tests: hold the "loading" state this long
  int test_finish_delay_ms = 0;  // tests: time taken building each job's final event
  std::string test_throw_prompt; // tests: a job with this prompt throws on the worker
  // Called on the worker when a job ends (-v logging); may be empty.
  std::function<void(const Job&, double seconds)> on_job_end;
};

class JobQueue {
 public:
  explicit JobQueue(QueueOptions o);
  ~JobQueue();
  // Opens the model on the worker thread, then runs jobs. `on_load_error` is called (on the
  // worker) if the model cannot be opened.
  // `on_ready` (optional) is called there once it is open, with the seconds the load took.
  void start(std::function<void(const Status&)> on_load_error, std::function<void(double)> on_ready = {});

  enum class Health { kLoading, kReady, kBusy, kFailed };
  Health health() const;
  int waiting() const;
  int max_queue() const { return opt_.max_queue; }
  std::string model_name() const;
  struct Counts {
    uint64_t succeeded = 0, failed = 0, cancelled = 0;
  };
  Counts counts() const;
  // Seconds a new job would wait, roughly (for Retry-After).
  int retry_after_s() const;

  // Queues a job: 503 while loading, 429 when the queue is full. `keep`: listed under its id
  // (the job interface) rather than owned by the caller alone.
  std::shared_ptr<Job> submit(JobSpec spec, bool keep, bool previews, ApiError* err);
  std::shared_ptr<Job> find(const std::string& id) const;
  // Cancels a queued job at once, a running one at its next step.
  void cancel(const std::shared_ptr<Job>& job);

 private:
  void run();
  void execute(Job& job);
  void prune_kept_locked();
  QueueOptions opt_;
  std::unique_ptr<Model> model_;
  std::thread worker_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  std::shared_ptr<Job> running_;
  std::map<std::string, std::shared_ptr<Job>> kept_;
  std::deque<std::string> kept_order_;
  Health health_ = Health::kLoading;
  bool stop_ = false;
  double avg_job_s_ = 1.0;
  Counts counts_;
  uint64_t next_id_ = 1;
};

}  // namespace klein::server
