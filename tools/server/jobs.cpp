#include "jobs.h"

#include <algorithm>
#include <cmath>
#include <malloc.h>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "base64.h"

namespace klein::server {

using nlohmann::json;

namespace {
// Prompts and upload names come from clients: invalid UTF-8 is replaced, never thrown about.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_hex(int bytes) {
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(mu);
  std::string s;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xFF;
    s += kHex[v >> 4];
    s += kHex[v & 15];
  }
  return s;
}
}  // namespace

const char* state_name(JobState s) {
  switch (s) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "?";
}

// ---- Job ----------------------------------------------------------------------------------------

void Job::push_event(const std::string& event, const std::string& data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back({event, data});
  }
  cv_.notify_all();
}

void Job::finish(JobState s, const ApiError* err, std::chrono::milliseconds test_delay) {
  // The final event is built before the state changes, and both change under one lock: a
  // stream that sees the job ended has its final event too (else it would close without it).
  Event ev;
  if (s == JobState::kSucceeded) ev = {"done", response_json()};
  else ev = {s == JobState::kCancelled ? "cancelled" : "error", (err ? *err : error()).json()};
  if (test_delay.count() > 0) std::this_thread::sleep_for(test_delay);
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = s;
    if (err) error_ = *err;
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

bool Job::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ != JobState::kQueued && state_ != JobState::kRunning;
}

JobState Job::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

ApiError Job::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool Job::wait_done(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, wait, [&] { return state_ != JobState::kQueued && state_ != JobState::kRunning; });
}

std::string Job::next_events(Cursor* c, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return events_.size() > c->events || preview_seq_ > c->preview; });
  std::string out;
  for (; c->events < events_.size(); ++c->events)
    out += "event: " + events_[c->events].name + "\ndata: " + events_[c->events].data + "\n\n";
  // Only the latest preview: a stream that joins late (or reads slowly) gets the newest picture,
  // not every one. After the job ends it is stale.
  if (preview_seq_ > c->preview) {
    if (state_ == JobState::kQueued || state_ == JobState::kRunning) out += preview_event_;
    c->preview = preview_seq_;
  }
  c->ended = state_ != JobState::kQueued && state_ != JobState::kRunning && c->events == events_.size();
  return out;
}

std::vector<Job::Event> Job::next_raw(Cursor* c, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return events_.size() > c->events; });
  std::vector<Event> out(events_.begin() + static_cast<std::ptrdiff_t>(c->events), events_.end());
  c->events = events_.size();
  c->ended = state_ != JobState::kQueued && state_ != JobState::kRunning;
  return out;
}

std::string Job::completed_events(const std::string& type) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  const json usage = {{"input_tokens", 0}, {"output_tokens", 0}, {"total_tokens", 0},
                      {"input_tokens_details", {{"image_tokens", 0}, {"text_tokens", 0}}}};
  for (const JobImage& im : images_)
    out += "event: " + type + ".completed\ndata: " +
           dump({{"type", type + ".completed"}, {"b64_json", im.b64}, {"created_at", created}, {"background", "opaque"},
                 {"output_format", spec.format_name}, {"quality", "auto"},
                 {"size", std::to_string(width_) + "x" + std::to_string(height_)}, {"usage", usage}, {"seed", im.seed}}) +
           "\n\n";
  return out;
}

size_t Job::result_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const JobImage& im : images_) n += im.b64.size();
  return n;
}

std::string Job::response_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  json data = json::array();
  for (const JobImage& im : images_)
    data.push_back({{"b64_json", im.b64}, {"revised_prompt", spec.prompt}, {"seed", im.seed}});
  return dump({{"created", created},
               {"data", data},
               {"output_format", spec.format_name},
               {"size", std::to_string(width_) + "x" + std::to_string(height_)},
               {"steps", steps_}});
}

std::string Job::status_json() const {
  const JobState s = state();
  json j = {{"id", id}, {"object", "image.job"}, {"status", state_name(s)}, {"created", created}};
  if (s == JobState::kSucceeded) j["result"] = json::parse(response_json());
  if (s == JobState::kFailed || s == JobState::kCancelled) j["error"] = json::parse(error().json())["error"];
  return dump(j);
}

// ---- JobQueue -----------------------------------------------------------------------------------

JobQueue::JobQueue(QueueOptions o) : opt_(std::move(o)) {}

JobQueue::~JobQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (running_) running_->cancel_requested = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void JobQueue::start(std::function<void(const Status&)> on_load_error, std::function<void(double)> on_ready) {
  worker_ = std::thread([this, on_load_error, on_ready] {
    const auto t0 = std::chrono::steady_clock::now();
    if (opt_.test_load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.test_load_delay_ms));
    auto m = Model::open(opt_.model_dir, opt_.load);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (m.ok()) {
        model_ = std::move(m).value();
        health_ = Health::kReady;
      } else {
        health_ = Health::kFailed;
      }
    }
    if (!m.ok()) {
      if (on_load_error) on_load_error(m.status());
      return;
    }
    if (on_ready) on_ready(load_s);
    run();
  });
}

JobQueue::Health JobQueue::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (health_ == Health::kReady && (running_ || !waiting_.empty())) return Health::kBusy;
  return health_;
}

int JobQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiting_.size());
}

std::string JobQueue::model_name() const {
  // Without --model, the transformer file names the model.
  std::string p = opt_.model_dir.empty() ? opt_.load.diffusion_model : opt_.model_dir;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

JobQueue::Counts JobQueue::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

int JobQueue::retry_after_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  const double s = avg_job_s_ * (static_cast<double>(waiting_.size()) + 1.0);
  return std::max(1, static_cast<int>(std::ceil(s)));
}

std::shared_ptr<Job> JobQueue::submit(JobSpec spec, bool keep, bool previews, ApiError* err) {
  std::unique_lock<std::mutex> lock(mu_);
  if (health_ == Health::kLoading || health_ == Health::kFailed) {
    *err = {503, "the model is still loading; retry shortly", "server_error", "", "model_loading"};
    return nullptr;
  }
  if (static_cast<int>(waiting_.size()) >= opt_.max_queue) {
    *err = {429, "the queue is full (" + std::to_string(opt_.max_queue) + " waiting); retry later", "rate_limit_error", "",
            "queue_full"};
    return nullptr;
  }
  auto job = std::make_shared<Job>("job_" + random_hex(12), std::move(spec), previews);
  job->push_event("queued", dump({{"id", job->id}, {"position", waiting_.size() + (running_ ? 1 : 0)}}));
  waiting_.push_back(job);
  if (keep) {
    kept_[job->id] = job;
    kept_order_.push_back(job->id);
    prune_kept_locked();
  }
  lock.unlock();
  cv_.notify_all();
  return job;
}

void JobQueue::prune_kept_locked() {
  // Finished jobs beyond keep_finished, or whose results together pass keep_bytes, are
  // forgotten oldest first; queued and running ones stay, and so does the newest finished one
  // (its client has had no chance to fetch it yet). One snapshot of which jobs are finished:
  // the worker may finish one meanwhile.
  std::vector<std::pair<std::string, size_t>> finished;  // id, result bytes; oldest first
  size_t bytes = 0;
  for (const std::string& id : kept_order_) {
    auto k = kept_.find(id);
    if (k == kept_.end() || !k->second->done()) continue;
    finished.emplace_back(id, k->second->result_bytes());
    bytes += finished.back().second;
  }
  for (size_t i = 0; i + 1 < finished.size(); ++i) {
    if (finished.size() - i <= static_cast<size_t>(opt_.keep_finished) && bytes <= opt_.keep_bytes) break;
    bytes -= finished[i].second;
    kept_.erase(finished[i].first);
  }
  kept_order_.erase(std::remove_if(kept_order_.begin(), kept_order_.end(),
                                   [&](const std::string& id) { return kept_.count(id) == 0; }),
                    kept_order_.end());
}

std::shared_ptr<Job> JobQueue::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(id);
  return it == kept_.end() ? nullptr : it->second;
}

void JobQueue::cancel(const std::shared_ptr<Job>& job) {
  job->cancel_requested = true;
  bool was_waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
      if (*it == job) {
        waiting_.erase(it);
        was_waiting = true;
        break;
      }
  }
  if (was_waiting) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++counts_.cancelled;
    }
    const ApiError e{499, "the job was cancelled before it started", "cancelled", "", "cancelled"};
    job->finish(JobState::kCancelled, &e);
  }
}

void JobQueue::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty(); });
      if (stop_) return;
      job = waiting_.front();
      waiting_.pop_front();
      running_ = job;
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      execute(*job);
    } catch (...) {
      // Nothing in a job may take the worker down: the job fails (500), the queue goes on.
      // finish() again is harmless if the job had already ended; its own allocation is small.
      if (!job->done()) {
        const ApiError e{500, "internal error while running the job", "server_error", "", "internal_error"};
        try {
          job->finish(JobState::kFailed, &e);
        } catch (...) {
        }
      }
    }
    // A job frees everything it allocated; give it back so the server's RSS is the model's plus
    // a constant, not the high-water mark of the largest request so far.
    malloc_trim(0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opt_.on_job_end) opt_.on_job_end(*job, s);
    std::lock_guard<std::mutex> lock(mu_);
    avg_job_s_ = 0.7 * avg_job_s_ + 0.3 * s;
    running_.reset();
    const JobState end = job->state();
    ++(end == JobState::kSucceeded ? counts_.succeeded : end == JobState::kCancelled ? counts_.cancelled : counts_.failed);
    prune_kept_locked();
  }
}

void JobQueue::execute(Job& job) {
  const JobSpec& spec = job.spec;
  {
    std::lock_guard<std::mutex> lock(job.mu_);
    job.state_ = JobState::kRunning;
  }
  job.push_event("started", dump({{"id", job.id}, {"n", spec.n}}));
  if (!opt_.test_throw_prompt.empty() && spec.prompt == opt_.test_throw_prompt)
    throw std::runtime_error("test failure injected by --test-throw-prompt");
  const std::chrono::milliseconds finish_delay(opt_.test_finish_delay_ms);
  // OpenAI's stream types: image_generation.* for generations, image_edit.* for edits.
  const std::string stream_type = spec.references.empty() ? "image_generation" : "image_edit";
  std::vector<JobImage> images;
  // One request for all n images: the prompt and the references are encoded once, then each
  // seed is denoised and decoded (Model::generate_batch, on one Session).
  GenerateRequest req;
  req.prompt = spec.prompt;
  req.width = spec.width;
  req.height = spec.height;
  req.steps = spec.steps;
  req.guidance_scale = spec.guidance_scale;
  req.negative_prompt = spec.negative_prompt;
  req.reference_data = spec.references;
  // Inpainting (a mask) or image-to-image (a strength): the first image is the source.
  if ((spec.mask || spec.strength >= 0) && !req.reference_data.empty()) {
    req.init_image.data = std::move(req.reference_data.front());
    req.reference_data.erase(req.reference_data.begin());
    if (spec.mask) req.init_image.mask_data = *spec.mask;
    req.init_image.strength = spec.strength;
  }
  req.loras = spec.loras;
  std::vector<uint64_t> seeds;
  for (int k = 0; k < spec.n; ++k)
    seeds.push_back(spec.seed + static_cast<uint64_t>(k));  // wraps at 2^64, as any seed arithmetic would
  req.seed = seeds[0];
  {
    // The image the events are about: the encode counts as the first image's; each denoise
    // (its progress at step 0) starts the next image.
    int i = 0;
    bool denoised = false;
    Callbacks cb;
    std::string last_phase;
    cb.progress = [&](const std::string& phase, int done, int total) {
      if (phase == "denoise" && done == 0) {
        if (denoised) ++i;
        denoised = true;
      }
      // Phase changes, phase ends and every denoising step: not every layer of the text encoder.
      if (phase != last_phase || done == total || phase == "denoise") {
        last_phase = phase;
        job.push_event("progress", dump({{"phase", phase}, {"done", done}, {"total", total}, {"image", i + 1},
                                         {"n", spec.n}}));
      }
    };
    cb.cancel = [&job] { return job.cancel_requested.load(); };
    if (job.previews) {
      cb.preview = [&](int step, int total, const Image& img) {
        // JPEG: a preview is looked at once and replaced; it should be small and quick to make.
        auto jpg = encode_image(img, ImageFileFormat::kJpeg, {}, 80);
        if (!jpg.ok()) return;
        const std::string ev = "event: preview\ndata: " +
                               dump({{"step", step}, {"total", total}, {"image", i + 1}, {"n", spec.n},
                                     {"mime", "image/jpeg"}, {"b64_json", base64_encode(*jpg)}}) + "\n\n";
        {
          std::lock_guard<std::mutex> lock(job.mu_);
          job.preview_event_ = ev;
          ++job.preview_seq_;
        }
        job.cv_.notify_all();
      };
    } else if (spec.stream && spec.partial_images > 0) {
      cb.preview = [&, sent = 0, image = 0](int step, int total, const Image& img) mutable {
        // partial_images previews spread evenly over the steps: preview k (0-based) once
        // step ≥ (k+1)·total/(partial_images+1), rounded up; fewer when there are fewer steps.
        if (image != i) sent = 0, image = i;  // counted per image
        const int k = sent;
        if (k >= spec.partial_images || step * (spec.partial_images + 1) < (k + 1) * total) return;
        ++sent;
        auto file = encode_image(img, spec.format, {}, spec.quality);
        if (!file.ok()) return;
        job.push_event("partial", dump({{"type", stream_type + ".partial_image"}, {"b64_json", base64_encode(*file)},
                                        {"partial_image_index", k}, {"created_at", job.created},
                                        {"background", "opaque"}, {"output_format", spec.format_name},
                                        {"quality", "auto"},
                                        {"size", std::to_string(img.width) + "x" + std::to_string(img.height)},
                                        {"image", i}, {"step", step}, {"total", total}}));
      };
    }
    auto batch = model_->generate_batch(req, seeds, cb);
    if (!batch.ok()) {
      const ApiError e = from_status(batch.status(), spec.references.empty() ? "" : "image");
      job.finish(batch.status().code() == Code::kCancelled ? JobState::kCancelled : JobState::kFailed, &e,
                 finish_delay);
      return;
    }
    for (size_t k = 0; k < batch->size(); ++k) {
      const GenerateResult& r = (*batch)[k];
      auto file = encode_image(r.image, spec.format, r.metadata, spec.quality);
      if (!file.ok()) {
        const ApiError e = from_status(file.status());
        job.finish(JobState::kFailed, &e, finish_delay);
        return;
      }
      images.push_back({base64_encode(*file), seeds[k]});
      std::lock_guard<std::mutex> lock(job.mu_);
      job.width_ = r.width;
      job.height_ = r.height;
      job.steps_ = r.steps;
    }
  }
  {
    std::lock_guard<std::mutex> lock(job.mu_);
    job.images_ = std::move(images);
  }
  job.finish(JobState::kSucceeded, nullptr, finish_delay);
}

}  // namespace klein::server
